"""A :class:`DirectoryView` over the directory service: its gRPC client, or its Route link.

Resolves and Places travel on one ``Route`` stream (:class:`agentpool.directory.session.DirectorySession`):
a gRPC stream, or with a :class:`agentpool.directory.link_client.LinkClient` a framed connection to
the directory's ``--link-port`` (the same batches; less CPU on both sides). A Resolve is one message
each way, a Place one message out that the request does not wait for (the directory applies the
stream's operations in order, so the next Resolve sees it; a failed Place is logged and counted in
``place_errors``). EndBranch travels there too, so it comes after the branch's Places; Health is a
unary call (over the link: a short connection of its own).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc

from agentpool.directory.client import DirectoryClient, DirectoryRpcError
from agentpool.directory.link_client import LinkClient
from agentpool.directory.session import DirectorySession
from agentpool.router.directory_view import DirectoryError, Resolved
from agentpool.router.policy import CachedPrefix

log = logging.getLogger(__name__)


class GrpcDirectoryView:
    """``parent_branch`` is not sent: the directory treats an unseen branch id as a fork (E.1)."""

    def __init__(
        self,
        target: str | DirectoryClient | LinkClient,
        token: str | None = None,
        root_certificates: bytes | None = None,
        client_cert: bytes | None = None,
        client_key: bytes | None = None,
    ) -> None:
        """``token``: the directory's bearer token (required unless it runs ``--insecure``);
        ``client_cert``/``client_key``: a client certificate for a directory that requires mTLS."""
        self.client: DirectoryClient | LinkClient = (
            target
            if isinstance(target, DirectoryClient | LinkClient)
            else DirectoryClient(
                target,
                token=token,
                root_certificates=root_certificates,
                client_cert=client_cert,
                client_key=client_key,
            )
        )
        self.session = DirectorySession(self.client, self._place_failed)
        self.place_errors = 0  # Places the directory refused or that the stream lost

    def _place_failed(self, e: DirectoryRpcError) -> None:
        self.place_errors += 1
        log.warning("directory Place failed (the request was served; its branch is not counted): %s", e)

    async def close(self) -> None:
        await self.session.close()
        await self.client.close()

    async def resolve(
        self,
        hashes: Sequence[int],
        branch: str | None,
        parent_branch: str | None,
        timeout_s: float | None = None,
    ) -> Resolved:
        try:
            r = await self.session.resolve(hashes, branch, timeout_s=timeout_s)
        except DirectoryRpcError as e:
            raise DirectoryError(str(e)) from e
        prefixes = {
            p.node: CachedPrefix(gpu=p.gpu_tokens, total=p.local_tokens)
            for p in r.nodes
            if p.local_tokens > 0
        }
        return Resolved(prefixes, r.branch.version if r.HasField("branch") else None, hashes)

    async def place(self, branch: str, node: str, hashes: Sequence[int]) -> None:
        """Sent on the Route stream, not waited for (see the module's doc): never waits."""
        self.session.place(branch, node, hashes)

    async def end_branch(self, branch: str) -> bool:
        try:
            await self.session.end_branch(branch)  # on the stream: after the branch's Places
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
