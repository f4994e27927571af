"""The directory core: prefix index + branch table (E.1) + branch counts (E.2) + eviction order.

One object that the gRPC service (``agentpool.directory``) wraps and the simulator drives on its virtual
clock. Every mutating call returns :class:`Changes`: the branch rows to persist or delete, the node
phases that changed and the new counts per node, so a shell can persist them (Redis) and push count
updates to engines. Pure: no I/O, time is passed in.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice

from agentpool.kv.branches import BranchState, BranchTable, Observation, PendingMove
from agentpool.kv.counts import BranchCounts, CountChanges
from agentpool.kv.eviction import (
    EvictionCandidate,
    eviction_hashes_counted,
    eviction_order_counted,
    eviction_pick,
)
from agentpool.kv.hashing import DEFAULT_PAGE_SIZE, ROOT_HASH
from agentpool.kv.index import PrefixIndex
from agentpool.kv.steps import drain
from agentpool.kv.types import HeldBlock, PrefixMatch, Role, Tier, UnknownNodeError, split_blocks

_DONE = object()


@dataclass
class Changes:
    """What a mutation changed, for the shell to persist and publish."""

    branches: set[str] = field(default_factory=set)  # rows to (re)write
    ended: set[str] = field(default_factory=set)  # rows to delete
    nodes: set[str] = field(default_factory=set)  # node phase rows to (re)write or delete
    counts: CountChanges = field(default_factory=dict)  # node -> block -> new count

    def __bool__(self) -> bool:
        return bool(self.branches or self.ended or self.nodes or any(self.counts.values()))

    def merge(self, other: Changes) -> None:
        self.branches |= other.branches
        self.ended |= other.ended
        self.branches -= self.ended
        self.nodes |= other.nodes
        for node, blocks in other.counts.items():
            self.counts.setdefault(node, {}).update(blocks)


@dataclass(frozen=True, slots=True)
class Resolution:
    """One-round-trip answer for the router: per-node prefixes plus the branch's E.1 output."""

    prefixes: dict[str, PrefixMatch]
    observation: Observation | None
    changes: Changes


class Directory:
    """Cluster-wide KV directory state. Not thread-safe: one caller at a time (an asyncio loop)."""

    def __init__(self, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.page_size = page_size
        self.index = PrefixIndex()
        self.branches = BranchTable()
        self.counts = BranchCounts()
        self._phases: dict[str, Role] = {}
        self._pending_hint: dict[str, set[str]] = {}  # node -> branches that may wait for a move there

    # -- persisted agent state ------------------------------------------------------------
    def load_agent_state(self, phases: Mapping[str, Role], branches: Iterable[BranchState]) -> None:
        """Replace node phases, branch table and counts with persisted ones (after a restart, or after a
        store outage). The index keeps the placements of the nodes in ``phases`` and drops the others."""
        self.branches = BranchTable()
        self.counts = BranchCounts()
        self._pending_hint = {}
        for node in self.index.nodes():
            if node not in phases:
                self.index.drop_node(node)
        self._phases = dict(phases)
        for node in phases:
            self.index.add_node(node)
        for state in branches:
            self.branches.put(state)
            self.counts.restore(state)
            for node in state.pending:
                self._pending_hint.setdefault(node, set()).add(state.branch_id)

    # -- nodes -------------------------------------------------------------------------------
    def phases(self) -> dict[str, Role]:
        return dict(self._phases)

    def phase(self, node: str) -> Role:
        try:
            return self._phases[node]
        except KeyError:
            raise UnknownNodeError(f"node {node!r} is not registered") from None

    def has_node(self, node: str) -> bool:
        return node in self._phases

    def register_node(self, node: str, phase: Role) -> Changes:
        """Add ``node`` in ``phase``; an already registered node switches phase instead."""
        if node in self._phases:
            return self.switch_phase(node, phase)
        self.counts.finish_forgetting(node)  # dropped, not yet cleared to the end: clear the rest now
        self._phases[node] = phase
        self.index.add_node(node)
        return Changes(nodes={node})

    def switch_phase(self, node: str, phase: Role) -> Changes:
        """D -> P releases every branch's counts on ``node``; every other switch keeps them."""
        old = self.phase(node)
        changes = Changes(nodes={node} if old != phase else set())
        self._phases[node] = phase
        if old is Role.DECODE and phase is Role.PREFILL:
            for beta in sorted(self._branches_counting_on(node)):
                self.counts.release(self.branches.get(beta), node, changes.counts)
                changes.branches.add(beta)
        return changes

    def drop_node(self, node: str) -> Changes:
        """``node`` is gone: purge its placements, release its counts, forget its phase."""
        return drain(self.drop_node_steps(node))

    def drop_node_steps(self, node: str) -> Generator[None, None, Changes]:
        """:meth:`drop_node` in steps (a generator): the node, its phase and its counts are gone before the
        first step; the steps clear the branches' counted sets on the node, then its placements in the
        index."""
        self.phase(node)
        affected = self._branches_counting_on(node) | self._branches_pending_on(node)
        changes = Changes(branches=affected, nodes={node})
        self.counts.forget_node(node, affected, self.branches.find)
        self._pending_hint.pop(node, None)
        del self._phases[node]
        index_steps = self.index.drop_node_steps(node)
        entries_left = next(index_steps, _DONE) is not _DONE  # the node has left the index's answers
        yield from self.counts.forget_steps(node)
        if entries_left:
            yield from index_steps  # then its entries are cleared
        return changes

    def _branches_counting_on(self, node: str) -> set[str]:
        return self.counts.counting(node)

    def _branches_pending_on(self, node: str) -> set[str]:
        """Branches with a move to ``node`` waiting; prunes stale hints."""
        hint = self._pending_hint.get(node)
        if not hint:
            return set()
        live = {b for b in hint if (s := self.branches.find(b)) is not None and node in s.pending}
        self._pending_hint[node] = live
        return set(live)

    # -- KV events ---------------------------------------------------------------------------
    def apply_stored(self, node: str, parent: int, hashes: Sequence[int], tier: Tier, now: float) -> Changes:
        self.phase(node)
        self.index.apply_stored(node, parent, hashes, tier, now)
        changes = Changes()
        self._settle_moves_to(node, changes, hashes if parent == ROOT_HASH else ())
        return changes

    def apply_removed(self, node: str, hashes: Iterable[int], tier: Tier) -> Changes:
        """E.2 line 20: evicting the host copy of a block on ``node`` removes it from every branch's
        ``C[beta, node]`` and sets ``R[b, node] = 0``, even while the node keeps a GPU copy (the count is
        the host copy's eviction priority). A GPU-only removal keeps the counts while the host copy
        stays; a block that leaves the node entirely (no tier left) loses its counts too."""
        self.phase(node)
        host_lost, gone = self.index.remove(node, hashes, tier)
        return self._zero_counts(node, host_lost if gone is host_lost else dict.fromkeys([*host_lost, *gone]))

    def evict_host(self, node: str, limit: int) -> tuple[list[int], Changes]:
        """E.2 ``EvictHost`` where the index is the host tier (the simulator's nodes): remove the host
        copies of the first ``limit`` blocks of :meth:`eviction_order`; returns their hashes, in that
        order, and the changes (:meth:`apply_removed`'s). When the order took zero-count blocks only
        there are no counts to clear, and none are looked up."""
        self.phase(node)
        hashes, uncounted = eviction_pick(self.index.host_access(node), self.counts.counts_view(node), limit)
        if uncounted:
            self.index.remove(node, hashes, Tier.HOST)
            return hashes, Changes()
        return hashes, self.apply_removed(node, hashes, Tier.HOST)

    def resync_node(self, node: str, blocks: Iterable[HeldBlock], now: float) -> Changes:
        """Replace ``node``'s placement with its engine's full block list (atomic for the index). Blocks
        whose host copy or every copy is gone since the last known state lose their counts (E.2 line 20)."""
        return drain(self.resync_node_steps(node, *split_blocks(blocks), now))

    def resync_node_steps(
        self, node: str, hashes: Sequence[int], parents: Sequence[int], tiers: Sequence[int], now: float
    ) -> Generator[None, None, Changes]:
        """:meth:`resync_node` in steps (a generator), the blocks as three int lists (see
        :meth:`PrefixIndex.resync_steps`)."""
        self.phase(node)
        host_lost, gone = yield from self.index.resync_steps(node, hashes, parents, tiers, now)
        self.phase(node)  # still registered (the caller keeps drops of the node out meanwhile)
        changes = self._zero_counts(node, chain(host_lost, gone))
        # Counted blocks the node never stored (e.g. before a directory restart) stay counted: the
        # branch placed there and the prefill will store them.
        self._settle_moves_to(node, changes)
        return changes

    def _zero_counts(self, node: str, gone: Iterable[int]) -> Changes:
        changes = Changes()
        changes.branches.update(self.counts.evicted(node, gone, self.branches.get, changes.counts))
        return changes

    # -- requests ----------------------------------------------------------------------------
    def resolve(self, hashes: Sequence[int], branch: str | None, now: float) -> Resolution:
        """Per-node longest prefixes of ``hashes``; with a branch, also Algorithm E.1 and E.2 lines 5-8
        (:meth:`observe`). A shell that must not change state before the request is placed uses
        :meth:`lookup`, then :meth:`observe` and :meth:`place` once a node took the request."""
        if branch is None:
            return Resolution(self.index.longest_prefixes(hashes), None, Changes())
        observation, changes = self.observe(branch, hashes, now)
        return Resolution(self.index.longest_prefixes(hashes), observation, changes)

    def lookup(self, hashes: Sequence[int], branch: str | None) -> Resolution:
        """:meth:`resolve` without changing anything: the prefixes, and the E.1 observation the request
        would make (its version and paths) if it is placed."""
        observation = None if branch is None else self.branches.preview(branch, hashes)
        return Resolution(self.index.longest_prefixes(hashes), observation, Changes())

    def observe(self, branch: str, hashes: Sequence[int], now: float) -> tuple[Observation, Changes]:
        """Algorithm E.1 for a request of ``branch`` with path ``hashes``, and on a version bump E.2
        lines 5-8 (every node keeps counting only the blocks still on the new path)."""
        changes = Changes(branches={branch})
        observation = self.branches.observe(branch, hashes, now)
        if observation.version_bumped:
            state = self.branches.get(branch)
            keep = frozenset(observation.new_path)
            for m in sorted(state.counted):
                self.counts.set_counted(state, m, state.counted[m] & keep, changes.counts)
        return observation, changes

    def place(self, branch: str, node: str, now: float) -> Changes:
        """Branch ``branch`` is served on ``node`` (prefill routing or decode binding), E.2 lines 9-12."""
        phase = self.phase(node)
        state = self.branches.get(branch)
        changes = Changes(branches={branch})
        self.counts.set_counted(state, node, state.path, changes.counts)
        self.index.touch(node, state.path, now)
        state.last_seen = now
        same_phase = [m for m in state.counted if m != node and self._phases.get(m) is phase]
        for m in list(state.pending):
            if m != node and self._phases.get(m) is phase:
                del state.pending[m]  # a newer placement in this phase supersedes older moves
        if same_phase and state.path:
            state.pending[node] = PendingMove(state.version, len(state.path))
            self._pending_hint.setdefault(node, set()).add(branch)
            self._settle_move(state, node, changes)
        else:
            state.pending.pop(node, None)
        return changes

    def _settle_moves_to(self, node: str, changes: Changes, stored: Sequence[int] = ()) -> None:
        """``stored``: a chain from the root that ``node`` has just stored (it holds every block)."""
        for beta in sorted(self._branches_pending_on(node)):
            self._settle_move(self.branches.get(beta), node, changes, stored)

    def _settle_move(
        self, state: BranchState, node: str, changes: Changes, stored: Sequence[int] = ()
    ) -> None:
        move = state.pending[node]
        if move.version != state.version:
            del state.pending[node]  # the branch was rewritten since: its next placement decides
            changes.branches.add(state.branch_id)
            return
        if not self.index.has_node(node):
            return
        n = move.blocks
        path = state.path
        # a prefill stores the path whole: the chain just stored starts with it (one list compare,
        # no lookup). Else the path's last block is the one likeliest missing: a store of another
        # branch's blocks then costs one lookup per pending move, not a path's walk
        if not (
            n and len(stored) >= n and stored[n - 1] == path[n - 1] and tuple(islice(stored, n)) == path[:n]
        ):
            if n and self.index.last_access(node, path[n - 1]) is None:
                return
            if not self.index.holds_all(node, path[:n]):
                return
        del state.pending[node]
        phase = self._phases[node]
        for m in sorted(state.counted):
            if m != node and self._phases.get(m) is phase:
                self.counts.release(state, m, changes.counts)
        changes.branches.add(state.branch_id)

    def end_branch(self, branch: str) -> Changes:
        """E.2 line 13: release every count of the branch and remove it."""
        state = self.branches.get(branch)
        changes = Changes(ended={branch})
        for m in sorted(state.counted):
            self.counts.release(state, m, changes.counts)
        self.branches.remove(branch)
        return changes

    def expire_idle(self, now: float, idle_ttl: float) -> tuple[list[str], Changes]:
        """End the branches not seen for ``idle_ttl`` (agents that never sent an end)."""
        expired = self.branches.idle_since(now - idle_ttl)
        changes = Changes()
        for b in expired:
            changes.merge(self.end_branch(b))
        return expired, changes

    # -- queries -----------------------------------------------------------------------------
    def count(self, node: str, block: int) -> int:
        return self.counts.count(node, block)

    def eviction_order(self, node: str, limit: int | None = None) -> list[EvictionCandidate]:
        """Host blocks of ``node`` by ``(R > 0, last access)`` ascending."""
        self.phase(node)
        return eviction_order_counted(self.index.host_access(node), self.counts.counts_view(node), limit)

    def eviction_hashes(self, node: str, limit: int | None = None) -> list[int]:
        """The hashes of :meth:`eviction_order`, in its order (for a caller that only removes them)."""
        self.phase(node)
        return eviction_hashes_counted(self.index.host_access(node), self.counts.counts_view(node), limit)
