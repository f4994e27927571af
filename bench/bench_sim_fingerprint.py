"""Fingerprint of fixed simulator runs: a pure speedup must leave every number unchanged.

    python -m bench.bench_sim_fingerprint                # 7 runs: 5 systems at 9 nodes, 64 nodes, colocated
    python -m bench.bench_sim_fingerprint agentpool      # agentpool at 9 and 64 nodes, smetric colocated

Prints one sha256 (16 hex digits) per run, over the JSON of its whole result without the wall times,
and one over all of them. Run it on the tree before and after a change (same seed: same numbers).
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

from agentpool.sim.run import Scenario, load_conversations, run_system
from agentpool.sim.simulator import SimConfig
from agentpool.sim.systems import DISAGGREGATED_DEFAULT


def fingerprint(result: dict[str, Any]) -> str:
    kept = {k: v for k, v in result.items() if k not in ("wall_s", "sim_requests_per_wall_s")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=float).encode()).hexdigest()[:16]


def main(argv: list[str]) -> int:
    base = Scenario(agents=90, warmup_s=600, duration_s=1200, max_pause_s=60)
    convs = load_conversations(base)
    systems = argv[0].split(",") if argv else list(DISAGGREGATED_DEFAULT)
    runs: list[tuple[str, Scenario]] = [(name, base) for name in systems]
    runs.append(
        (
            "agentpool",
            Scenario(
                agents=640,
                warmup_s=0,
                duration_s=300,
                ramp_s=60,
                static_prefill_nodes=24,
                sim=SimConfig(nodes=64, prefill_nodes=24),
            ),
        )
    )
    runs.append(
        (
            "smetric",
            Scenario(
                agents=160,
                preset="qwen3-30b-a3b-h200",
                warmup_s=300,
                duration_s=600,
                max_pause_s=60,
                sim=SimConfig(nodes=16, prefill_nodes=0),
            ),
        )
    )
    total = hashlib.sha256()
    capped = load_conversations(runs[-1][1])  # the H200 preset's context ends long conversations
    for name, sc in runs:
        r = run_system(name, sc, capped if sc.preset != base.preset else convs)
        h = fingerprint(r)
        total.update(h.encode())
        print(f"{name} {sc.sim.nodes} nodes: {r['requests_simulated']} requests, {h}", flush=True)
    print(f"TOTAL {total.hexdigest()[:16]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
