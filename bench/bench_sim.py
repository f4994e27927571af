"""Simulator benchmarks: speed, and the papers' comparisons on the Claude Code trace.

    python -m bench.bench_sim                 # speed (default, ~2 min): 9 nodes/126 agents/1 h, 64 nodes
                                              # (--max-pause 60: the 9-node run at the paper's load)
    python -m bench.bench_sim cc              # paper's CC setting: 9 nodes, 90/108/126 agents, 5 systems
    python -m bench.bench_sim shifting        # Putnam -> mix -> OSWorld (§6.3)
    python -m bench.bench_sim open-loop       # Poisson agent arrivals, 0.5-1.5 agents/min (App. D.3)
    python -m bench.bench_sim smetric         # colocated routing, TPS within SLO over load (SMetric §5)
    python -m bench.bench_sim scale           # App. D.2's 256-GPU setting (64 nodes, 2,560 agents), wall time
    python -m bench.bench_sim fit             # agentpool with preset vs online-fitted models (noise levels)
    python -m bench.bench_sim pressure        # host pool 0.25x/0.5x/1x of the working set: branch counts/LRU

``--trace PATH`` replays another Claude Code file (e.g. ``../shared/traces/claude-code/v8-dev.jsonl.gz``);
``--write`` stores Markdown and JSON under ``bench/results/`` with the command that produced them.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import time
from collections.abc import Callable
from typing import Any

from agentpool.sim.cli import compare
from agentpool.sim.planners import ModelSource
from agentpool.sim.run import (
    Scenario,
    load_conversations,
    run_system,
    scenario_bound,
    scenario_dict,
)
from agentpool.sim.simulator import DECODE_BINDINGS, SimConfig
from agentpool.sim.systems import DISAGGREGATED_DEFAULT
from bench.sim_scale import scale
from bench.sim_tables import (
    Bounds,
    BySeed,
    Runs,
    command_line,
    fit_error_table,
    label_gain,
    over_seeds,
    planner_settings,
    print_results,
    seed_table,
    slim,
    sweep_table,
    write_sections,
    write_seeds,
)


def speed(args: argparse.Namespace) -> None:
    sc = Scenario(
        trace=args.trace, agents=126, warmup_s=1800.0, duration_s=3600.0, max_pause_s=args.max_pause
    )
    convs = load_conversations(sc)
    t = time.perf_counter()
    r = run_system("agentpool", sc, convs)
    wall = time.perf_counter() - t
    pauses = "recorded pauses" if args.max_pause is None else f"pauses capped at {args.max_pause:g} s"
    print(
        f"9 nodes, 126 agents, 30 min warmup + 1 h, {pauses}: {r['requests_simulated']} requests in "
        f"{wall:.1f} s wall "
        f"({r['sim_requests_per_wall_s']:.0f} simulated requests per wall second); "
        f"target < 120 s: {wall / 120.0:.2f}x of the budget"
    )
    big = Scenario(
        trace=args.trace,
        agents=640,
        warmup_s=0.0,
        duration_s=240.0,
        sim=SimConfig(nodes=64, prefill_nodes=40),
    )
    cpu = time.process_time()
    r64 = run_system("agentpool", big, convs)
    cpu = time.process_time() - cpu
    print(
        f"64 nodes, 640 agents, 4 min: {r64['requests_simulated']} requests in {r64['wall_s']:.1f} s wall: "
        f"{r64['sim_requests_per_wall_s']:.0f} simulated requests per wall second (target >= 5000: "
        f"{r64['sim_requests_per_wall_s'] / 5000.0:.2f}x; per CPU second, which other jobs on the machine "
        f"disturb less: {r64['requests_simulated'] / cpu:.0f}); 9-node rate over 64-node rate: "
        f"{r['sim_requests_per_wall_s'] / max(r64['sim_requests_per_wall_s'], 1e-9):.2f}"
    )


def _cc_scenario(args: argparse.Namespace, agents: int, seed: int = 0) -> Scenario:
    """The paper's CC setting (9 nodes, the Claude Code trace) with ``agents`` concurrent agents."""
    return Scenario(
        trace=args.trace,
        agents=agents,
        warmup_s=args.warmup,
        duration_s=args.duration,
        max_pause_s=args.max_pause,
        sim=SimConfig(decode_binding=args.decode_binding),
        seed=seed,
        planner=planner_settings(args),
    )


def cc(args: argparse.Namespace) -> None:
    if args.seeds:
        cc_seeds(args)
        return
    sections = []
    for agents in args.agents or (90, 108, 126):
        sc = _cc_scenario(args, agents)
        res = compare(sc, list(DISAGGREGATED_DEFAULT), quiet=True, jobs=args.jobs)
        print_results(f"{agents} agents", res)
        sections.append((f"{agents} concurrent agents", sc, res))
    if args.write:
        capped = args.max_pause is not None
        at_end = args.decode_binding == "prefill-end"
        write_sections(
            ("cc_paper_load" if capped else "cc") + ("_bind_at_end" if at_end else ""),
            "Claude Code trace, 9 nodes (GLM-5.2 on 4xGB300 preset), closed loop"
            + (f", pauses capped at {args.max_pause:g} s" if capped else ", recorded pauses")
            + (", decode bound when the first token is out" if at_end else ""),
            sections,
            "Planned systems start from 6P3D, static-cache-aware runs at 4P5D (the paper's best static "
            f"split for SGLang on CC). {args.warmup / 60:g} min warmup, {args.duration / 60:g} min measured."
            + (
                " Pauses are capped so that the offered load matches the paper's: by Little's law (App. C.4, "
                "159 branches at 5.4 req/s) its mean pause is about 20 s, the sample's recorded mean "
                "is 189 s (22 s when capped at 60 s)."
                if capped
                else ""
            ),
        )


def cc_seeds(args: argparse.Namespace) -> None:
    """The CC comparison over several seeds: mean and spread, the analytic bound."""
    systems = args.systems.split(",") if args.systems else list(DISAGGREGATED_DEFAULT)
    md = [
        "# Claude Code trace, 9 nodes (GLM-5.2-class on 4xGB300, roofline ground truth), over seeds\n",
        f"Command: `{command_line()}`\n",
        _run_length(args)
        + ". Planned systems start from 6P3D, static-cache-aware runs 4P5D. The seed draws the replay "
        "order of the conversations and the iteration noise. Full results: the JSON beside this file.\n",
    ]

    def section(agents: int) -> tuple[BySeed, Bounds, str]:
        by_seed, bounds = over_seeds(
            functools.partial(_cc_scenario, args, agents),
            systems,
            args.seeds,
            args.jobs,
            f"{agents} agents",
        )
        label_gain(args, by_seed)
        return by_seed, bounds, seed_table(by_seed, bounds)

    _sections_by_agents(args, md, section, "cc_seeds")


def _run_length(args: argparse.Namespace) -> str:
    """How long the runs warm up and are measured, and their pauses (a sentence without its end)."""
    return f"{args.warmup / 60:g} min warmup, {args.duration / 60:g} min measured; pauses " + (
        "as recorded" if args.max_pause is None else f"capped at {args.max_pause:g} s"
    )


def _sections_by_agents(
    args: argparse.Namespace,
    md: list[str],
    section: Callable[[int], tuple[BySeed, Bounds, str]],
    default_name: str,
) -> None:
    """One section per agent count (``section``: its results by seed, bounds and table), printed and
    added to ``md``; written with its JSON (``md[1]`` is the command) with ``--write``."""
    payload: dict[str, Any] = {"command": md[1], "sections": []}
    for agents in args.agents or (126,):
        by_seed, bounds, table = section(agents)
        print(f"\n## {agents} agents\n{table}", flush=True)
        md.append(f"## {agents} concurrent agents\n\n{table}")
        payload["sections"].append({"agents": agents, "bounds": bounds, "results_by_seed": slim(by_seed)})
    if args.write:
        write_seeds(args.name or default_name, md, payload)


def _shifting_scenario(args: argparse.Namespace, seed: int) -> Scenario:
    return Scenario(
        workload="shifting",
        agents=args.shift_agents,
        warmup_s=args.warmup,
        duration_s=3 * args.duration,
        static_prefill_nodes=5,
        seed=seed,
    )


SHIFTING_SYSTEMS = ["agentpool", "static-cache-aware", "dynamo-like", "oracle-reference"]


def shifting(args: argparse.Namespace) -> None:
    notes = (
        f"{args.shift_agents} Putnam agents, then {args.shift_agents // 2} Putnam + "
        f"{args.shift_agents // 4} OSWorld, then {args.shift_agents // 2} OSWorld, "
        "one third of the measured time each. static-cache-aware at 5P4D."
    )
    systems = args.systems.split(",") if args.systems else SHIFTING_SYSTEMS
    if args.seeds:
        by_seed, bounds = over_seeds(
            lambda seed: _shifting_scenario(args, seed), systems, args.seeds, args.jobs, "shifting"
        )
        table = seed_table(by_seed, bounds)
        print(f"\n## shifting composition\n{table}", flush=True)
        if args.write:
            md = [
                "# Shifting composition: Putnam-like, then mixed, then OSWorld-like (synthetic, §6.3), "
                "over seeds\n",
                f"Command: `{command_line()}`\n",
                notes
                + f" {args.warmup / 60:g} min warmup, {3 * args.duration / 60:g} min measured. The seed "
                "draws the synthetic conversations and the iteration noise; no analytic bound applies to "
                "synthetic periods. Full results: the JSON beside this file.\n",
                table,
            ]
            payload = {"command": md[1], "bounds": bounds, "results_by_seed": slim(by_seed)}
            write_seeds(args.name or "shifting_seeds", md, payload)
        return
    sc = _shifting_scenario(args, 0)
    res = compare(sc, systems, quiet=True, jobs=args.jobs)
    print_results("shifting composition", res)
    if args.write:
        write_sections(
            "shifting",
            "Shifting composition: Putnam-like, then mixed, then OSWorld-like (synthetic, §6.3)",
            [("Putnam -> Putnam+OSWorld -> OSWorld", sc, res)],
            notes,
        )


def _meets_d3(r: dict[str, Any]) -> bool:
    """App. D.3's targets: P50/P95 TTFT within 5/15 s and P50 E2E within 10 s."""
    s = r["summary"]
    return bool(s["ttft_s"]["p50"] <= 5.0 and s["ttft_s"]["p95"] <= 15.0 and s["e2e_s"]["p50"] <= 10.0)


def _open_loop_scenario(args: argparse.Namespace, rate: float, seed: int) -> Scenario:
    return Scenario(
        trace=args.trace,
        arrival_per_min=rate,
        max_agents=258,
        warmup_s=args.warmup,
        duration_s=args.duration,
        max_pause_s=args.max_pause,
        sim=SimConfig(prefill_nodes=4),
        planner=planner_settings(args),
        seed=seed,
    )


OPEN_LOOP_SYSTEMS = ["agentpool", "static-cache-aware", "dynamo-like"]


def open_loop(args: argparse.Namespace) -> None:
    systems = args.systems.split(",") if args.systems else OPEN_LOOP_SYSTEMS
    seeds = args.seeds or [0]
    sections = []
    md_tables: list[str] = []
    payload: dict[str, Any] = {"sections": []}
    sustained: dict[str, list[float]] = {}  # rates at which a system meets D.3 in every seed
    for rate in args.rates:
        by_seed, bounds = over_seeds(
            functools.partial(_open_loop_scenario, args, rate),
            systems,
            seeds,
            args.jobs,
            f"{rate} agents/min",
        )
        label_gain(args, by_seed)
        for name in systems:
            if all(_meets_d3(next(r for r in by_seed[s] if r["system"] == name)) for s in seeds):
                sustained.setdefault(name, []).append(rate)
        if len(seeds) == 1:
            res = by_seed[seeds[0]]
            print_results(f"{rate} agents/min", res)
            sections.append((f"{rate} agents per minute", _open_loop_scenario(args, rate, seeds[0]), res))
        else:
            table = seed_table(by_seed, bounds)
            print(f"\n## {rate} agents/min\n{table}", flush=True)
            md_tables.append(f"## {rate} agents per minute\n\n{table}")
            payload["sections"].append({"rate_per_min": rate, "results_by_seed": slim(by_seed)})
    summary = "; ".join(f"{k}: {v}" for k, v in sustained.items()) or "none"
    print(f"rates meeting the App. D.3 targets (in every seed): {summary}")
    if not args.write:
        return
    title = "Open-loop Poisson agent arrivals on the Claude Code trace, 9 nodes (App. D.3)" + (
        f", pauses capped at {args.max_pause:g} s" if args.max_pause is not None else ""
    )
    notes = (
        "All systems start from 4P5D; at most 258 agents at once, admission wait counts in the first "
        "request's TTFT. Rates (agents/min) meeting the App. D.3 targets (P50/P95 TTFT <= 5/15 s, "
        f"P50 E2E <= 10 s) in every seed: {summary}."
    )
    name = "open_loop_paper_load" if args.max_pause is not None else "open_loop"
    if len(seeds) == 1:
        write_sections(name, title, sections, notes)
        return
    md = [
        f"# {title}, over seeds\n",
        f"Command: `{command_line()}`\n",
        notes + f" {args.warmup / 60:g} min warmup, {args.duration / 60:g} min measured. The seed draws "
        "the arrivals, the conversations' order and the iteration noise; no analytic bound applies to "
        "an open loop. Full results: the JSON beside this file.\n",
        *md_tables,
    ]
    payload["command"] = md[1]
    write_seeds(args.name or name + "_seeds", md, payload)


def smetric(args: argparse.Namespace) -> None:
    """Colocated routing (SMetric §5): TPS within SLO over a sweep of load levels per policy, over
    seeds: each policy's peak and the curve past it."""
    systems = args.systems.split(",") if args.systems else ["smetric", "lmetric", "linear"]
    levels = args.colocated_agents
    seeds = args.seeds or [0]
    runs: Runs = {}
    payload: dict[str, Any] = {"runs": []}
    for seed in seeds:
        for agents in levels:
            sc = Scenario(
                trace=args.trace,
                agents=agents,
                preset="qwen3-30b-a3b-h200",
                warmup_s=args.warmup,
                duration_s=args.duration,
                max_pause_s=args.max_pause,
                sim=SimConfig(nodes=args.colocated_nodes, prefill_nodes=0),
                seed=seed,
            )
            for r in compare(sc, systems, quiet=True, jobs=args.jobs):
                runs[(r["system"], agents, seed)] = r
                m = r["summary"]
                print(
                    f"{r['system']} {agents} agents seed {seed}: TPS within SLO {m['tps_within_slo']:.0f}, "
                    f"req/s {m['throughput_rps']:.3f}, lost reuse {m['lost_kv_reuse']:.1%}, "
                    f"TPOT {1000 * m['tpot_s']['mean']:.0f} ms, SLO attainment {m['slo_attainment']:.0%}",
                    flush=True,
                )
                slim = {k: v for k, v in r.items() if k != "ttft_samples"}
                slim.update(agents=agents, seed=seed, scenario=scenario_dict(sc))
                payload["runs"].append(slim)
            print(f"{agents} agents, seed {seed}: done", flush=True)
    table = sweep_table(runs, systems, levels)
    print(table, flush=True)
    if args.write:
        command = command_line()
        md = [
            f"# Colocated routing over load levels, {args.colocated_nodes} Qwen3-30B-A3B-class H200 nodes\n",
            f"Command: `{command}`\n",
            "Every node serves both phases; a global tier (peer host memory) is read at prefill start. "
            f"{args.warmup / 60:g} min warmup, {args.duration / 60:g} min measured"
            + (f", pauses capped at {args.max_pause:g} s" if args.max_pause is not None else "")
            + ". TPS within SLO: output tokens/s of requests meeting TTFT <= 2 s + 0.1 ms/token and "
            "TPOT <= 100 ms (SMetric's measure); each cell the mean (min-max) over seeds.\n",
            table,
        ]
        payload["command"] = command
        write_seeds(args.name or "smetric", md, payload)


def _fit_runs(args: argparse.Namespace, agents: int, seed: int) -> tuple[Scenario, list[dict[str, Any]]]:
    """agentpool on the CC scenario of ``agents`` and ``seed``: with the preset's models, then fitted
    online with each extra noise level of ``args.noises``."""
    base = _cc_scenario(args, agents, seed)
    convs = load_conversations(base)
    res = []
    for source, noise in [(ModelSource.PRESET, 0.0)] + [(ModelSource.ONLINE, n) for n in args.noises]:
        settings = planner_settings(args, fit=source, fit_noise=noise, fit_seed=seed)
        r = run_system("agentpool", dataclasses.replace(base, planner=settings), convs)
        # fitted with no extra noise is agentpool as every other table runs it: its rows merge with those
        r["system"] = (
            "agentpool (preset models)"
            if source is ModelSource.PRESET
            else "agentpool"
            if noise == 0.0
            else f"agentpool (fitted, {100 * noise:g}% noise)"
        )
        res.append(r)
        fitted = [e["reason"] for e in r["planner_log"] if e["outcome"] == "fit"]
        if fitted:
            print(f"seed {seed}, {r['system']}: {fitted[-1]}", flush=True)
        elif source is ModelSource.ONLINE:
            print(f"{r['system']}: no planner window ended, the models were never fitted", flush=True)
    return base, res


def fit(args: argparse.Namespace) -> None:
    """agentpool with the preset's coefficients versus models fitted online (extra noise levels); with
    ``--seeds``, mean and spread over seeds and the fitted models' errors against the ground truth."""
    if args.seeds:
        fit_seeds(args)
        return
    sections = []
    for agents in args.agents or (126,):
        base, res = _fit_runs(args, agents, 0)
        print_results(f"{agents} agents", res)
        sections.append((f"{agents} concurrent agents", base, res))
    if args.write:
        write_sections(
            "fit",
            "agentpool with fitted models: the preset's true coefficients vs an online NNLS fit",
            sections,
            "The online fit uses the iterations of the first planner window (10 min), each measured time "
            "multiplied by 1 + noise x N(0, 1); from then on the planner and the router use the fitted "
            "models. Each run's first planner-log entry (JSON) has the fitted coefficients and held-out "
            "errors.",
        )


def fit_seeds(args: argparse.Namespace) -> None:
    md = [
        "# agentpool with the preset's models vs its online per-node fit, against the roofline truth, "
        "over seeds\n",
        f"Command: `{command_line()}`\n",
        "The preset's models are the paper's Eq. 1/2 coefficients (not the truth: 3.0% prefill and 9.8% "
        "decode off it, `sim_truth.md`). The online fit (agentpool's default) fits each node on the "
        "iterations of the first planner window (10 min), each measured time (the truth with its own 3% "
        "noise) multiplied by 1 + extra noise x N(0, 1); from then on the planner and the router use the "
        "fitted models. Fit errors: relative to the noiseless truth on `agentpool.sim.fiterror`'s grid, "
        "the mean over nodes of each node's mean error (mean and min-max over seeds), and the worst grid "
        "point of any node and seed. "
        + _run_length(args)
        + ". The seed draws the replay order, the truth's noise and the extra noise. Full results: the "
        "JSON beside this file.\n",
    ]

    def section(agents: int) -> tuple[BySeed, Bounds, str]:
        by_seed: BySeed = {}
        bounds: Bounds = {}
        for seed in args.seeds:
            base, by_seed[seed] = _fit_runs(args, agents, seed)
            b = scenario_bound(base, load_conversations(base))
            bounds[seed] = None if b is None else b.reference_rps
        label_gain(args, by_seed)
        return by_seed, bounds, seed_table(by_seed, bounds) + "\n" + fit_error_table(by_seed)

    _sections_by_agents(args, md, section, "fit_seeds")


PRESSURE_SYSTEMS = ["agentpool", "agentpool-lru", "static-cache-aware"]


def pressure(args: argparse.Namespace) -> None:
    """Host pools below the working set: branch-count eviction against LRU (issue 15 f)."""
    agents = args.agents[0] if args.agents else 90
    base = _cc_scenario(args, agents)
    convs = load_conversations(base)
    probe = run_system("agentpool", base, convs)
    working_set = probe["summary"]["unique_blocks"] * base.sim.block_size
    nodes = base.sim.nodes
    print(f"working set: {working_set / 1e6:.1f}M tokens ({working_set / nodes / 1e6:.2f}M per node)")
    notes = (
        f"{agents} agents; working set {working_set / 1e6:.1f}M tokens (distinct KV blocks the run "
        f"computes, seed 0), host pool per node a fraction of it / {nodes} nodes. agentpool evicts by branch "
        "counts, agentpool-lru is the same system with LRU, static-cache-aware is SGLang's LRU."
    )

    def scenario(host: int, seed: int) -> Scenario:
        sim = dataclasses.replace(base.sim, host_kv_tokens=host)
        return dataclasses.replace(base, sim=sim, seed=seed)

    sections = []
    md_tables: list[str] = []
    payload: dict[str, Any] = {"sections": []}
    for fraction in args.fractions:
        host = int(fraction * working_set / nodes)
        heading = f"host pool {fraction:g}x of the working set ({host / 1e6:.2f}M tokens per node)"
        if not args.seeds:
            sc = scenario(host, base.seed)
            results = compare(sc, PRESSURE_SYSTEMS, jobs=args.jobs, conversations=convs)
            print_results(heading, results)
            sections.append((heading, sc, results))
            continue
        by_seed, bounds = over_seeds(
            functools.partial(scenario, host), PRESSURE_SYSTEMS, args.seeds, args.jobs, heading
        )
        table = seed_table(by_seed, bounds)
        print(f"\n## {heading}\n{table}", flush=True)
        md_tables.append(f"## {heading}\n\n{table}")
        payload["sections"].append({"fraction": fraction, "bounds": bounds, "results_by_seed": slim(by_seed)})
    if not args.write:
        return
    title = "Host-pool capacity pressure: branch-count eviction vs LRU"
    if not args.seeds:
        write_sections("pressure", title, sections, notes)
        return
    md = [
        f"# {title}, over seeds\n",
        f"Command: `{command_line()}`\n",
        notes + " The same host sizes in every seed.\n",
    ]
    payload["command"] = md[1]
    write_seeds(args.name or "pressure_seeds", md + md_tables, payload)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_sim")
    p.add_argument(
        "what",
        nargs="?",
        default="speed",
        choices=["speed", "cc", "shifting", "open-loop", "smetric", "scale", "fit", "pressure"],
    )
    p.add_argument("--trace", default=None)
    p.add_argument("--warmup", type=float, default=1800.0)
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--agents", type=int, nargs="*", default=None)
    p.add_argument("--max-pause", type=float, default=None, help="cap recorded pauses (seconds)")
    p.add_argument("--ramp", type=float, default=0.0, help="start closed-loop agents over this many seconds")
    p.add_argument("--rates", type=float, nargs="*", default=[0.5, 0.75, 1.0, 1.25, 1.5])
    p.add_argument("--shift-agents", type=int, default=288)
    p.add_argument("--colocated-nodes", type=int, default=16)
    p.add_argument(
        "--colocated-agents", type=int, nargs="+", default=[160, 320, 480, 640], help="smetric: load levels"
    )
    p.add_argument(
        "--scale-systems",
        default="agentpool,static-cache-aware,dynamo-like",
        help="scale: systems (comma-separated)",
    )
    p.add_argument("--scale-nodes", type=int, default=64, help="scale: nodes (10 agents per GPU)")
    p.add_argument(
        "--noises",
        type=float,
        nargs="*",
        default=[0.0, 0.05],
        help="fit: extra noise levels (0: agentpool as is)",
    )
    p.add_argument(
        "--fractions",
        type=float,
        nargs="*",
        default=[0.25, 0.5, 1.0],
        help="pressure: host pool / working set",
    )
    p.add_argument(
        "--decode-binding", default="prefill-start", choices=list(DECODE_BINDINGS), help="cc and fit only"
    )
    p.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="systems of a comparison run at once"
    )
    p.add_argument(
        "--seeds",
        type=int,
        nargs="*",
        default=None,
        help="cc, shifting, open-loop, pressure, smetric, fit, scale: mean and spread over these seeds",
    )
    p.add_argument(
        "--systems", default=None, help="cc --seeds, shifting, open-loop, smetric: systems (comma-separated)"
    )
    p.add_argument(
        "--name",
        default=None,
        help="cc/fit --seeds, shifting/open-loop --seeds, smetric, scale: results file name (sim_NAME.md)",
    )
    p.add_argument(
        "--min-relative-gain",
        type=float,
        default=None,
        help="cc, fit, scale, open-loop: agentpool's planner's least gain of a switch, as a fraction of the "
        "current split's predicted throughput (default: PlannerSettings'; 0: the paper's test alone); "
        "--seeds names agentpool's rows after a value other than the default (cc, open-loop, scale)",
    )
    p.add_argument("--write", action="store_true", help="store the results under bench/results/")
    args = p.parse_args(argv)
    {
        "speed": speed,
        "cc": cc,
        "shifting": shifting,
        "open-loop": open_loop,
        "smetric": smetric,
        "scale": scale,
        "fit": fit,
        "pressure": pressure,
    }[args.what](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
