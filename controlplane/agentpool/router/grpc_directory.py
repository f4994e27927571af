"""A :class:`DirectoryView` over the directory service's asyncio gRPC client."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from agentpool.directory.client import DirectoryClient, DirectoryRpcError
from agentpool.router.directory_view import DirectoryError, Resolved
from agentpool.router.policy import CachedPrefix


class GrpcDirectoryView:
    """``parent_branch`` is not sent: the directory treats an unseen branch id as a fork (E.1)."""

    def __init__(
        self,
        target: str | DirectoryClient,
        token: str | None = None,
        root_certificates: bytes | None = None,
        client_cert: bytes | None = None,
        client_key: bytes | None = None,
    ) -> None:
        """``token``: the directory's bearer token (required unless it runs ``--insecure``);
        ``client_cert``/``client_key``: a client certificate for a directory that requires mTLS."""
        self.client = (
            target
            if isinstance(target, DirectoryClient)
            else DirectoryClient(
                target,
                token=token,
                root_certificates=root_certificates,
                client_cert=client_cert,
                client_key=client_key,
            )
        )

    async def close(self) -> None:
        await self.client.close()

    async def resolve(self, hashes: Sequence[int], branch: str | None, parent_branch: str | None) -> Resolved:
        try:
            r = await self.client.resolve(hashes, branch, omit_paths=True)
        except DirectoryRpcError as e:
            raise DirectoryError(str(e)) from e
        prefixes = {
            node: CachedPrefix(gpu=p.gpu_tokens, total=p.local_tokens)
            for node, p in r.nodes.items()
            if p.local_tokens > 0
        }
        return Resolved(prefixes, r.branch.version if r.branch is not None else None, hashes)

    async def place(self, branch: str, node: str, hashes: Sequence[int]) -> None:
        try:
            await self.client.place(branch, node, hashes)
        except DirectoryRpcError as e:
            raise DirectoryError(str(e)) from e

    async def end_branch(self, branch: str) -> bool:
        try:
            await self.client.end_branch(branch)
        except DirectoryRpcError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                return False
            raise DirectoryError(str(e)) from e
        return True

    async def health(self) -> str:
        try:
            h = await self.client.health()
        except DirectoryRpcError as e:
            raise DirectoryError(str(e)) from e
        if not h.serving:
            return "not serving"
        return "ok" if h.store_ok else "its store is unavailable"
