"""Branch counts ``R[b, n]`` with ``Count`` and ``Release`` exactly as Algorithm E.2.

``R[b, n]`` is the number of active branches that count block ``b`` on node ``n``. Per node it is kept as
a dict ``block -> R`` of the positive counts, plus the set of branches whose ``C[beta, n]`` is not empty:
evicting a block (E.2 line 20) finds the branches that count it through their own ``C[beta, n]``. Every
per-block step runs as a C-level ``map``/``dict.update`` over the changed blocks, and the dicts hold only
ints, which CPython's garbage collector does not track (a set of branch ids per counted block would be
one tracked container per block). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Iterable, Mapping
from itertools import compress, repeat
from operator import add, not_, sub

from agentpool.kv.branches import BranchState

CountChanges = dict[str, dict[int, int]]  # node -> block -> new R[b, n]
BranchLookup = Callable[[str], BranchState | None]

_NO_BLOCKS: frozenset[int] = frozenset()


class BranchCounts:
    def __init__(self) -> None:
        self._counts: dict[str, dict[int, int]] = {}  # node -> block -> R[b, node] > 0
        self._counting: dict[str, set[str]] = {}  # node -> branches with a non-empty C[beta, node]
        # node -> (branches whose C[beta, node] is left to clear, their lookup): see forget_node
        self._forgetting: dict[str, tuple[list[str], BranchLookup]] = {}

    def count(self, node: str, block: int) -> int:
        """``R[block, node]``."""
        counts = self._counts.get(node)
        return 0 if counts is None else counts.get(block, 0)

    def counts(self, node: str) -> dict[int, int]:
        """Every positive ``R[b, node]``."""
        return dict(self._counts.get(node, {}))

    def counts_view(self, node: str) -> Mapping[int, int]:
        """:meth:`counts` without a copy: the live table, read-only by its type (a plain dict, so C-level
        lookups over thousands of blocks stay fast). Its keys are exactly the blocks with ``R > 0``."""
        return self._counts.get(node, {})

    def counting(self, node: str) -> set[str]:
        """The branches that count at least one block on ``node`` (a copy)."""
        return set(self._counting.get(node, ()))

    def nodes(self) -> list[str]:
        return [n for n, c in self._counts.items() if c]

    def set_counted(self, state: BranchState, node: str, path: Iterable[int], out: CountChanges) -> None:
        """``Count(beta, n, pi)``: make ``state`` count exactly the blocks of ``path`` on ``node``.

        New blocks get +1, dropped blocks -1; the new ``R`` of every changed block goes into ``out``.
        On a node being forgotten (:meth:`forget_node`) the branch only loses its set there.
        """
        if node in self._forgetting:
            state.counted.pop(node, None)
            state.pending.pop(node, None)
            return
        new = frozenset(path)
        old = state.counted.get(node, _NO_BLOCKS)
        if new == old:
            return
        counts = self._counts.setdefault(node, {})
        changed = out.setdefault(node, {})
        added = new - old if old else new  # (no copy of a whole set for a first count or a release)
        if added:  # R += 1
            _shift(counts, added, add, changed)
        if len(new) - len(added) != len(old):  # not every old block is still counted (else skip the pass)
            _shift(counts, old - new if new else old, sub, changed)  # R -= 1 (a zero leaves ``counts``)
        if new:
            state.counted[node] = new
            self._counting.setdefault(node, set()).add(state.branch_id)
        else:
            del state.counted[node]
            state.pending.pop(node, None)
            self._counting[node].discard(state.branch_id)

    def release(self, state: BranchState, node: str, out: CountChanges) -> None:
        """``Release(beta, n) = Count(beta, n, {})``."""
        self.set_counted(state, node, (), out)

    def forget_node(self, node: str, branches: Iterable[str], find: BranchLookup) -> None:
        """``node`` is gone: every ``R[b, node]`` is 0 at once (its table goes whole, no count is
        released one by one); the sets ``C[beta, node]`` and pending moves to the node of ``branches``
        (every branch with a set there, and those with a move there) are cleared by
        :meth:`forget_steps`, a few thousand branches a step. Meanwhile a branch's set on the node is
        only cleared (an E.1 version bump, an end), never counted again."""
        self.finish_forgetting(node)
        self._counts.pop(node, None)
        self._counting.pop(node, None)
        left = list(branches)
        if left:
            self._forgetting[node] = (left, find)

    def forget_steps(self, node: str, step: int = 4096) -> Generator[None, None, None]:
        """Clear the branches' sets on a node :meth:`forget_node` left, ``step`` branches a step."""
        while node in self._forgetting:
            yield
            self._forget_some(node, step)

    def finish_forgetting(self, node: str) -> None:
        """Clear at once what is left of a forgotten node's sets (before it registers again)."""
        while node in self._forgetting:
            self._forget_some(node, 1 << 30)

    def _forget_some(self, node: str, step: int) -> None:
        entry = self._forgetting.get(node)
        if entry is None:
            return
        left, find = entry
        for beta in left[-step:]:
            state = find(beta)
            if state is not None:
                state.counted.pop(node, None)
                state.pending.pop(node, None)
        del left[-step:]
        if not left:
            del self._forgetting[node]

    def restore(self, state: BranchState) -> None:
        """Add a persisted branch's counted sets (rebuild after a restart)."""
        for node, blocks in state.counted.items():
            if blocks:
                _shift(self._counts.setdefault(node, {}), blocks, add, {})
                self._counting.setdefault(node, set()).add(state.branch_id)

    def evicted(
        self, node: str, blocks: Iterable[int], state_of: Callable[[str], BranchState], out: CountChanges
    ) -> list[str]:
        """E.2 line 20: the host copies of ``blocks`` on ``node`` were evicted (or the blocks left the node):
        drop them from ``C[beta, node]`` of every branch, ``R = 0``.

        ``state_of`` returns a branch's row; returns the ids of the branches that counted one of the
        blocks, sorted.
        """
        counts = self._counts.get(node)
        if not counts:
            return []
        hit = list(dict.fromkeys(filter(counts.__contains__, blocks)))
        if not hit:
            return []
        gone = frozenset(hit)
        affected = []
        for beta in sorted(self._counting[node]):
            state = state_of(beta)
            counted = state.counted[node]
            if counted.isdisjoint(gone):
                continue
            affected.append(beta)
            remaining = counted - gone
            if remaining:
                state.counted[node] = remaining
            else:
                del state.counted[node]
                state.pending.pop(node, None)
                self._counting[node].discard(beta)
        changed = out.setdefault(node, {})
        for b in hit:
            del counts[b]
            changed[b] = 0
        return affected


def _shift(
    counts: dict[int, int],
    blocks: Collection[int],
    op: Callable[[int, int], int],
    changed: dict[int, int],
) -> None:
    """``counts[b] = op(counts[b], 1)`` for every block (absent counts are 0), recorded in ``changed``;
    blocks whose count becomes 0 leave ``counts``. One C-level pass per step instead of a Python loop."""
    new = list(map(op, map(counts.get, blocks, repeat(0)), repeat(1)))
    counts.update(zip(blocks, new, strict=True))
    changed.update(zip(blocks, new, strict=True))
    if 0 in new:
        for b in compress(blocks, map(not_, new)):
            del counts[b]
