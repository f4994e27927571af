"""Prefix index: which node holds which KV block, in which tier, last accessed when.

Blocks are keyed by their chained hash (:func:`agentpool.kv.hashing.block_hashes`), so a block's hash
already names its whole prefix and the index is a tree through the ``parent`` link of each entry.
Per block the index keeps its parent hash and its holders, one int of two bits per node slot (bit 2s:
slot s holds a host copy, bit 2s + 1: a GPU copy); per node it keeps ``hash -> last access`` of every
block it holds. A resolve walks the request's hashes once: one dict lookup and one compare per block
where the holders are those of the block before, a few integer ANDs where they change, whatever the
node count; and no lookup for the blocks of a run that an earlier walk went through and that no
change touched since (:class:`agentpool.kv.shards.Runs`: a repeated Resolve of the benchmark's
2,000-block prompt over 64 nodes looks up 146 of its blocks). The tables are dicts of ints and
floats, which CPython's garbage collector does not track, so a million indexed blocks add no GC
pauses to resolves.

Memory (``python -m bench.bench_kv``, CPython 3.11, tracemalloc): about 0.18 GiB per million blocks
held by one node each (entry object, index dict slot, the node's last-access slot, int keys and float
values); every further node holding a block adds one slot in that node's last-access dict. The tables
alone (tracemalloc, the hash ints not counted), a million blocks on one node: 0.101 GiB, against 0.117
(host copies) and 0.156 GiB (GPU and host copies) with unsharded separate GPU and host tables.

Every table keyed by block hash is sharded (:mod:`agentpool.kv.shards`): a million-block resync then
grows many small dicts instead of one big one, and no single table rebuild stalls the caller for long.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from itertools import chain, compress, islice

from agentpool.kv.index_tables import IndexTables, both_bits_of, gpu_bit_of, host_bit_of
from agentpool.kv.shards import (
    SHARDS,
    new_shards,
    shard_keys,
    total,
)
from agentpool.kv.steps import STEP_BLOCKS, drain
from agentpool.kv.types import HeldBlock, InvalidEventError, Tier, split_blocks

Steps = Generator[None, None, tuple[list[int], list[int]]]
_GPU, _HOST = int(Tier.GPU), int(Tier.HOST)
_ALL_TIERS = _GPU | _HOST


class PrefixIndex(IndexTables):
    """Event-built index of KV block placement over nodes and tiers. Pure: time is passed in."""

    # -- nodes -------------------------------------------------------------------------------
    def drop_node(self, node: str) -> list[int]:
        """Forget ``node`` and every placement it had; returns the hashes it held."""
        held = list(chain.from_iterable(self._last_access[self._slot(node)]))
        for _ in self.drop_node_steps(node):
            pass
        return held

    def drop_node_steps(self, node: str, step: int = STEP_BLOCKS) -> Generator[None, None, None]:
        """:meth:`drop_node` in steps of ``step`` blocks (a generator: the caller may run other work
        between steps). The node leaves every answer before the first step; its slot is reused only
        once its bits are cleared."""
        slot = self._slot(node)
        self._note_size()
        del self._slot_of[node]
        del self._name_of[slot]
        self._live &= ~host_bit_of(slot)
        left = [la for la in self._last_access.pop(slot) if la]
        keep = ~both_bits_of(slot)
        hold, parents = self._hold, self._parent
        was, kept = -1, -1  # the last holders changed and what they became (see _hold)
        forget = self._runs.forget
        while left:  # emptied as it goes, a shard freed when empty: no big deallocation at the end
            yield
            forget(was)  # runs a walk remembered meanwhile of the holders the next blocks may have
            budget = step
            while budget and left:
                la = left[-1]
                for _ in range(min(budget, len(la))):
                    h = la.popitem()[0]
                    k = h % SHARDS
                    hk = hold[k]
                    v = hk.get(h, 0)
                    if v is not was:
                        forget(v)
                        was, kept = v, v & keep
                    v = kept
                    if v:
                        hk[h] = v
                    else:
                        hk.pop(h, None)
                        parents[k].pop(h, None)
                    budget -= 1
                if not la:
                    left.pop()
        self._not_all_host.discard(slot)
        self._free_slots.append(slot)
        yield from self._compact_steps()

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
        las = self._last_access[slot]
        setdefault = self._parent_setdefault
        hold_get = self._hold_get
        if not t & _HOST:
            self._not_all_host.add(slot)
        prev = parent
        if t == _HOST and slot not in self._not_all_host:
            # Host-only stores on a node whose held blocks all have a host copy (the simulator's
            # write-through): a block the node already holds needs only its access time.
            bit = host_bit_of(slot)
            hold = self._hold
            was, now_held = -1, -1  # the last holders changed and what they became (see _hold)
            forget = self._runs.forget
            for h in hashes:
                k = h % SHARDS
                if setdefault[k](h, prev) != prev:
                    self._link(h, prev)  # raises
                la = las[k]
                if h not in la:
                    v = hold_get[k](h, 0)
                    if v is not was:
                        forget(v)
                        was, now_held = v, v | bit
                    hold[k][h] = now_held
                la[h] = now
                prev = h
            return
        bits = (host_bit_of(slot) if t & _HOST else 0) | (gpu_bit_of(slot) if t & _GPU else 0)
        was, now_held = -1, -1  # the last holders changed and what they became (see _hold)
        forget = self._runs.forget
        for h in hashes:
            k = h % SHARDS
            if setdefault[k](h, prev) != prev:
                self._link(h, prev)  # raises
            v = hold_get[k](h, 0)
            if v is not was:
                forget(v)
                was, now_held = v, v | bits
            self._hold[k][h] = now_held
            las[k][h] = now
            prev = h

    def apply_removed(self, node: str, hashes: Iterable[int], tier: Tier) -> list[int]:
        """``node`` dropped ``hashes`` from ``tier``; returns the hashes it no longer holds in any tier.

        Removing a block the node does not hold is a no-op (engines may repeat removals).
        """
        return self.remove(node, hashes, tier)[1]

    def remove(self, node: str, hashes: Iterable[int], tier: Tier) -> tuple[list[int], list[int]]:
        """``node`` dropped ``hashes`` from ``tier``. Returns ``(host_lost, gone)``: the hashes whose host
        copy this removed, and the hashes the node no longer holds in any tier (the same list object
        when they are the same blocks in the same order)."""
        slot = self._slot(node)
        las = self._last_access[slot]
        gpu_t = bool(tier & Tier.GPU)  # plain bools: Tier operations are slow in the loop
        host_t = bool(tier & Tier.HOST)
        hashes = list(hashes)
        keys = shard_keys(hashes)
        held = list(map(dict.__contains__, map(las.__getitem__, keys), hashes))
        if not any(held):
            return [], []
        self._note_size()
        chosen = zip(compress(hashes, held), compress(keys, held), strict=True)
        if host_t and not gpu_t and slot not in self._not_all_host:
            host_lost, gone = self._remove_host_copies(slot, chosen)
        else:
            host_lost, gone = self._remove_general(slot, chosen, gpu_t, host_t)
        if gone:
            self._compact()
        return host_lost, gone

    def _remove_host_copies(
        self, slot: int, chosen: Iterable[tuple[int, int]]
    ) -> tuple[list[int], list[int]]:
        """:meth:`remove` of host copies on ``slot`` while each of its blocks has one (``chosen``: the
        held blocks and their shards): every block listed loses its host copy, and leaves the node
        unless it has a GPU copy there."""
        host_bit, gpu_bit = host_bit_of(slot), gpu_bit_of(slot)
        las, hold, parents = self._last_access[slot], self._hold, self._parent
        host_lost: list[int] = []
        kept: list[int] = []  # blocks whose GPU copy stays
        forget, was = self._runs.forget, -1
        for h, k in chosen:
            hk = hold[k]
            v = hk.get(h, 0)
            if not v & host_bit:  # listed twice: removed already
                continue
            if v is not was:
                forget(v)
                was = v
            host_lost.append(h)
            v ^= host_bit
            if v & gpu_bit:
                hk[h] = v
                kept.append(h)
                continue
            if v:
                hk[h] = v
            else:
                del hk[h]
                del parents[k][h]
            del las[k][h]
        if not kept:
            return host_lost, host_lost
        self._not_all_host.add(slot)
        stay = set(kept)
        return host_lost, [h for h in host_lost if h not in stay]

    def _remove_general(
        self, slot: int, chosen: Iterable[tuple[int, int]], gpu_t: bool, host_t: bool
    ) -> tuple[list[int], list[int]]:
        host_bit, gpu_bit = host_bit_of(slot), gpu_bit_of(slot)
        las, hold, parents = self._last_access[slot], self._hold, self._parent
        host_lost: list[int] = []
        gone: list[int] = []
        forget, was = self._runs.forget, -1
        for h, k in chosen:
            la = las[k]
            if h not in la:  # listed twice
                continue
            hk = hold[k]
            v = hk.get(h, 0)
            if v is not was:
                forget(v)
                was = v
            if gpu_t:
                v &= ~gpu_bit
            if host_t and v & host_bit:
                host_lost.append(h)
                if v & gpu_bit:
                    self._not_all_host.add(slot)
                v &= ~host_bit
            if v:
                hk[h] = v
            else:
                hk.pop(h, None)
                del parents[k][h]
            if not v & (host_bit | gpu_bit):
                del la[h]
                gone.append(h)
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
        new: list[dict[int, float]] = new_shards()  # the node's last-access table after the resync
        unlisted: set[int] = set()  # parents not listed before their child (fine unless listed later)
        for i in range(0, n, step):
            yield
            part = hashes[i : i + step]
            for h, k, p, t in zip(
                part, shard_keys(part), parents_of[i : i + step], tiers[i : i + step], strict=True
            ):
                if not t:
                    continue
                nk = new[k]
                if h in nk:
                    raise InvalidEventError(f"resync block {h:#x} is listed twice")
                known = parents[k].get(h)
                if known is not None and known != p:
                    self._link(h, p)  # raises
                if p and p not in new[p % SHARDS]:
                    unlisted.add(p)
                nk[h] = now
        late = {p for p in unlisted if p in new[p % SHARDS]}
        if late:
            child = next(i for i, p in enumerate(parents_of) if p in late and tiers[i])
            raise InvalidEventError(
                f"resync block {hashes[child]:#x} comes before its parent {parents_of[child]:#x}: "
                "list parents before children"
            )
        self.add_node(node)
        slot = self._slot_of[node]
        host_bit, gpu_bit = host_bit_of(slot), gpu_bit_of(slot)
        keep = ~(host_bit | gpu_bit)
        self._not_all_host.add(slot)  # "may hold a block without a host copy" is safe meanwhile
        old = self._last_access[slot]
        all_host = True
        hold = self._hold
        host_lost: list[int] = []
        was, was_tier, w, lost = -1, -1, -1, False  # the last holders changed, how, and the outcome
        forget = self._runs.forget
        for i in range(0, n, step):
            yield
            forget(was)  # runs a walk remembered meanwhile of the holders the next blocks may have
            if self._slot_of.get(node) != slot:
                raise InvalidEventError(f"node {node!r} was dropped during its resync")
            part = hashes[i : i + step]
            for h, k, p, t in zip(
                part, shard_keys(part), parents_of[i : i + step], tiers[i : i + step], strict=True
            ):
                if not t:
                    continue
                parents[k].setdefault(h, p)
                hk = hold[k]
                v = hk.get(h, 0)
                if v is not was or t != was_tier:
                    if v is not was:
                        forget(v)
                    was, was_tier, lost = v, t, False
                    w = v | gpu_bit if t & _GPU else v & ~gpu_bit  # a GPU copy held before may be gone
                    if t & _HOST:
                        w |= host_bit
                    else:
                        all_host = False
                        if v & host_bit:  # the host copy is gone (E.2 line 20)
                            lost = True
                            w &= ~host_bit
                if lost:
                    host_lost.append(h)
                hk[h] = w  # never 0: t names a tier
        self._note_size()
        gone: list[int] = []
        before = chain.from_iterable(old)  # not resized meanwhile: the node's other changes are kept out
        was, kept = -1, -1
        for _ in range(0, total(old), step):
            yield
            forget(was)  # runs a walk remembered meanwhile of the holders the next blocks may have
            for h in islice(before, step):
                k = h % SHARDS
                if h in new[k]:
                    continue
                gone.append(h)
                hk = hold[k]
                v = hk.get(h, 0)
                if v & host_bit:
                    host_lost.append(h)
                if v is not was:
                    forget(v)
                    was, kept = v, v & keep
                v = kept
                if v:
                    hk[h] = v
                else:
                    hk.pop(h, None)
                    parents[k].pop(h, None)
        self._last_access[slot] = new
        if all_host:
            self._not_all_host.discard(slot)
        yield from self._compact_steps()
        return host_lost, gone

    def touch(self, node: str, hashes: Iterable[int], now: float) -> None:
        """Record an access at ``now`` to the blocks of ``hashes`` that ``node`` holds."""
        las = self._last_access[self._slot(node)]
        for h in hashes:
            la = las[h % SHARDS]
            if h in la:
                la[h] = now
