"""How fast could CPython simulate the 64-node setting at all? A floor under the per-request cost.

    python -m bench.bench_sim_floor            # the 64-node, 640-agent, 4-minute run of `bench_sim speed`

Runs the real simulation once, recording the KV block path of every routed request, then replays
that request stream through a loop that does only the least work any faithful simulator must do
per request, in plain Python:

- ``events`` heap pushes and pops (issue, prefill start and end, hand-over, decode end, ...);
- one Python step per prefill candidate to pick a node (a comparison, no model);
- ``walks`` passes over the request's blocks, each a dict lookup or store on a per-node table:
  2 is one resolve and one store; the real path walks a request's blocks about 10 times (resolve,
  branch counts on the prefill and the decode node, the release on the previous node, stores and
  access times on both nodes, the GPU caches, the ideal-reuse set).

No queueing, no iteration model, no eviction, no metrics: the figures are upper bounds on the rate
of any simulator in this language over the same requests. They are printed beside the real rate
and the 5,000 simulated requests per second target.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import time
from collections.abc import Iterator

from agentpool.sim.run import Scenario, load_conversations, run_system
from agentpool.sim.simulator import Issue, SimConfig, Simulator

TARGET = 5000.0


@contextlib.contextmanager
def recorded_paths() -> Iterator[list[list[int]]]:
    """Record the block path of every request the simulator routes (a re-route counts again)."""
    paths: list[list[int]] = []
    route = Simulator._route

    def recording(self: Simulator, issue: Issue) -> None:
        paths.append(issue.req.blocks)
        route(self, issue)

    Simulator._route = recording  # type: ignore[method-assign]
    try:
        yield paths
    finally:
        Simulator._route = route  # type: ignore[method-assign]


def floor_seconds(paths: list[list[int]], nodes: int, candidates: int, walks: int, events: int) -> float:
    """Wall seconds of the least per-request work (see the module docstring) over ``paths``."""
    tables: list[dict[int, int]] = [{} for _ in range(nodes)]
    waits = [0.001 * i for i in range(candidates)]
    heap: list[tuple[float, int, list[int]]] = []
    seq = 0
    t = time.perf_counter()
    for i, path in enumerate(paths):
        for _ in range(events):
            seq += 1
            heapq.heappush(heap, (seq * 1e-3, seq, path))
        for _ in range(events):
            heapq.heappop(heap)
        best, pick = 1e30, -1
        for j in range(candidates):
            score = waits[j] + 0.5
            if score < best:
                best, pick = score, j
        table = tables[(i + pick) % nodes]
        get = table.get
        for w in range(walks):
            if w % 2 == 0:
                for b in path:
                    get(b)
            else:
                for b in path:
                    table[b] = i
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=None, help="Claude Code trace (default: the bundled sample)")
    p.add_argument("--repeat", type=int, default=3, help="floor runs; the fastest is kept")
    args = p.parse_args(argv)
    sim = SimConfig(nodes=64, prefill_nodes=40)
    sc = Scenario(trace=args.trace, agents=640, warmup_s=0.0, duration_s=240.0, sim=sim)
    convs = load_conversations(sc)
    with recorded_paths() as paths:
        r = run_system("agentpool", sc, convs)
    real = r["requests_simulated"] / r["wall_s"]
    blocks = sum(map(len, paths)) / max(1, len(paths))
    print(
        f"64 nodes, 640 agents, 4 min: {r['requests_simulated']} requests completed, {len(paths)} routed "
        f"({blocks:.0f} blocks of {sim.block_size} tokens each on average) in {r['wall_s']:.1f} s: "
        f"{real:.0f} simulated requests per wall second ({real / TARGET:.2f}x of {TARGET:.0f})"
    )
    for walks in (2, 10):
        best = min(
            floor_seconds(paths, sim.nodes, sim.prefill_nodes, walks, events=6) for _ in range(args.repeat)
        )
        rate = len(paths) / best
        print(
            f"floor, {walks} walks over each path, 6 events, {sim.prefill_nodes} candidates: "
            f"{rate:.0f} requests per wall second ({rate / TARGET:.2f}x of {TARGET:.0f}; "
            f"the real run is {rate / real:.1f}x slower)"
        )


if __name__ == "__main__":
    main()
