"""CPU per simulated request in a steady-state window of the App. D.2 shape, optionally profiled.

    python -m bench.bench_sim_window                       # 64 nodes, 15 + 2 min, window from minute 14
    python -m bench.bench_sim_window --nodes 768 --warmup 600 --duration 120 --start 11
    python -m bench.bench_sim_window --profile /tmp/d2.prof --duration 60   # cProfile of the window
    python -m bench.bench_sim_window --block-tokens 1024                # D.2's shape at 1,024-token blocks

``bench_sim scale``'s scenario (10 agents per GPU, 24/64 of the nodes prefilling, 5 min ramp),
agentpool only. The whole run is slow to reach full load (the ramp and the first planner windows
are cheap), so the figure that compares two trees is the CPU time (``time.process_time``, not wall:
the machine is shared) per request completed in the window from simulated minute ``--start`` to
the end. Prints the result's fingerprint (:mod:`bench.bench_sim_fingerprint`): two trees that
differ only in speed must print the same one.
"""

from __future__ import annotations

import argparse
import cProfile
import time

from agentpool.sim.presets import preset
from agentpool.sim.run import Scenario, load_conversations, run_system
from agentpool.sim.simulator import SimConfig
from bench.bench_sim_fingerprint import fingerprint
from bench.sim_tables import block_tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_sim_window")
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--warmup", type=float, default=900.0)
    p.add_argument("--duration", type=float, default=120.0)
    p.add_argument("--ramp", type=float, default=300.0)
    p.add_argument("--start", type=int, default=14, help="first simulated minute of the window")
    p.add_argument("--block-tokens", type=int, default=512, help="KV block size of the simulation (tokens)")
    p.add_argument("--profile", default=None, help="write a cProfile (CPU clock) of the window here")
    args = p.parse_args(argv)
    block_tokens(p, args.block_tokens)
    prefill = round(args.nodes * 24 / 64)
    gpus = preset(Scenario().preset).truth.hardware.gpus
    sc = Scenario(
        agents=10 * gpus * args.nodes,
        warmup_s=args.warmup,
        duration_s=args.duration,
        ramp_s=args.ramp,
        static_prefill_nodes=prefill,
        sim=SimConfig(nodes=args.nodes, prefill_nodes=prefill, block_size=args.block_tokens),
    )
    convs = load_conversations(sc)
    end = sc.warmup_s + sc.duration_s
    last = int(end // 60)
    if not 0 < args.start < last:
        p.error(f"--start must be within 1..{last - 1}")
    prof = cProfile.Profile(time.process_time) if args.profile else None
    cpu_at: dict[int, float] = {}
    c0 = time.process_time()

    def progress(done: float) -> None:
        minute = round(done * end / 60.0)
        cpu_at[minute] = time.process_time() - c0
        print(f"  minute {minute}: {cpu_at[minute]:.1f} s CPU", flush=True)
        if prof is not None and minute == args.start:
            prof.enable()

    r = run_system("agentpool", sc, convs, progress=progress)
    cpu = time.process_time() - c0
    if prof is not None:
        prof.disable()
        prof.dump_stats(args.profile)
    done = r["completed_per_minute"][args.start : last]
    window_cpu = cpu - cpu_at[args.start]
    print(
        f"{args.nodes} nodes, {sc.agents} agents, {end / 60:g} min: {r['requests_simulated']} requests, "
        f"{cpu:.1f} s CPU; window minutes {args.start}-{last}: {sum(done)} requests, {window_cpu:.1f} s CPU, "
        f"{1000 * window_cpu / max(1, sum(done)):.2f} ms per request; fingerprint {fingerprint(r)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
