"""Branch counts ``R[b, n]`` with ``Count`` and ``Release`` exactly as Algorithm E.2.

``R[b, n]`` is the number of active branches that count block ``b`` on node ``n``. It is kept as the set
of those branches (so evicting a block can drop it from every ``C[beta, n]``), and ``R`` is its size.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from agentpool.kv.branches import BranchState

CountChanges = dict[str, dict[int, int]]  # node -> block -> new R[b, n]


class BranchCounts:
    def __init__(self) -> None:
        self._holders: dict[str, dict[int, set[str]]] = {}

    def count(self, node: str, block: int) -> int:
        """``R[block, node]``."""
        holders = self._holders.get(node)
        if holders is None:
            return 0
        s = holders.get(block)
        return 0 if s is None else len(s)

    def counts(self, node: str) -> dict[int, int]:
        """Every positive ``R[b, node]``."""
        return {b: len(s) for b, s in self._holders.get(node, {}).items()}

    def holders(self, node: str) -> Mapping[int, set[str]]:
        """Read-only live view ``block -> branches counting it`` on ``node``: its keys are exactly the
        blocks with ``R > 0`` (no value is empty). Do not mutate the sets."""
        return MappingProxyType(self._holders.get(node, {}))

    def branches_on(self, node: str, block: int) -> frozenset[str]:
        return frozenset(self._holders.get(node, {}).get(block, ()))

    def nodes(self) -> list[str]:
        return [n for n, h in self._holders.items() if h]

    def set_counted(self, state: BranchState, node: str, path: Iterable[int], out: CountChanges) -> None:
        """``Count(beta, n, pi)``: make ``state`` count exactly the blocks of ``path`` on ``node``.

        New blocks get +1, dropped blocks -1; the new ``R`` of every changed block goes into ``out``.
        """
        new = frozenset(path)
        old = state.counted.get(node, frozenset())
        if new == old:
            return
        holders = self._holders.setdefault(node, {})
        changed = out.setdefault(node, {})
        beta = state.branch_id
        get = holders.get
        for b in new - old:
            s = get(b)
            if s is None:
                holders[b] = {beta}
                changed[b] = 1
            else:
                s.add(beta)
                changed[b] = len(s)
        for b in old - new:
            s = holders[b]
            s.discard(beta)
            if s:
                changed[b] = len(s)
            else:
                del holders[b]
                changed[b] = 0
        if new:
            state.counted[node] = new
        else:
            del state.counted[node]
            state.pending.pop(node, None)

    def release(self, state: BranchState, node: str, out: CountChanges) -> None:
        """``Release(beta, n) = Count(beta, n, {})``."""
        self.set_counted(state, node, (), out)

    def restore(self, state: BranchState) -> None:
        """Add a persisted branch's counted sets (rebuild after a restart)."""
        beta = state.branch_id
        for node, blocks in state.counted.items():
            holders = self._holders.setdefault(node, {})
            for b in blocks:
                holders.setdefault(b, set()).add(beta)

    def evicted(self, node: str, block: int, states: dict[str, BranchState], out: CountChanges) -> list[str]:
        """E.2 line 20: the host copy of ``block`` on ``node`` was evicted (or the block left the node):
        drop it from ``C[beta, node]`` of every branch, ``R = 0``.

        ``states`` maps the affected branch ids to their rows; returns those branch ids.
        """
        holders = self._holders.get(node)
        if holders is None or block not in holders:
            return []
        betas = sorted(holders.pop(block))
        for beta in betas:
            state = states[beta]
            remaining = state.counted[node] - {block}
            if remaining:
                state.counted[node] = remaining
            else:
                del state.counted[node]
                state.pending.pop(node, None)
        out.setdefault(node, {})[block] = 0
        return betas
