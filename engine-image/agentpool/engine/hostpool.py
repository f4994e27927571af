"""The node's host KV pool: one host-memory buffer of fixed-size block slots and its index.

The buffer is what NIXL registers (``nixl_transport.py``): a peer READs a block straight out of
slot ``s`` at ``base + s * block_bytes``. The index maps block hashes to slots, with each block's
parent and last access. The slot table (``slottable.py``, registered with NIXL beside the buffer)
mirrors which block each slot holds, with a generation per slot, so that peers find and validate
blocks without asking this node: a slot taken for new bytes goes through ``begin_write`` before they
are written and ``end_write`` once its block is indexed. Blocks pinned by a lease (a peer is reading
them, or a prefilled request's KV waits for its decode node) are never evicted.

Eviction (Algorithm E.2 ``EvictHost``) follows the directory's branch counts: zero-count blocks first,
least recently used within a group (``agentpool.kv.eviction``, the one implementation). ``counts``
holds the positive counts the directory streams to this node. A path is touched with access times
rising with depth, so a parent is never older than its child and eviction takes leaves first. A
block held under another hash (SGLang's pages under their storage keys, ``sglang/l3_index.py``) takes
the count of the directory block it is an alias of (:meth:`HostPool.alias`).

The buffer is private memory, or with ``shm_path`` a named shared-memory file (``shm.py``) that
SGLang's scheduler processes map too (the ``sglang`` backend's L3 store, ``sglang/l3_store.py``).

No I/O but that file, no clock: callers pass ``now``. Not thread-safe; one event loop owns it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from agentpool.engine.blockdata import block_matches, check_block_bytes, fill_block
from agentpool.engine.errors import PoolFullError
from agentpool.engine.shm import ShmBuffer
from agentpool.engine.slottable import SlotTable
from agentpool.kv import ROOT_HASH, HeldBlock, Tier
from agentpool.kv.eviction import eviction_hashes_counted

_EVICT_BATCH_DIVISOR = 64  # an eviction frees at least 1/64 of the pool
_DEPTH_STEP = 1e-6  # seconds added per depth when a path is touched (children newer than parents)


@dataclass(frozen=True, slots=True)
class Reserved:
    """Slots reserved for blocks being written (a fetch in flight); ``evicted``: blocks that made room."""

    slots: list[int]
    evicted: list[int]


class HostPool:
    """Fixed-size block slots in one contiguous host buffer, and which block each slot holds."""

    def __init__(self, slots: int, block_bytes: int, shm_path: Path | None = None) -> None:
        check_block_bytes(block_bytes)
        if slots <= 0:
            raise ValueError(f"a host pool needs at least one slot, got {slots}")
        self.capacity = slots
        self.block_bytes = block_bytes
        self.shm: ShmBuffer | None = None
        if shm_path is None:
            self.buffer: npt.NDArray[np.uint8] = np.zeros(slots * block_bytes, dtype=np.uint8)
        else:
            self.shm = ShmBuffer(shm_path, slots * block_bytes, create=True)
            self.buffer = self.shm.array
        self.slot_of: dict[int, int] = {}
        self.parent_of: dict[int, int] = {}
        self.access: dict[int, float] = {}
        self.pins: dict[int, int] = {}
        self.counts: dict[int, int] = {}  # positive branch counts from the directory (and aliases)
        self.alias_of: dict[int, int] = {}  # block -> the directory block whose count it takes
        self._aliases: dict[int, set[int]] = {}  # directory block -> blocks aliasing it
        self._free: list[int] = list(range(slots))  # a min-heap: reserved runs come out ascending
        self.table = SlotTable(slots)

    def close(self) -> None:
        """Unlink the shared-memory file, if any (its mappings stay valid)."""
        if self.shm is not None:
            self.shm.close()

    # -- state ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.slot_of)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.slot_of

    @property
    def base_address(self) -> int:
        return int(self.buffer.ctypes.data)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def slot_view(self, slot: int) -> npt.NDArray[np.uint8]:
        start = slot * self.block_bytes
        return self.buffer[start : start + self.block_bytes]

    def held_prefix(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` the pool holds."""
        n = 0
        for h in hashes:
            if h not in self.slot_of:
                break
            n += 1
        return n

    def slots(self, hashes: Iterable[int]) -> list[int]:
        return [self.slot_of[h] for h in hashes]

    def held_blocks(self) -> list[HeldBlock]:
        """Every block, parents before children (for a directory resync)."""
        out: list[HeldBlock] = []
        seen: set[int] = set()
        for h in self.slot_of:
            chain: list[int] = []
            x = h
            while x in self.slot_of and x not in seen:
                chain.append(x)
                seen.add(x)
                x = self.parent_of[x]
            for b in reversed(chain):
                out.append(HeldBlock(b, self.parent_of[b], Tier.HOST))
        return out

    def matches(self, block_hash: int) -> bool:
        """Whether the block's slot holds the bytes derived from its hash."""
        return block_matches(self.slot_view(self.slot_of[block_hash]), block_hash)

    # -- pins -----------------------------------------------------------------------------------
    def pin(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            if h not in self.slot_of:
                raise KeyError(h)
            self.pins[h] = self.pins.get(h, 0) + 1

    def unpin(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            n = self.pins.get(h, 0) - 1
            if n > 0:
                self.pins[h] = n
            else:
                self.pins.pop(h, None)

    # -- counts from the directory --------------------------------------------------------------
    def set_counts(self, counts: Mapping[int, int], snapshot: bool) -> None:
        if snapshot:
            self.counts.clear()
        for h, c in counts.items():
            for t in (h, *self._aliases.get(h, ())):
                if c > 0:
                    self.counts[t] = c
                else:
                    self.counts.pop(t, None)

    def alias(self, h: int, directory_hash: int) -> None:
        """Held block ``h`` takes ``directory_hash``'s branch count from now on (eviction order)."""
        if h not in self.slot_of or h == directory_hash:
            return
        self._unalias(h)
        self.alias_of[h] = directory_hash
        self._aliases.setdefault(directory_hash, set()).add(h)
        c = self.counts.get(directory_hash)
        if c:
            self.counts[h] = c

    def _unalias(self, h: int) -> None:
        d = self.alias_of.pop(h, None)
        if d is not None:
            group = self._aliases[d]
            group.discard(h)
            if not group:
                del self._aliases[d]
            self.counts.pop(h, None)

    # -- writes ---------------------------------------------------------------------------------
    def touch(self, hashes: Sequence[int], now: float) -> None:
        for depth, h in enumerate(hashes):
            if h in self.access:
                self.access[h] = now + depth * _DEPTH_STEP

    def eviction_candidates(self, limit: int | None = None) -> list[int]:
        """Unpinned blocks in eviction order (zero count first, LRU within a group)."""
        want = None if limit is None else limit + len(self.pins)
        order = eviction_hashes_counted(self.access, self.counts, want)
        out = [h for h in order if h not in self.pins]
        return out if limit is None else out[:limit]

    def reserve(self, n: int) -> Reserved:
        """Take ``n`` slots, evicting unpinned blocks in eviction order if the free ones are too few.

        Raises :class:`PoolFullError` (and evicts nothing) when pinned blocks leave too little room."""
        if n < 0:
            raise ValueError("n must be non-negative")
        short = n - len(self._free)
        evicted: list[int] = []
        if short > 0:
            # evict a batch beyond the need, so the order is computed once per batch, not per block
            victims = self.eviction_candidates(max(short, self.capacity // _EVICT_BATCH_DIVISOR))
            if len(victims) < short:
                raise PoolFullError(f"host pool: {n} slots asked, {len(self._free) + len(victims)} available")
            for h in victims:
                self._drop(h)
            evicted = victims
        taken = [heapq.heappop(self._free) for _ in range(n)]
        for s in taken:
            self.table.begin_write(s)  # before any byte of the slot changes
        return Reserved(taken, evicted)

    def release_slots(self, slots: Iterable[int]) -> None:
        """Give back reserved slots that were never committed (a failed fetch)."""
        for s in slots:
            heapq.heappush(self._free, s)

    def commit(self, blocks: Sequence[tuple[int, int, int]], now: float) -> list[int]:
        """Index ``(hash, parent, slot)`` blocks whose bytes were written into their reserved slots.

        A block meanwhile held elsewhere keeps its old copy (its new slot goes back). Returns the
        hashes newly indexed."""
        out: list[int] = []
        for depth, (h, parent, s) in enumerate(blocks):
            if h in self.slot_of:
                heapq.heappush(self._free, s)
            else:
                self.slot_of[h] = s
                self.parent_of[h] = parent
                self.table.end_write(s, h)
                out.append(h)
            self.access[h] = now + depth * _DEPTH_STEP
        return out

    def store_generated(self, parent: int, hashes: Sequence[int], now: float) -> tuple[list[int], list[int]]:
        """Write-through of computed blocks: fill their bytes from their hashes and index them.

        Returns ``(stored, evicted)``: the blocks newly held and those evicted to make room. Blocks
        already held are only touched."""
        new_at = self.held_prefix(hashes)
        # the chain may have holes after an eviction: store every block not held
        todo = [i for i in range(len(hashes)) if hashes[i] not in self.slot_of]
        self.touch(hashes[:new_at], now)
        if not todo:
            return [], []
        room = min(len(todo), self.capacity - len(self.pins))
        todo = todo[:room]
        res = self.reserve(len(todo))
        stored: list[int] = []
        for i, s in zip(todo, res.slots, strict=True):
            h = hashes[i]
            fill_block(self.slot_view(s), h)
            self.table.end_write(s, h)
            self.slot_of[h] = s
            self.parent_of[h] = hashes[i - 1] if i else parent
            self.access[h] = now + i * _DEPTH_STEP
            stored.append(h)
        return stored, res.evicted

    def remove(self, hashes: Iterable[int]) -> list[int]:
        """Drop unpinned ``hashes``; returns the ones removed."""
        out = []
        for h in hashes:
            if h in self.slot_of and h not in self.pins:
                self._drop(h)
                out.append(h)
        return out

    def _drop(self, h: int) -> None:
        self._unalias(h)
        self.table.unindex(h)
        heapq.heappush(self._free, self.slot_of.pop(h))
        del self.parent_of[h]
        del self.access[h]


__all__ = ["ROOT_HASH", "HostPool", "Reserved"]
