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

from collections.abc import Sequence

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
_SET_WORDS = WAYS * ENTRY_WORDS


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


def find(entries: Sequence[int], hashes: Sequence[int]) -> tuple[list[int], list[int]] | None:
    """Slots and generations of ``hashes`` in their READ sets (``entries``: the words of one set per
    hash, in order), or None when some hash is not indexed. Plain Python over a ``memoryview``: a
    fetch names a few blocks, fewer than numpy's per-call cost would pay for."""
    slots: list[int] = []
    gens: list[int] = []
    at = 0
    for h in hashes:
        for e in range(at, at + _SET_WORDS, ENTRY_WORDS):
            packed = entries[e + 1]
            if packed and entries[e] == h:
                slots.append(packed & _M32)
                gens.append(packed >> 32)
                break
        else:
            return None
        at += _SET_WORDS
    return slots, gens


def valid(headers: Sequence[int], hashes: Sequence[int], gens: Sequence[int]) -> bool:
    """Whether every block's READ header (``headers``: two words per block, in order) still names it
    with the (even) generation found."""
    at = 0
    for h, g in zip(hashes, gens, strict=True):
        if g & 1 or headers[at] != h or headers[at + 1] & _M32 != g:
            return False
        at += ENTRY_WORDS
    return True


class SlotTable:
    """The owner's side: headers and index of ``slots`` slots in one array for NIXL to register.

    Written through a memoryview of its 64-bit words (a Python int store per word, cheaper than
    numpy scalar indexing on the fetch path)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.sets = sets_for(slots)
        self.array: npt.NDArray[np.uint64] = np.zeros(
            (slots + self.sets * WAYS) * ENTRY_WORDS, dtype=np.uint64
        )
        self._w = self.array.view(np.uint8).data.cast("Q")
        self._where: dict[int, int] = {}  # indexed hash -> word of its entry's hash
        self.unindexed = 0  # blocks whose set was full

    @property
    def index_offset(self) -> int:
        """Byte offset of the index in :attr:`array` (the headers come first)."""
        return self.slots * HEADER_BYTES

    def generation(self, slot: int) -> int:
        return int(self._w[slot * ENTRY_WORDS + 1])

    def begin_write(self, slot: int) -> None:
        """The slot's bytes are about to change: its generation goes odd (if it is not already)."""
        i = slot * ENTRY_WORDS + 1
        g = self._w[i]
        if not g & 1:
            self._w[i] = g + 1

    def end_write(self, slot: int, block_hash: int) -> None:
        """The slot now holds ``block_hash``: name it, make the generation even, index it."""
        w, i = self._w, slot * ENTRY_WORDS
        g = w[i + 1]
        if not g & 1:
            raise RuntimeError(f"slot {slot} written without begin_write")
        w[i] = block_hash
        w[i + 1] = g + 1
        self._insert(block_hash, slot, (g + 1) & _M32)

    def unindex(self, block_hash: int) -> None:
        """The block left the pool: readers no longer find it (its slot keeps its bytes until reused)."""
        at = self._where.pop(block_hash, None)
        if at is not None:
            self._w[at + 1] = 0

    def _insert(self, block_hash: int, slot: int, gen32: int) -> None:
        self.unindex(block_hash)
        w = self._w
        base = (self.slots + set_of(block_hash, self.sets) * WAYS) * ENTRY_WORDS
        for at in range(base, base + WAYS * ENTRY_WORDS, ENTRY_WORDS):
            if w[at + 1] == 0:  # empty: its hash may change
                w[at] = block_hash
                w[at + 1] = (gen32 << 32) | slot
                self._where[block_hash] = at
                return
        self.unindexed += 1


__all__ = ["HEADER_BYTES", "SET_BYTES", "WAYS", "SlotTable", "find", "set_of", "sets_for", "valid"]
