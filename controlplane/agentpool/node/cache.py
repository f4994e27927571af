"""Block caches of one node: the GPU tier (L1, LRU, prefix-closed) and the host tier (L2).

Both hold block keys only (the chained hashes of :mod:`agentpool.kv`); what the bytes are and
where they live is the driver's business.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice, repeat

from agentpool.kv.eviction import eviction_hashes_counted


class GpuCache:
    """LRU set of block keys with a capacity in blocks.

    A request touches its whole path from the deepest block to the root, so a prefix is always more
    recent than its extensions and LRU evicts leaves first: the blocks held stay prefix-closed and a
    binary search finds the longest prefix.
    """

    __slots__ = ("_lru", "capacity")

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity must be non-negative")
        self.capacity = capacity_blocks
        self._lru: dict[int, None] = {}

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block: int) -> bool:
        return block in self._lru

    def prefix(self, blocks: Sequence[int]) -> int:
        """Longest prefix of ``blocks`` held (binary search; the set is prefix-closed)."""
        lru = self._lru
        n = len(blocks)
        if n == 0 or blocks[0] not in lru:
            return 0
        if blocks[n - 1] in lru:
            return n
        lo, hi = 1, n - 1  # blocks[lo - 1] is held, blocks[hi] is not
        while lo < hi:
            mid = (lo + hi) // 2
            if blocks[mid] in lru:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def touch(self, blocks: Sequence[int]) -> list[int]:
        """Insert or refresh ``blocks`` (deepest first); returns the keys evicted to make room.

        Same order as moving each block to the most recent end from the deepest to the root, done
        with dict operations that loop in C (a path is ~200 blocks, touched at every store)."""
        lru = self._lru
        keys = list(dict.fromkeys(blocks))  # a repeated key counts where it comes first
        keys.reverse()
        deque(map(lru.pop, keys, repeat(None)), maxlen=0)
        lru.update(zip(keys, repeat(None)))
        over = len(lru) - self.capacity
        if over <= 0:
            return []
        evicted = list(islice(lru, over))
        deque(map(lru.__delitem__, evicted), maxlen=0)
        return evicted

    def discard(self, blocks: Iterable[int]) -> None:
        deque(map(self._lru.pop, blocks, repeat(None)), maxlen=0)

    def resize(self, capacity_blocks: int) -> list[int]:
        """Change the capacity (GPU memory taken or freed by running requests); returns the keys
        evicted, least recently used first, to fit."""
        self.capacity = max(0, capacity_blocks)
        over = len(self._lru) - self.capacity
        if over <= 0:
            return []
        evicted = list(islice(self._lru, over))
        deque(map(self._lru.__delitem__, evicted), maxlen=0)
        return evicted

    def clear(self) -> None:
        self._lru.clear()


class HostCache:
    """Host-memory tier: block keys with their last access time and a capacity in blocks.

    Every block a node computes or receives is written through to it (:meth:`store`). When it holds
    more than its capacity, :meth:`evict` removes blocks in the order of Algorithm E.2 ``EvictHost``
    (:func:`agentpool.kv.eviction.eviction_hashes_counted`): blocks no live branch needs first
    (``counts`` from the directory's branch counts; an empty mapping gives plain LRU), least recently
    used first in each group, down to ``capacity * (1 - batch_fraction)`` so the order is computed
    once per batch rather than per block.

    The simulator keeps its nodes' host tiers in the directory's index (in simulation the two are
    the same by construction); a real-time driver (the engine's ``sim`` backend) keeps one here.
    """

    __slots__ = ("_access", "batch_fraction", "capacity")

    def __init__(self, capacity_blocks: int, *, batch_fraction: float = 0.25) -> None:
        if capacity_blocks < 0 or not 0.0 <= batch_fraction < 1.0:
            raise ValueError("need capacity >= 0 and 0 <= batch_fraction < 1")
        self.capacity = capacity_blocks
        self.batch_fraction = batch_fraction
        self._access: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self._access)

    def __contains__(self, block: int) -> bool:
        return block in self._access

    @property
    def access(self) -> Mapping[int, float]:
        """Block key -> last access time (read-only view for eviction orders and resyncs)."""
        return self._access

    def store(self, blocks: Iterable[int], now: float) -> None:
        """Write ``blocks`` through (or refresh their access time)."""
        self._access.update(zip(blocks, repeat(now)))

    def over_capacity(self) -> bool:
        return len(self._access) > self.capacity

    def evict(self, counts: Mapping[int, int]) -> list[int]:
        """If over capacity, remove a batch in eviction order and return the removed keys."""
        n = len(self._access)
        if n <= self.capacity:
            return []
        target = int(self.capacity * (1.0 - self.batch_fraction))
        hashes = eviction_hashes_counted(self._access, counts, limit=n - target)
        self.discard(hashes)
        return hashes

    def discard(self, blocks: Iterable[int]) -> None:
        deque(map(self._access.pop, blocks, repeat(0.0)), maxlen=0)

    def clear(self) -> None:
        self._access.clear()
