"""Tables and result files of the simulator benchmarks (``bench_sim``): mean and spread over seeds per
system, the colocated sweep's curve, the loop that runs one comparison once per seed, and the writers
of ``bench/results/sim_*.md`` and their JSON."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentpool.sim.cli import compare
from agentpool.sim.report import markdown_table
from agentpool.sim.run import (
    Scenario,
    best_reference,
    load_conversations,
    reference_runs,
    scenario_bound,
    scenario_dict,
)

RESULTS = Path(__file__).resolve().parent / "results"

BySeed = dict[int, list[dict[str, Any]]]  # seed -> the comparison's results
Bounds = dict[int, float | None]  # seed -> the analytic closed-loop bound (req/s), where one applies


def over_seeds(
    scenario: Callable[[int], Scenario], systems: Sequence[str], seeds: Sequence[int], jobs: int, label: str
) -> tuple[BySeed, Bounds]:
    """Run ``systems`` on ``scenario(seed)`` for every seed; the static reference's sweep folded into
    its best split; the bound of each seed's scenario (None where none applies)."""
    by_seed: BySeed = {}
    bounds: Bounds = {}
    for seed in seeds:
        sc = scenario(seed)
        convs = load_conversations(sc)
        runs = compare(
            sc, reference_runs(list(systems), sc.sim.nodes), quiet=True, jobs=jobs, conversations=convs
        )
        by_seed[seed] = best_reference(runs)
        b = scenario_bound(sc, convs)
        bounds[seed] = None if b is None else b.throughput_rps
        print(f"{label}, seed {seed}: done", flush=True)
    return by_seed, bounds


def slim(by_seed: BySeed) -> dict[str, list[dict[str, Any]]]:
    """``by_seed`` for JSON: keys as strings, without the per-request TTFT samples."""
    return {
        str(s): [{k: v for k, v in r.items() if k != "ttft_samples"} for r in rs] for s, rs in by_seed.items()
    }


def seed_table(by_seed: dict[int, list[dict[str, Any]]], bounds: dict[int, float | None]) -> str:
    """Mean and spread (min-max) over seeds of each system's key figures, and the bound."""
    seeds = sorted(by_seed)
    names = [r["system"] for r in by_seed[seeds[0]]]
    head = (
        "| system | req/s mean (min-max) | of bound | TTFT p95 s | E2E mean s | lost reuse | final splits |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]

    def vals(name: str, get: Any) -> list[float]:
        return [float(get(next(r for r in by_seed[s] if r["system"] == name)["summary"])) for s in seeds]

    for name in names:
        x = vals(name, lambda m: m["throughput_rps"])
        share = [v / b for v, b in zip(x, (bounds[s] for s in seeds), strict=True) if b]
        p95 = vals(name, lambda m: m["ttft_s"]["p95"])
        e2e = vals(name, lambda m: m["e2e_s"]["mean"])
        lost = vals(name, lambda m: m["lost_kv_reuse"])
        splits = []
        for s in seeds:
            sp = next(r for r in by_seed[s] if r["system"] == name)["summary"]["final_split"]
            splits.append(f"{sp[0]}P{sp[1]}D" if sp else "-")
        lines.append(
            f"| {name} | {sum(x) / len(x):.3f} ({min(x):.3f}-{max(x):.3f}) | "
            + (f"{sum(share) / len(share):.0%}" if share else "-")
            + f" | {sum(p95) / len(p95):.1f} ({min(p95):.1f}-{max(p95):.1f}) | {sum(e2e) / len(e2e):.2f} | "
            f"{sum(lost) / len(lost):.2%} | {' '.join(splits)} |"
        )
    known = [b for b in bounds.values() if b]
    bound = f"bound {sum(known) / len(known):.3f} req/s (mean over seeds)" if known else "no bound"
    return "\n".join(lines) + f"\n\nSeeds {', '.join(map(str, seeds))}; {bound}.\n"


def _mean_range(xs: list[float], fmt: str) -> str:
    return f"{fmt.format(sum(xs) / len(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


Runs = dict[tuple[str, int, int], dict[str, Any]]  # (system, agents, seed) -> run


def sweep_table(runs: Runs, systems: list[str], levels: list[int]) -> str:
    """Per policy and load level: TPS within SLO (mean and min-max over seeds), its peak level, and
    at each level the lost KV reuse and mean TPOT (means over seeds)."""
    seeds = sorted({k[2] for k in runs})

    def vals(name: str, level: int, get: Any) -> list[float]:
        return [float(get(runs[(name, level, s)]["summary"])) for s in seeds]

    head = "| policy | " + " | ".join(f"{a} agents" for a in levels) + " | peak |"
    lines = [head, "|---|" + "---|" * (len(levels) + 1)]
    for name in systems:
        tps = {a: vals(name, a, lambda m: m["tps_within_slo"]) for a in levels}
        peak = max(levels, key=lambda a: sum(tps[a]))
        cells = [_mean_range(tps[a], "{:.0f}") for a in levels]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {peak} agents |")
    lines += ["", "Lost KV reuse / mean TPOT ms / SLO attainment at each level (means over seeds):", ""]
    lines += [head.replace(" peak |", ""), "|---|" + "---|" * len(levels)]
    for name in systems:
        cells = []
        for a in levels:
            lost = vals(name, a, lambda m: m["lost_kv_reuse"])
            tpot = vals(name, a, lambda m: m["tpot_s"]["mean"])
            att = vals(name, a, lambda m: m["slo_attainment"])
            n = len(seeds)
            cells.append(f"{sum(lost) / n:.1%} / {1000 * sum(tpot) / n:.0f} / {sum(att) / n:.0%}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\nSeeds {', '.join(map(str, seeds))}.\n"


def write_seeds(name: str, md: list[str], payload: dict[str, Any]) -> None:
    """Store a table over seeds (Markdown and JSON) under ``bench/results/sim_NAME``."""
    (RESULTS / f"sim_{name}.md").write_text("\n".join(md), encoding="utf-8")
    (RESULTS / f"sim_{name}.json").write_text(json.dumps(payload, indent=1, default=float), encoding="utf-8")
    print(f"wrote {RESULTS / f'sim_{name}.md'}")


def command_line() -> str:
    return "python -m bench.bench_sim " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def write_sections(
    name: str, title: str, sections: list[tuple[str, Scenario, list[dict[str, Any]]]], notes: str
) -> None:
    command = command_line()
    md = [f"# {title}\n", f"Command: `{command}`\n", notes + "\n"]
    payload: dict[str, Any] = {"command": command, "sections": []}
    for heading, sc, results in sections:
        md.append(f"## {heading}\n")
        md.append(markdown_table(results))
        slim = [{k: v for k, v in r.items() if k != "ttft_samples"} for r in results]
        payload["sections"].append({"heading": heading, "scenario": scenario_dict(sc), "results": slim})
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"sim_{name}.md").write_text("\n".join(md), encoding="utf-8")
    (RESULTS / f"sim_{name}.json").write_text(json.dumps(payload, indent=1, default=float), encoding="utf-8")
    print(f"wrote {RESULTS / f'sim_{name}.md'}")


def print_results(heading: str, results: list[dict[str, Any]]) -> None:
    print(f"\n## {heading}\n{markdown_table(results)}", flush=True)
