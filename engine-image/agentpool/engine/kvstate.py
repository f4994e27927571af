"""Which KV blocks this node holds in which tier, and the KV events that tell the directory.

:class:`KvLedger` owns the node's two tiers as the ``sim`` backend drives them: the GPU tier is the
node model's LRU (:class:`agentpool.node.GpuCache`), the host tier the NIXL-registered
:class:`HostPool`. Every computed block is written through to both; every change becomes a KV event
(``stored``/``removed`` per tier) on a :class:`KvEventSink` (the directory link, or nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agentpool.engine.hostpool import HostPool
from agentpool.kv import ROOT_HASH, HeldBlock, Tier
from agentpool.node import GpuCache


class KvEventSink(Protocol):
    def stored(self, parent: int, hashes: Sequence[int], tier: Tier) -> None: ...

    def removed(self, hashes: Sequence[int], tier: Tier) -> None: ...


class NoSink:
    """No directory configured: events go nowhere."""

    def stored(self, parent: int, hashes: Sequence[int], tier: Tier) -> None:
        pass

    def removed(self, hashes: Sequence[int], tier: Tier) -> None:
        pass


def chain_runs(hashes: Sequence[int], parent_of: dict[int, int]) -> list[tuple[int, list[int]]]:
    """Split ``hashes`` (in path order) into runs each a chain: ``(parent of the first, run)``."""
    runs: list[tuple[int, list[int]]] = []
    for h in hashes:
        p = parent_of[h]
        if runs and runs[-1][1][-1] == p:
            runs[-1][1].append(h)
        else:
            runs.append((p, [h]))
    return runs


class KvLedger:
    def __init__(self, gpu: GpuCache, pool: HostPool, sink: KvEventSink) -> None:
        self.gpu = gpu
        self.pool = pool
        self.sink = sink
        self.parent_of: dict[int, int] = {}  # every block held in some tier

    def gpu_prefix(self, hashes: Sequence[int]) -> int:
        return self.gpu.prefix(hashes)

    def local_prefix(self, hashes: Sequence[int]) -> int:
        """Leading blocks held in GPU or host memory."""
        n = 0
        for h in hashes:
            if h not in self.gpu and h not in self.pool:
                break
            n += 1
        return n

    def computed(self, hashes: Sequence[int], now: float, parent: int = ROOT_HASH) -> None:
        """A prefill produced (or loaded into the GPU) the path ``hashes``: write it through."""
        if not hashes:
            return
        p = parent
        for h in hashes:
            self.parent_of.setdefault(h, p)
            p = h
        gpu_evicted = self.gpu.touch(hashes)
        self.sink.stored(parent, hashes, Tier.GPU)
        stored, host_evicted = self.pool.store_generated(parent, hashes, now)
        for run_parent, run in chain_runs(stored, self.parent_of):
            self.sink.stored(run_parent, run, Tier.HOST)
        self._removed(gpu_evicted, Tier.GPU)
        self._removed(host_evicted, Tier.HOST)

    def fetched(self, hashes: Sequence[int], evicted: Sequence[int] = ()) -> None:
        """Blocks read from a peer are now in the host pool (``evicted``: what made room)."""
        new = [h for h in hashes if h in self.pool]
        for h in new:
            self.parent_of.setdefault(h, self.pool.parent_of[h])
        for run_parent, run in chain_runs(new, self.parent_of):
            self.sink.stored(run_parent, run, Tier.HOST)
        self._removed(evicted, Tier.HOST)

    def evicted_host(self, hashes: Sequence[int]) -> None:
        self._removed(hashes, Tier.HOST)

    def _removed(self, hashes: Sequence[int], tier: Tier) -> None:
        if not hashes:
            return
        self.sink.removed(hashes, tier)
        for h in hashes:
            if h not in self.gpu and h not in self.pool:
                self.parent_of.pop(h, None)

    def held_blocks(self) -> list[HeldBlock]:
        """Every block with its tiers, parents before children (a resync)."""
        out: list[HeldBlock] = []
        seen: set[int] = set()
        for h in list(self.parent_of):
            chain: list[int] = []
            x = h
            while x in self.parent_of and x not in seen:
                seen.add(x)
                chain.append(x)
                x = self.parent_of[x]
            for b in reversed(chain):
                tiers = Tier(0)
                if b in self.gpu:
                    tiers |= Tier.GPU
                if b in self.pool:
                    tiers |= Tier.HOST
                if tiers:
                    out.append(HeldBlock(b, self.parent_of[b], tiers))
        return out
