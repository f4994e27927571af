"""The prefix index as it was before its tables were sharded (main at 6d6f978), frozen as the reference
for ``test_kv_index_sharded.py``: the sharded :class:`agentpool.kv.PrefixIndex` must answer exactly as
this one does. Test-only; not maintained beyond that role.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from itertools import islice, repeat

from agentpool.kv.hashing import ROOT_HASH
from agentpool.kv.steps import STEP_BLOCKS, drain
from agentpool.kv.types import HeldBlock, InvalidEventError, PrefixMatch, Tier, UnknownNodeError, split_blocks

_MATCH_CACHE_SIZE = 1 << 16
_COMPACT_MIN_PEAK = 1 << 16  # smaller tables are not worth rebuilding

Steps = Generator[None, None, tuple[list[int], list[int]]]
_GPU, _HOST = int(Tier.GPU), int(Tier.HOST)
_ALL_TIERS = _GPU | _HOST


class UnshardedIndex:
    """Event-built index of KV block placement over nodes and tiers. Pure: time is passed in."""

    def __init__(self) -> None:
        self._parent: dict[int, int] = {}  # every indexed block -> its parent hash
        self._gpu: dict[int, int] = {}  # block -> bit set of node slots holding it in GPU memory
        self._host: dict[int, int] = {}  # block -> bit set of node slots holding it in host memory
        self._slot_of: dict[str, int] = {}
        self._name_of: dict[int, str] = {}
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._live = 0  # bits of the registered slots: a slot being purged is out of every answer
        self._last_access: dict[int, dict[int, float]] = {}  # slot -> block hash -> last access
        # slots that may hold a block without a host copy; every other slot's held blocks all have one
        self._not_all_host: set[int] = set()
        self._matches: dict[tuple[int, int, int], PrefixMatch] = {}  # see _match
        self._peak = 0  # most blocks indexed since the last compaction (see _compact)

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
        self._last_access[slot] = {}
        self._live |= 1 << slot

    def drop_node(self, node: str) -> list[int]:
        """Forget ``node`` and every placement it had; returns the hashes it held."""
        held = list(self._last_access[self._slot(node)])
        for _ in self.drop_node_steps(node):
            pass
        return held

    def drop_node_steps(self, node: str, step: int = STEP_BLOCKS) -> Generator[None, None, None]:
        """:meth:`drop_node` in steps of ``step`` blocks (a generator: the caller may run other work
        between steps). The node leaves every answer before the first step; its slot is reused only
        once its bits are cleared."""
        slot = self._slot(node)
        bit = 1 << slot
        del self._slot_of[node]
        del self._name_of[slot]
        self._live &= ~bit
        la = self._last_access.pop(slot)
        keep = ~bit
        gpu, host, parents = self._gpu, self._host, self._parent
        for _ in range(0, len(la), step):  # emptied as it goes: no big deallocation at the end
            yield
            for _ in range(min(step, len(la))):
                h = la.popitem()[0]
                g = gpu.get(h, 0) & keep
                if g:
                    gpu[h] = g
                else:
                    gpu.pop(h, None)
                s = host.get(h, 0) & keep
                if s:
                    host[h] = s
                else:
                    host.pop(h, None)
                if not g and not s:
                    parents.pop(h, None)
        self._not_all_host.discard(slot)
        self._free_slots.append(slot)
        self._compact()

    def _compact(self) -> None:
        """Give memory back after a big purge: a dict keeps its table size when entries are deleted,
        so once the index holds under a quarter of its peak the tables are rebuilt at their live size
        (same content and order; the copy costs time in proportion to what is left)."""
        size = len(self._parent)
        if size > self._peak:
            self._peak = size
        elif self._peak >= _COMPACT_MIN_PEAK and 4 * size < self._peak:
            self._parent = dict(self._parent)
            self._gpu = dict(self._gpu)
            self._host = dict(self._host)
            self._last_access = {slot: dict(la) for slot, la in self._last_access.items()}
            self._peak = size

    def _slot(self, node: str) -> int:
        try:
            return self._slot_of[node]
        except KeyError:
            raise UnknownNodeError(f"node {node!r} is not in the index") from None

    def _link(self, h: int, parent: int) -> None:
        known = self._parent.setdefault(h, parent)
        if known != parent:
            raise InvalidEventError(
                f"block {h:#x} stored under parent {parent:#x} but the index has parent {known:#x}"
            )

    # -- events ------------------------------------------------------------------------------
    def apply_stored(self, node: str, parent: int, hashes: Sequence[int], tier: Tier, now: float) -> None:
        """``node`` stored the chain ``hashes`` (child of ``parent``) in ``tier`` at time ``now``.

        A block already known under another parent raises :class:`InvalidEventError`; the blocks before
        it in the same event stay applied (the service answers such an error with a resync).
        """
        t = int(tier)  # plain int: each Tier operation is a Python-level enum call
        if not t or t & ~_ALL_TIERS:
            raise InvalidEventError(f"invalid tier {tier!r}")
        self.add_node(node)
        slot = self._slot_of[node]
        bit = 1 << slot
        la = self._last_access[slot]
        parents = self._parent
        setdefault = parents.setdefault
        gpu = self._gpu if t & _GPU else None
        host = self._host if t & _HOST else None
        if host is None:
            self._not_all_host.add(slot)
        prev = parent
        if gpu is None and host is not None and slot not in self._not_all_host:
            # Host-only stores on a node whose held blocks all have a host copy (the simulator's
            # write-through): a block the node already holds needs only its access time.
            host_get = host.get
            for h in hashes:
                if setdefault(h, prev) != prev:
                    self._link(h, prev)  # raises
                if h not in la:
                    host[h] = host_get(h, 0) | bit
                la[h] = now
                prev = h
            if len(parents) > self._peak:
                self._peak = len(parents)
            return
        for h in hashes:
            if setdefault(h, prev) != prev:
                self._link(h, prev)  # raises
            if gpu is not None:
                gpu[h] = gpu.get(h, 0) | bit
            if host is not None:
                host[h] = host.get(h, 0) | bit
            la[h] = now
            prev = h
        if len(parents) > self._peak:
            self._peak = len(parents)

    def apply_removed(self, node: str, hashes: Iterable[int], tier: Tier) -> list[int]:
        """``node`` dropped ``hashes`` from ``tier``; returns the hashes it no longer holds in any tier.

        Removing a block the node does not hold is a no-op (engines may repeat removals).
        """
        return self.remove(node, hashes, tier)[1]

    def remove(self, node: str, hashes: Iterable[int], tier: Tier) -> tuple[list[int], list[int]]:
        """``node`` dropped ``hashes`` from ``tier``. Returns ``(host_lost, gone)``: the hashes whose host
        copy this removed, and the hashes the node no longer holds in any tier."""
        slot = self._slot(node)
        bit = 1 << slot
        keep = ~bit
        la = self._last_access[slot]
        gpu, host, parents = self._gpu, self._host, self._parent
        gpu_t = bool(tier & Tier.GPU)  # plain bools: Tier operations are slow in the loop
        host_t = bool(tier & Tier.HOST)
        host_lost: list[int] = []
        gone: list[int] = []
        for h in hashes:
            if h not in la:
                continue
            g = gpu.get(h, 0)
            s = host.get(h, 0)
            if gpu_t and g:
                g &= keep
                if g:
                    gpu[h] = g
                else:
                    del gpu[h]
            if host_t and s:
                if s & bit:
                    host_lost.append(h)
                    if g & bit:
                        self._not_all_host.add(slot)
                s &= keep
                if s:
                    host[h] = s
                else:
                    del host[h]
            if not g and not s:
                del parents[h]
            if not ((g | s) & bit):
                del la[h]
                gone.append(h)
        if gone:
            self._compact()
        return host_lost, gone

    def replace_node(self, node: str, blocks: Iterable[HeldBlock], now: float) -> list[int]:
        """Resync: ``node`` holds exactly ``blocks`` now. Returns the hashes it held before but not now."""
        return self.resync(node, blocks, now)[1]

    def resync(self, node: str, blocks: Iterable[HeldBlock], now: float) -> tuple[list[int], list[int]]:
        """Resync: ``node`` holds exactly ``blocks`` now. Returns ``(host_lost, gone)``, sorted: the hashes
        it held in host memory before but not now, and the hashes it held before but not now in any tier.
        A block known under another parent raises :class:`InvalidEventError` before anything changes."""
        host_lost, gone = drain(self.resync_steps(node, *split_blocks(blocks), now))
        return sorted(host_lost), sorted(gone)

    def resync_steps(
        self,
        node: str,
        hashes: Sequence[int],
        parents_of: Sequence[int],
        tiers: Sequence[int],
        now: float,
        step: int = STEP_BLOCKS,
    ) -> Steps:
        """:meth:`resync` in steps of ``step`` blocks (a generator; ``(host_lost, gone)`` unsorted). The
        blocks come as three equally long lists of plain ints (block hash, parent hash, :class:`Tier`
        value; 0: not held): a million blocks are then no million objects for the garbage collector.

        A first pass checks the list without changing anything and raises :class:`InvalidEventError`:
        a block listed twice, a block listed before its parent (a parent is the root, a block listed
        earlier, or a block the node does not hold), a block known under another parent. A second
        adds the new placement (between steps an answer may show the node holding old and new blocks),
        a third clears what the node no longer holds, then its last-access table is swapped for the
        new one. The caller keeps other changes of ``node`` out until the generator finishes."""
        if not len(hashes) == len(parents_of) == len(tiers):
            raise ValueError("hashes, parents and tiers must be equally long")
        parents = self._parent
        n = len(hashes)
        new: dict[int, float] = {}  # the node's last-access table after the resync
        unlisted: set[int] = set()  # parents not listed before their child (fine unless listed later)
        for i in range(0, n, step):
            yield
            for h, p, t in zip(
                hashes[i : i + step], parents_of[i : i + step], tiers[i : i + step], strict=True
            ):
                if not t:
                    continue
                if h in new:
                    raise InvalidEventError(f"resync block {h:#x} is listed twice")
                known = parents.get(h)
                if known is not None and known != p:
                    self._link(h, p)  # raises
                if p and p not in new:
                    unlisted.add(p)
                new[h] = now
        late = unlisted.intersection(new)
        if late:
            child = next(i for i, p in enumerate(parents_of) if p in late and tiers[i])
            raise InvalidEventError(
                f"resync block {hashes[child]:#x} comes before its parent {parents_of[child]:#x}: "
                "list parents before children"
            )
        self.add_node(node)
        slot = self._slot_of[node]
        bit = 1 << slot
        keep = ~bit
        self._not_all_host.add(slot)  # "may hold a block without a host copy" is safe meanwhile
        old = self._last_access[slot]
        all_host = True
        gpu, host = self._gpu, self._host
        setdefault = parents.setdefault
        host_lost: list[int] = []
        for i in range(0, n, step):
            yield
            if self._slot_of.get(node) != slot:
                raise InvalidEventError(f"node {node!r} was dropped during its resync")
            for h, p, t in zip(
                hashes[i : i + step], parents_of[i : i + step], tiers[i : i + step], strict=True
            ):
                if not t:
                    continue
                setdefault(h, p)
                g = gpu.get(h, 0)
                s = host.get(h, 0)
                if t & _GPU:
                    gpu[h] = g | bit
                elif g & bit:  # held before with a GPU copy, not now
                    if g & keep:
                        gpu[h] = g & keep
                    else:
                        del gpu[h]
                if t & _HOST:
                    host[h] = s | bit
                else:
                    all_host = False
                    if s & bit:  # the host copy is gone (E.2 line 20)
                        host_lost.append(h)
                        if s & keep:
                            host[h] = s & keep
                        else:
                            del host[h]
        gone: list[int] = []
        before = iter(old)  # not resized meanwhile: the caller keeps the node's other changes out
        for _ in range(0, len(old), step):
            yield
            for h in islice(before, step):
                if h in new:
                    continue
                gone.append(h)
                g = gpu.get(h, 0) & keep
                if g:
                    gpu[h] = g
                else:
                    gpu.pop(h, None)
                s = host.get(h, 0)
                if s & bit:
                    host_lost.append(h)
                s &= keep
                if s:
                    host[h] = s
                else:
                    host.pop(h, None)
                if not g and not s:
                    parents.pop(h, None)
        self._last_access[slot] = new
        if all_host:
            self._not_all_host.discard(slot)
        self._compact()
        return host_lost, gone

    def touch(self, node: str, hashes: Iterable[int], now: float) -> None:
        """Record an access at ``now`` to the blocks of ``hashes`` that ``node`` holds."""
        la = self._last_access[self._slot(node)]
        la.update(zip(filter(la.__contains__, hashes), repeat(now)))

    # -- queries -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._parent)

    def _tiers_of(self, h: int, bit: int) -> Tier:
        g = Tier.GPU if self._gpu.get(h, 0) & bit else Tier(0)
        return g | (Tier.HOST if self._host.get(h, 0) & bit else Tier(0))

    def tiers(self, node: str, block: int) -> Tier:
        """Tiers in which ``node`` holds ``block`` (empty when it does not)."""
        slot = self._slot_of.get(node)
        return Tier(0) if slot is None else self._tiers_of(block, 1 << slot)

    def parent(self, block: int) -> int:
        return self._parent.get(block, ROOT_HASH)

    def holds_all(self, node: str, hashes: Iterable[int]) -> bool:
        return all(map(self._last_access[self._slot(node)].__contains__, hashes))

    def count_held(self, node: str, hashes: Iterable[int]) -> int:
        """How many of ``hashes`` ``node`` holds."""
        return sum(map(self._last_access[self._slot(node)].__contains__, hashes))

    def last_access(self, node: str, block: int) -> float | None:
        return self._last_access[self._slot(node)].get(block)

    def node_blocks(self, node: str) -> Iterator[HeldBlock]:
        """Every block ``node`` holds, with its parent and tiers."""
        slot = self._slot(node)
        bit = 1 << slot
        for h in self._last_access[slot]:
            yield HeldBlock(h, self._parent[h], self._tiers_of(h, bit))

    def node_block_count(self, node: str) -> int:
        return len(self._last_access[self._slot(node)])

    def host_blocks(self, node: str) -> list[tuple[int, float]]:
        """``(hash, last_access)`` of every block ``node`` holds in host memory (a copy)."""
        return list(self.host_access(node).items())

    def host_access(self, node: str) -> Mapping[int, float]:
        """``hash -> last access`` of every block ``node`` holds in host memory: when every block the node
        holds has a host copy, the live table itself (read-only by its type; no copy of a node's index),
        else a new dict."""
        slot = self._slot(node)
        la = self._last_access[slot]
        if slot not in self._not_all_host:
            return la
        bit = 1 << slot
        host = self._host
        return {h: t for h, t in la.items() if host.get(h, 0) & bit}

    def longest_prefixes(self, hashes: Sequence[int]) -> dict[str, PrefixMatch]:
        """Per node holding block 0 of ``hashes``: its longest cached prefix by tier, in one walk."""
        if not self._gpu:
            return self._host_prefixes(hashes)
        gpu_get = self._gpu.get
        host_get = self._host.get
        gpu_depth: dict[int, int] = {}
        host_depth: dict[int, int] = {}
        any_depth: dict[int, int] = {}
        gpu_alive = host_alive = any_alive = self._live  # the first block narrows them
        depth = 0
        prev_g = prev_h = -1  # the previous block's holders (-1: none yet)
        for h in hashes:
            eg = gpu_get(h, 0)
            eh = host_get(h, 0)
            if eg == prev_g and eh == prev_h:  # held where the previous block is: no node leaves
                depth += 1
                continue
            prev_g, prev_h = eg, eh
            g = gpu_alive & eg
            s = host_alive & eh
            a = any_alive & (eg | eh)
            if depth:
                if g != gpu_alive:
                    _record(gpu_alive & ~g, depth, gpu_depth)
                if s != host_alive:
                    _record(host_alive & ~s, depth, host_depth)
                if a != any_alive:
                    _record(any_alive & ~a, depth, any_depth)
            if not a:
                break
            gpu_alive, host_alive, any_alive = g, s, a
            depth += 1
        if depth:
            _record(gpu_alive, depth, gpu_depth)
            _record(host_alive, depth, host_depth)
            _record(any_alive, depth, any_depth)
        names, match = self._name_of, self._match
        return {
            names[slot]: match(gpu_depth.get(slot, 0), host_depth.get(slot, 0), d)
            for slot, d in any_depth.items()
        }

    def _host_prefixes(self, hashes: Sequence[int]) -> dict[str, PrefixMatch]:
        """:meth:`longest_prefixes` while no node holds a block in GPU memory (the simulator's index): every
        prefix is ``(0, d, d)``, so one running AND suffices, and the nodes that leave it at the same
        block share one result."""
        host_get = self._host.get
        alive = self._live
        if not alive:
            return {}
        depth = 0
        drops: list[tuple[int, int]] = []  # (slots leaving at this block, depth)
        prev = -1  # the previous block's holders (-1: none yet)
        for h in hashes:
            e = host_get(h, 0)
            if e == prev:  # held where the previous block is: no node leaves
                depth += 1
                continue
            prev = e
            s = alive & e
            if s != alive:
                if depth:
                    drops.append((alive ^ s, depth))
                alive = s
                if not s:
                    break
            depth += 1
        if alive and depth:
            drops.append((alive, depth))
        out: dict[str, PrefixMatch] = {}
        name = self._name_of.__getitem__
        for mask, d in drops:
            out.update(zip(map(name, _slots(mask)), repeat(self._match(0, d, d))))
        return out

    def _match(self, gpu: int, host: int, local: int) -> PrefixMatch:
        """A shared immutable :class:`PrefixMatch` (building a frozen dataclass costs more than the walk)."""
        key = (gpu, host, local)
        m = self._matches.get(key)
        if m is None:
            if len(self._matches) >= _MATCH_CACHE_SIZE:
                self._matches.clear()
            m = self._matches[key] = PrefixMatch(gpu, host, local)
        return m


def _record(mask: int, depth: int, out: dict[int, int]) -> None:
    out.update(zip(_slots(mask), repeat(depth)))


def _slots(mask: int) -> list[int]:
    """The slots of the bits of ``mask``, ascending."""
    slots = []
    while mask:
        low = mask & -mask
        slots.append(low.bit_length() - 1)
        mask ^= low
    return slots
