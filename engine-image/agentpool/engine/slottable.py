"""A host pool's slot table in NIXL-registered memory: peers find and validate blocks one-sidedly.

A peer that fetches a prefix learns which slots hold its blocks and checks that they were not
overwritten during its READ without the owner's CPU: it READs this table (one-sided, like the
blocks) instead of asking for a lease. One ``uint64`` array, two parts:

- **headers**, one per slot: ``[block hash, generation]``. The generation is a seqlock word: odd while
  the slot's bytes are being replaced (:meth:`SlotTable.begin_write`, when a slot is taken for new
  bytes), even once the slot holds the block named by the hash (:meth:`SlotTable.end_write`). It only
  grows, so an even generation names one content of one slot.
- **index**, ``sets`` sets of :data:`WAYS` entries ``[block hash, generation << 32 | slot]`` (low 32
  bits of the generation), set chosen from the hash (:func:`set_of`); an entry whose second word is 0
  is empty. A block that finds its set full is simply not indexed (the reader falls back to a lease);
  with at least as many sets as slots a set holds one block on average, so that is rare.

A reader (``nixl_transport.NixlTransport.read_indexed``) READs the sets of the blocks it wants
(:func:`find`), READs the blocks' bytes from the slots found, then READs those slots' headers; a
block is valid only if its header still names it with the generation the index gave (:func:`valid`):
the slot was not rewritten between the index entry's write and the header READ, which brackets the
data READ. Anything else (a block not indexed, evicted, being overwritten, rewritten) is a miss, and
the reader takes a lease instead; wrong bytes are never indexed.

Write order (x86 stores are seen in program order; aligned 8-byte words are read whole): a slot's
generation goes odd before its bytes change and even only after its hash is written; an index entry's
second word is cleared before its hash changes and set last. Pure numpy, no I/O; one event loop owns
the owner's side.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

WAYS = 4
ENTRY_WORDS = 2  # [hash, gen << 32 | slot] in the index, [hash, gen] in a header
HEADER_BYTES = ENTRY_WORDS * 8
SET_BYTES = WAYS * ENTRY_WORDS * 8
_MIN_SETS = 64
_GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1


def sets_for(slots: int) -> int:
    """Sets for a pool of ``slots`` slots: a power of two >= ``slots`` (at most one block per set on
    average; ``WAYS`` per set)."""
    n = _MIN_SETS
    while n < slots:
        n *= 2
    return n


def set_of(block_hash: int, sets: int) -> int:
    """The set of ``block_hash`` among ``sets`` (a power of two): the top bits of a multiplicative mix."""
    return ((block_hash * _GOLDEN) & _M64) >> (64 - sets.bit_length() + 1)


def sets_of(hashes: npt.NDArray[np.uint64], sets: int) -> npt.NDArray[np.int32]:
    """:func:`set_of` for an array of hashes."""
    with np.errstate(over="ignore"):
        mixed = hashes * np.uint64(_GOLDEN)
    out: npt.NDArray[np.int32] = (mixed >> np.uint64(64 - sets.bit_length() + 1)).astype(np.int32)
    return out


def find(
    entries: npt.NDArray[np.uint64], hashes: npt.NDArray[np.uint64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
    """Slots and generations of ``hashes`` in their READ sets (``entries``: one set per hash, shape
    ``(n, WAYS * 2)``); slot -1 where a hash is not indexed."""
    e = entries.reshape(len(hashes), WAYS, ENTRY_WORDS)
    hit = (e[:, :, 0] == hashes[:, None]) & (e[:, :, 1] != 0)
    way = np.argmax(hit, axis=1)
    packed = e[np.arange(len(hashes)), way, 1]
    found = hit.any(axis=1)
    slots = np.where(found, (packed & np.uint64(_M32)).astype(np.int64), -1)
    return slots, packed >> np.uint64(32)


def valid(
    headers: npt.NDArray[np.uint64], hashes: npt.NDArray[np.uint64], gens: npt.NDArray[np.uint64]
) -> npt.NDArray[np.bool_]:
    """Which blocks' READ headers (shape ``(n, 2)``) still name them with the generation found."""
    h = headers.reshape(len(hashes), ENTRY_WORDS)
    same_gen = (h[:, 1] & np.uint64(_M32)) == gens
    out: npt.NDArray[np.bool_] = (h[:, 0] == hashes) & same_gen & ((gens & np.uint64(1)) == 0)
    return out


class SlotTable:
    """The owner's side: headers and index of ``slots`` slots in one array for NIXL to register."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.sets = sets_for(slots)
        self.array: npt.NDArray[np.uint64] = np.zeros(
            (slots + self.sets * WAYS) * ENTRY_WORDS, dtype=np.uint64
        )
        self._headers = self.array[: slots * ENTRY_WORDS].reshape(slots, ENTRY_WORDS)
        self._index = self.array[slots * ENTRY_WORDS :].reshape(self.sets, WAYS, ENTRY_WORDS)
        self._where: dict[int, tuple[int, int]] = {}  # indexed hash -> (set, way)
        self.unindexed = 0  # blocks whose set was full

    @property
    def index_offset(self) -> int:
        """Byte offset of the index in :attr:`array` (the headers come first)."""
        return self.slots * HEADER_BYTES

    def generation(self, slot: int) -> int:
        return int(self._headers[slot, 1])

    def begin_write(self, slot: int) -> None:
        """The slot's bytes are about to change: its generation goes odd (if it is not already)."""
        g = int(self._headers[slot, 1])
        if not g & 1:
            self._headers[slot, 1] = g + 1

    def end_write(self, slot: int, block_hash: int) -> None:
        """The slot now holds ``block_hash``: name it, make the generation even, index it."""
        g = int(self._headers[slot, 1])
        if not g & 1:
            raise RuntimeError(f"slot {slot} written without begin_write")
        self._headers[slot, 0] = block_hash
        self._headers[slot, 1] = g + 1
        self._insert(block_hash, slot, (g + 1) & _M32)

    def unindex(self, block_hash: int) -> None:
        """The block left the pool: readers no longer find it (its slot keeps its bytes until reused)."""
        where = self._where.pop(block_hash, None)
        if where is not None:
            self._index[where[0], where[1], 1] = 0

    def _insert(self, block_hash: int, slot: int, gen32: int) -> None:
        self.unindex(block_hash)
        s = set_of(block_hash, self.sets)
        ways = self._index[s]
        free = np.flatnonzero(ways[:, 1] == 0)
        if not free.size:
            self.unindexed += 1
            return
        w = int(free[0])
        ways[w, 0] = block_hash
        ways[w, 1] = (gen32 << 32) | slot
        self._where[block_hash] = (s, w)


__all__ = ["HEADER_BYTES", "SET_BYTES", "WAYS", "SlotTable", "find", "set_of", "sets_for", "sets_of", "valid"]
