"""The router's seam to the KV directory: one ``resolve`` round trip per request, ``place``, ``end_branch``.

Two implementations:

- :class:`InProcessDirectoryView` over an :class:`agentpool.kv.Directory` object (tests, single-process
  deployments, the simulator's shell);
- :class:`agentpool.router.grpc_directory.GrpcDirectoryView` over the directory service's asyncio
  gRPC client.

Prefixes come back in tokens (blocks times page size) as :class:`CachedPrefix` per node, so the
policies never see blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from agentpool.errors import UnavailableError
from agentpool.kv import Directory, KvError, PrefixMatch
from agentpool.router.policy import CachedPrefix


class DirectoryError(UnavailableError):
    """The directory could not answer (unreachable, or it rejected the call)."""


@dataclass(frozen=True, slots=True)
class Resolved:
    """The directory's answer for one request."""

    prefixes: Mapping[str, CachedPrefix]
    branch_version: int | None = None  # what the branch's version becomes once the request is placed
    hashes: Sequence[int] = ()  # the request's full pages, for the Place once a node took it

    @property
    def cluster_prefix(self) -> int:
        return max((p.total for p in self.prefixes.values()), default=0)


class DirectoryView(Protocol):
    async def resolve(
        self,
        hashes: Sequence[int],
        branch: str | None,
        parent_branch: str | None,
        timeout_s: float | None = None,
    ) -> Resolved:
        """The directory's answer, within ``timeout_s`` (None: the view's own limit) or
        :class:`DirectoryError` (the caller arms no timer of its own)."""
        ...

    async def place(self, branch: str, node: str, hashes: Sequence[int]) -> None:
        """``node`` took a request of ``branch`` with full pages ``hashes``: Algorithm E.1 for the branch
        (the Resolve before only looked), then E.2's count on the node. Never waits for the directory
        (the request does not wait for it: a view sends it, or applies it in process)."""
        ...

    async def end_branch(self, branch: str) -> bool:
        """End ``branch``; ``False`` when the directory does not know it."""
        ...

    async def health(self) -> str:
        """``"ok"``, or why the directory cannot serve (raises :class:`DirectoryError` if unreachable)."""
        ...

    async def close(self) -> None: ...


def prefixes_in_tokens(matches: Mapping[str, PrefixMatch], page_size: int) -> dict[str, CachedPrefix]:
    return {
        node: CachedPrefix(gpu=m.gpu_blocks * page_size, total=m.local_blocks * page_size)
        for node, m in matches.items()
        if m.local_blocks > 0
    }


class InProcessDirectoryView:
    """A :class:`DirectoryView` over an in-process :class:`Directory` (``clock`` gives ``now``).

    ``parent_branch`` is not needed by the directory core: a fork starts a new branch with an empty
    previous path (Algorithm E.1), which is what an unknown branch id gets.
    """

    def __init__(self, directory: Directory, clock: Callable[[], float]) -> None:
        self.directory = directory
        self._clock = clock

    async def resolve(
        self,
        hashes: Sequence[int],
        branch: str | None,
        parent_branch: str | None,
        timeout_s: float | None = None,
    ) -> Resolved:
        try:
            r = self.directory.lookup(hashes, branch)  # read-only: the Place applies E.1
        except KvError as e:
            raise DirectoryError(str(e)) from e
        version = r.observation.version if r.observation is not None else None
        return Resolved(prefixes_in_tokens(r.prefixes, self.directory.page_size), version, hashes)

    async def place(self, branch: str, node: str, hashes: Sequence[int]) -> None:
        try:
            now = self._clock()
            self.directory.observe(branch, hashes, now)
            if self.directory.has_node(node):  # E.1 holds before the node registers; counts need it
                self.directory.place(branch, node, now)
        except KvError as e:
            raise DirectoryError(str(e)) from e

    async def end_branch(self, branch: str) -> bool:
        if self.directory.branches.find(branch) is None:
            return False
        self.directory.end_branch(branch)
        return True

    async def health(self) -> str:
        return "ok"

    async def close(self) -> None:
        return None
