"""The tables of the prefix index (:class:`agentpool.kv.index.PrefixIndex`, whose module docstring
gives their layout and memory), the node slots, the compaction after a big purge, and the queries.

A block's holders are one int, two bits per node slot (:func:`host_bit_of`, :func:`gpu_bit_of`); every
table keyed by block hash is sharded (:mod:`agentpool.kv.shards`). :class:`IndexTables` holds them and
answers from them; :class:`~agentpool.kv.index.PrefixIndex` applies the engines' events to them.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from itertools import chain

from agentpool.kv.hashing import ROOT_HASH
from agentpool.kv.shards import (
    SHARDS,
    Gets,
    Runs,
    ShardedAccess,
    new_shards,
    shard_keys,
    total,
    walk,
)
from agentpool.kv.steps import drain
from agentpool.kv.types import HeldBlock, InvalidEventError, PrefixMatch, Tier, UnknownNodeError

_MATCH_CACHE_SIZE = 1 << 16
_COMPACT_MIN_PEAK = 1 << 16  # smaller tables are not worth rebuilding


class IndexTables:
    """The prefix index's tables and the reads on them (the base of
    :class:`~agentpool.kv.index.PrefixIndex`, which changes them as events come). Pure: time is
    passed in."""

    def __init__(self) -> None:
        # sharded by block hash (agentpool.kv.shards): block h is in table h % SHARDS of each
        self._parent: list[dict[int, int]] = new_shards()  # every indexed block -> its parent hash
        # block -> its holders: bit 2s set when slot s holds a host copy, bit 2s + 1 a GPU copy (one
        # lookup per block of a walk); a block nobody holds has no entry. The loops that change many
        # blocks reuse the int they computed for the block before when its holders were the same, so
        # a run of blocks with the same holders shares one int object: a walk along it compares
        # identity and never reads the object (one memory access fewer per block)
        self._hold: list[dict[int, int]] = new_shards()
        self._slot_of: dict[str, int] = {}
        self._name_of: dict[int, str] = {}
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._live = 0  # bit 2s for each registered slot s: a slot being purged is out of every answer
        self._last_access: dict[int, list[dict[int, float]]] = {}  # slot -> (sharded) hash -> last access
        # slots that may hold a block without a host copy; every other slot's held blocks all have one
        self._not_all_host: set[int] = set()
        self._matches: dict[tuple[int, int, int], PrefixMatch] = {}  # see _match
        self._runs = Runs()  # runs of blocks with one holders int that walks saw (shards.Runs)
        self._peak = 0  # most blocks indexed since the last compaction (see _note_size, _compact)
        self._bind()

    def _bind(self) -> None:
        """The bound methods the per-block loops call, per shard (after the tables are (re)built)."""
        self._hold_get: Gets = [t.get for t in self._hold]
        self._parent_setdefault = [t.setdefault for t in self._parent]

    # -- nodes -------------------------------------------------------------------------------
    def nodes(self) -> list[str]:
        return sorted(self._slot_of)

    def has_node(self, node: str) -> bool:
        return node in self._slot_of

    def add_node(self, node: str) -> None:
        """Give ``node`` a slot (idempotent)."""
        if node in self._slot_of:
            return
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot, self._next_slot = self._next_slot, self._next_slot + 1
        self._slot_of[node] = slot
        self._name_of[slot] = node
        self._last_access[slot] = new_shards()
        self._live |= host_bit_of(slot)

    def _note_size(self) -> None:
        """Record the index's size as a peak candidate. Called before every operation that deletes
        entries: the index only grows in between, so the peak is always seen."""
        size = total(self._parent)
        if size > self._peak:
            self._peak = size

    def _compact(self) -> None:
        drain(self._compact_steps())

    def _compact_steps(self) -> Generator[None, None, None]:
        """Give memory back after a big purge: a dict keeps its table size when entries are deleted,
        so once the index holds under a quarter of its peak the tables are rebuilt at their live size
        (same content and order; the copy costs time in proportion to what is left), one shard per
        step (freeing a big table takes time too). Each shard is copied and replaced within one step,
        in place in the shard lists, so work running between the steps sees the same content."""
        size = total(self._parent)
        if size > self._peak:
            self._peak = size
            return
        if self._peak < _COMPACT_MIN_PEAK or 4 * size >= self._peak:
            return
        self._peak = size
        for k in range(SHARDS):
            yield
            self._parent[k] = parents = dict(self._parent[k])
            self._hold[k] = hold = dict(self._hold[k])
            self._parent_setdefault[k] = parents.setdefault
            self._hold_get[k] = hold.get
            for la in self._last_access.values():
                la[k] = dict(la[k])

    def _slot(self, node: str) -> int:
        try:
            return self._slot_of[node]
        except KeyError:
            raise UnknownNodeError(f"node {node!r} is not in the index") from None

    def _link(self, h: int, parent: int) -> None:
        known = self._parent[h % SHARDS].setdefault(h, parent)
        if known != parent:
            raise InvalidEventError(
                f"block {h:#x} stored under parent {parent:#x} but the index has parent {known:#x}"
            )

    # -- queries -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return total(self._parent)

    def _tiers_of(self, h: int, slot: int) -> Tier:
        v = self._hold[h % SHARDS].get(h, 0)
        g = Tier.GPU if v & gpu_bit_of(slot) else Tier(0)
        return g | (Tier.HOST if v & host_bit_of(slot) else Tier(0))

    def tiers(self, node: str, block: int) -> Tier:
        """Tiers in which ``node`` holds ``block`` (empty when it does not)."""
        slot = self._slot_of.get(node)
        return Tier(0) if slot is None else self._tiers_of(block, slot)

    def parent(self, block: int) -> int:
        return self._parent[block % SHARDS].get(block, ROOT_HASH)

    def _held(self, node: str, hashes: Iterable[int]) -> Iterator[bool]:
        """Whether ``node`` holds each of ``hashes`` (lazily, C-level)."""
        las = self._last_access[self._slot(node)]
        hashes = list(hashes)
        return map(dict.__contains__, map(las.__getitem__, shard_keys(hashes)), hashes)

    def holds_all(self, node: str, hashes: Iterable[int]) -> bool:
        return all(self._held(node, hashes))

    def count_held(self, node: str, hashes: Iterable[int]) -> int:
        """How many of ``hashes`` ``node`` holds."""
        return sum(self._held(node, hashes))

    def last_access(self, node: str, block: int) -> float | None:
        return self._last_access[self._slot(node)][block % SHARDS].get(block)

    def node_blocks(self, node: str) -> Iterator[HeldBlock]:
        """Every block ``node`` holds, with its parent and tiers (shard by shard)."""
        slot = self._slot(node)
        for h in chain.from_iterable(self._last_access[slot]):
            yield HeldBlock(h, self._parent[h % SHARDS][h], self._tiers_of(h, slot))

    def node_block_count(self, node: str) -> int:
        return total(self._last_access[self._slot(node)])

    def host_blocks(self, node: str) -> list[tuple[int, float]]:
        """``(hash, last_access)`` of every block ``node`` holds in host memory (a copy)."""
        return list(self.host_access(node).items())

    def host_access(self, node: str) -> Mapping[int, float]:
        """``hash -> last access`` of every block ``node`` holds in host memory: when every block the node
        holds has a host copy, the live tables themselves (a read-only :class:`ShardedAccess`; no copy of
        a node's index), else a new dict."""
        slot = self._slot(node)
        las = self._last_access[slot]
        if slot not in self._not_all_host:
            return ShardedAccess(las)
        bit = host_bit_of(slot)
        return {
            h: t
            for hold, la in zip(self._hold, las, strict=True)
            for h, t in la.items()
            if hold.get(h, 0) & bit
        }

    def longest_prefixes(self, hashes: Sequence[int]) -> dict[str, PrefixMatch]:
        """Per node holding block 0 of ``hashes``: its longest cached prefix by tier, in one walk
        (:func:`agentpool.kv.shards.walk`); the nodes that leave at the same block share one result."""
        gpu_depth, host_depth, any_depth = walk(hashes, self._hold_get, self._live, self._runs)
        names, match = self._name_of, self._match
        return {
            names[slot]: match(gpu_depth.get(slot, 0), host_depth.get(slot, 0), d)
            for slot, d in any_depth.items()
        }

    def _match(self, gpu: int, host: int, local: int) -> PrefixMatch:
        """A shared immutable :class:`PrefixMatch` (building a frozen dataclass costs more than the walk)."""
        key = (gpu, host, local)
        m = self._matches.get(key)
        if m is None:
            if len(self._matches) >= _MATCH_CACHE_SIZE:
                self._matches.clear()
            m = self._matches[key] = PrefixMatch(gpu, host, local)
        return m


def host_bit_of(slot: int) -> int:
    """The bit of a host copy on ``slot`` in a block's holders (``_hold``)."""
    return 1 << (2 * slot)


def gpu_bit_of(slot: int) -> int:
    return 2 << (2 * slot)


def both_bits_of(slot: int) -> int:
    return 3 << (2 * slot)
