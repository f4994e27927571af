"""agentpool's per-node online fit against the ground truth, node by node.

    python -m bench.bench_sim_fit_nodes            # 9 nodes (6P3D), 126 agents at the paper's load
    python -m bench.bench_sim_fit_nodes 64 2560    # D.2's pool (24P40D), 5 min ramp

Runs agentpool through its first planner window (10 min, when the fit happens) and prints each
node's fitted models' error against the noiseless roofline truth on the grid of
:mod:`agentpool.sim.fiterror`, and which records each phase was fitted on (the node's own, or
every node's for a phase the node never ran).
"""

from __future__ import annotations

import sys
import time

from agentpool.sim.run import Scenario, run_system
from agentpool.sim.simulator import SimConfig


def main(argv: list[str]) -> int:
    nodes = int(argv[0]) if argv else 9
    agents = int(argv[1]) if len(argv) > 1 else 126
    prefill = 6 if nodes == 9 else round(nodes * 24 / 64)
    sc = Scenario(
        agents=agents,
        warmup_s=600,
        duration_s=60,
        max_pause_s=60 if nodes == 9 else None,
        ramp_s=0 if nodes == 9 else 300,
        static_prefill_nodes=prefill,
        sim=SimConfig(nodes=nodes, prefill_nodes=prefill),
    )
    cpu = time.process_time()
    r = run_system("agentpool", sc)
    fits = [e for e in r["planner_log"] if e["outcome"] == "fit" and "per_node" in e]
    if not fits:
        print("no planner window fitted the models")
        return 1
    fit = fits[0]
    print(
        f"{nodes} nodes ({prefill}P{nodes - prefill}D), {agents} agents; "
        f"{time.process_time() - cpu:.0f} s CPU"
    )
    print(f"{fit['error_vs_truth']}\n{fit['reason']}\n")
    print(
        "| node | prefill records | prefill error mean (max) | batches | decode records "
        "| decode error mean (max) |"
    )
    print("|---|---|---|---|---|---|")
    for e in fit["per_node"]:
        print(
            f"| {e['node']} | {e['prefill_records']} | "
            f"{100 * e['prefill_mean']:.1f}% ({100 * e['prefill_max']:.1f}%) "
            f"| {100 * e['prefill_batch_mean']:.1f}% | {e['decode_records']} | "
            f"{100 * e['decode_mean']:.1f}% ({100 * e['decode_max']:.1f}%) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
