"""Pure KV cores: hashing speed, index ingest rate, resolve latency, memory per million blocks.

    python -m bench.bench_kv [--blocks 1000000] [--nodes 64] [--prompt 2000]

Targets (issue 3): hashing >= 5M tokens/s; ingest >= 200k block events/s; resolve p99 <= 2 ms for a
2,000-block prompt over 64 nodes with 1M blocks indexed. Each figure is printed next to a naive
baseline measured in the same run (per-token hashing; a dict-of-sets index walked node by node).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc

import numpy as np
import xxhash

from agentpool.kv import PrefixIndex, Tier
from agentpool.kv.hashing import ROOT_HASH, block_hashes


def naive_hashes(tokens: list[int], page: int) -> list[int]:
    out, h = [], ROOT_HASH
    for i in range(len(tokens) // page):
        payload = h.to_bytes(8, "little") + b"".join(
            t.to_bytes(4, "little") for t in tokens[i * page : (i + 1) * page]
        )
        h = xxhash.xxh3_64_intdigest(payload)
        out.append(h)
    return out


def bench_hashing(n_tokens: int) -> None:
    toks = np.random.default_rng(0).integers(0, 150_000, n_tokens, dtype=np.uint32)
    t0 = time.perf_counter()
    block_hashes(toks, 64)
    fast = n_tokens / (time.perf_counter() - t0)
    as_list = toks[: n_tokens // 10].tolist()
    t0 = time.perf_counter()
    block_hashes(as_list, 64)
    from_list = len(as_list) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    naive_hashes(as_list, 64)
    naive = len(as_list) / (time.perf_counter() - t0)
    print(
        f"hashing: {fast / 1e6:.1f}M tokens/s from a uint32 array, {from_list / 1e6:.1f}M tokens/s from a "
        f"list (target >= 5M); naive per-token baseline {naive / 1e6:.2f}M tokens/s ({fast / naive:.0f}x)"
    )


class NaiveIndex:
    """Baseline: block -> set of nodes, resolve walks each node separately."""

    def __init__(self) -> None:
        self.held: dict[int, set[str]] = {}

    def stored(self, node: str, hashes: list[int]) -> None:
        for h in hashes:
            self.held.setdefault(h, set()).add(node)

    def resolve(self, hashes: list[int], nodes: list[str]) -> dict[str, int]:
        out = {}
        for n in nodes:
            d = 0
            for h in hashes:
                s = self.held.get(h)
                if s is None or n not in s:
                    break
                d += 1
            if d:
                out[n] = d
        return out


def build(
    n_blocks: int, n_nodes: int, prompt: int, per_event: int, seed: int = 1
) -> tuple[PrefixIndex, list[int], float, int]:
    """Index with ``n_blocks`` blocks: a shared ``prompt``-block chain held to random depths by every
    node, plus random agent chains filling the rest. Returns (index, prompt chain, seconds, block events)."""
    rng = random.Random(seed)
    nodes = [f"node-{i}" for i in range(n_nodes)]
    prompt_chain = [rng.getrandbits(64) | 1 for _ in range(prompt)]
    events: list[tuple[str, int, list[int], Tier]] = []
    for n in nodes:
        depth = rng.randint(prompt // 2, prompt)
        for i in range(0, depth, per_event):
            events.append(
                (
                    n,
                    prompt_chain[i - 1] if i else ROOT_HASH,
                    prompt_chain[i : min(i + per_event, depth)],
                    Tier.GPU | Tier.HOST if rng.random() < 0.5 else Tier.HOST,
                )
            )
    total = len(set(prompt_chain))
    while total < n_blocks:
        n = rng.choice(nodes)
        start = rng.randrange(prompt // 4)
        chain = [rng.getrandbits(64) | 1 for _ in range(min(per_event, n_blocks - total))]
        events.append((n, prompt_chain[start], chain, Tier.GPU if rng.random() < 0.5 else Tier.HOST))
        total += len(chain)
    idx = PrefixIndex()
    n_events = sum(len(e[2]) for e in events)
    t0 = time.perf_counter()
    for node, parent, chain, tier in events:
        idx.apply_stored(node, parent, chain, tier, 1.0)
    return idx, prompt_chain, time.perf_counter() - t0, n_events


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if len(xs) > 1 else xs[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blocks", type=int, default=1_000_000)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=2000)
    ap.add_argument("--per-event", type=int, default=32, help="blocks per stored event")
    ap.add_argument("--resolves", type=int, default=300)
    a = ap.parse_args()

    bench_hashing(4_000_000)

    idx, prompt_chain, secs, n_events = build(a.blocks, a.nodes, a.prompt, a.per_event)
    print(
        f"ingest: {n_events / secs / 1e3:.0f}k block events/s "
        f"({n_events / a.per_event / secs / 1e3:.1f}k stored "
        f"messages/s of {a.per_event} blocks; {len(idx):,} blocks over {a.nodes} nodes in {secs:.1f}s; "
        f"target >= 200k/s)"
    )

    lat, cpu = [], []
    for _ in range(a.resolves):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        got = idx.longest_prefixes(prompt_chain)
        lat.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    naive = NaiveIndex()  # built after the measurement: its million sets would add GC pauses to ours
    nodes = idx.nodes()
    for n in nodes:
        naive.stored(n, [b.block_hash for b in idx.node_blocks(n)])
    t0 = time.perf_counter()
    reps = max(3, a.resolves // 30)
    for _ in range(reps):
        base = naive.resolve(prompt_chain, nodes)
    naive_ms = (time.perf_counter() - t0) / reps * 1e3
    assert base == {n: m.local_blocks for n, m in got.items()}, "index disagrees with the naive baseline"
    ms = [x * 1e3 for x in lat]
    cpu_ms = [x * 1e3 for x in cpu]
    print(
        f"resolve ({a.prompt}-block prompt, {len(got)} nodes matching, {len(idx):,} blocks): "
        f"p50 {pct(ms, 50):.3f} ms, p99 {pct(ms, 99):.3f} ms (target p99 <= 2 ms); naive per-node walk "
        f"{naive_ms:.2f} ms ({naive_ms / pct(ms, 50):.0f}x slower)"
    )
    print(
        f"resolve CPU time (excludes waiting for a core on a shared machine): p50 {pct(cpu_ms, 50):.3f} ms, "
        f"p99 {pct(cpu_ms, 99):.3f} ms"
    )
    del idx, naive

    n_mem = 200_000
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    small, _, _, _ = build(n_mem, 1, 16, a.per_event, seed=2)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    print(
        f"memory: {used / len(small) * 1e6 / 2**30:.2f} GiB per million blocks (one node per block, "
        f"measured on {len(small):,} blocks with tracemalloc)"
    )


if __name__ == "__main__":
    main()
