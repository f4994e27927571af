"""App. D.2's scale (``python -m bench.bench_sim scale``): 64 nodes, 10 agents per GPU, static PD at
the paper's reference split 24P40D; one seed with every column, or ``--seeds`` with mean and spread."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from agentpool.sim.cli import compare
from agentpool.sim.presets import preset
from agentpool.sim.run import Scenario, load_conversations, run_system, scenario_bound, scenario_dict
from agentpool.sim.simulator import SimConfig
from bench.sim_tables import (
    Bounds,
    BySeed,
    command_line,
    fit_error_table,
    label_gain,
    planner_settings,
    print_results,
    seed_table,
    slim,
    write_sections,
    write_seeds,
)


def _scale_scenario(args: argparse.Namespace, seed: int = 0) -> Scenario:
    """App. D.2's shape at ``--scale-nodes`` nodes: 10 agents per GPU, 24/64 of the nodes prefilling."""
    nodes = args.scale_nodes
    gpus = preset(Scenario().preset).truth.hardware.gpus
    prefill = round(nodes * 24 / 64)
    return Scenario(
        trace=args.trace,
        agents=10 * gpus * nodes,
        warmup_s=args.warmup,
        duration_s=args.duration,
        ramp_s=args.ramp,
        static_prefill_nodes=prefill,
        sim=SimConfig(nodes=nodes, prefill_nodes=prefill, block_size=args.block_tokens),
        planner=planner_settings(args),
        seed=seed,
    )


def _systems(args: argparse.Namespace) -> list[str]:
    return [s.strip() for s in args.scale_systems.split(",") if s.strip()]


def _minute_progress(label: str, sc: Scenario) -> Callable[[float], None]:
    """A progress line every simulated minute: how far ``label`` got, in wall and CPU time."""
    t = time.perf_counter()
    cpu = time.process_time()
    end = sc.warmup_s + sc.duration_s

    def progress(done: float) -> None:
        print(
            f"  {label}: simulated {done * end / 60:.0f} of {end / 60:.0f} min, "
            f"{time.perf_counter() - t:.0f} s wall, {time.process_time() - cpu:.0f} s CPU",
            flush=True,
        )

    return progress


def scale(args: argparse.Namespace) -> None:
    """App. D.2: 64 nodes, 10 agents per GPU; static PD at the paper's reference split 24P40D.

    ``--scale-nodes N`` keeps D.2's shape at N nodes (10 agents per GPU, 24/64 of the nodes
    prefilling); one system with ``--jobs 1`` prints a progress line (simulated minute, wall time,
    requests) every simulated minute, so a run cut short still says how far it got. ``--seeds``: each
    system over the seeds (with ``--jobs 1`` one after another, with progress lines), mean and spread."""
    if args.seeds:
        scale_seeds(args)
        return
    sc = _scale_scenario(args)
    nodes = sc.sim.nodes
    gpus = preset(sc.preset).truth.hardware.gpus
    prefill = sc.sim.prefill_nodes
    agents = sc.agents
    systems = _systems(args)
    t = time.perf_counter()
    cpu = time.process_time()
    if len(systems) == 1 and args.jobs == 1:
        convs = load_conversations(sc)
        res = [run_system(systems[0], sc, convs, progress=_minute_progress(systems[0], sc))]
    else:
        res = compare(sc, systems, quiet=True, jobs=args.jobs)
    wall = time.perf_counter() - t
    cpu = time.process_time() - cpu
    gpu_count = gpus * nodes
    for r in res:
        print(
            f"{gpu_count:,} GPUs ({nodes} nodes), {agents:,} agents, {r['system']}: "
            f"{r['requests_simulated']} requests, {r['wall_s']:.0f} s of simulation"
        )
    print(
        f"whole comparison: {wall:.0f} s wall, {cpu:.0f} s CPU of this process, with "
        f"{min(args.jobs, len(systems))} job(s)"
    )
    print_results(f"{gpu_count} GPUs", res)
    if args.write:
        minutes = (sc.warmup_s + sc.duration_s) / 60
        write_sections(
            args.name or "scale",
            f"App. D.2 setting: {nodes} nodes ({gpu_count:,} GB300 GPUs), 10 agents per GPU",
            [(f"{', '.join(systems)}; {agents:,} agents", sc, res)],
            f"Wall time of the whole comparison (including trace loading): {wall:.0f} s on this machine "
            f"(2 cores, {min(args.jobs, len(systems))} simulation(s) at once; each run's own time is its "
            f"'wall s'; {cpu:.0f} s CPU in the bench process, which with one job runs the simulation "
            f"itself). {minutes:g} simulated minutes, {args.ramp:g} s ramp, {sc.sim.block_size}-token "
            f"simulation blocks. Agents start evenly over the "
            f"ramp, so the first requests (long uncached prompts) do not arrive in one burst. Planned "
            f"systems start from {prefill}P{nodes - prefill}D; static-cache-aware stays there (at 64 "
            "nodes, 24P40D: the split the paper normalizes D.2's throughput to).",
        )


def scale_seeds(args: argparse.Namespace) -> None:
    """App. D.2 over ``--seeds``: each system on each seed's scenario (the seed draws the agents'
    conversations and order and the iteration noise), the closed-loop bound of each, mean and spread."""
    systems = _systems(args)
    by_seed: BySeed = {}
    bounds: Bounds = {}
    t = time.perf_counter()
    cpu = time.process_time()
    for seed in args.seeds:
        sc = _scale_scenario(args, seed)
        convs = load_conversations(sc)
        print(f"seed {seed}: {', '.join(systems)} on {sc.sim.nodes} nodes, {sc.agents:,} agents", flush=True)
        if args.jobs == 1:
            runs = [
                run_system(n, sc, convs, progress=_minute_progress(f"seed {seed} {n}", sc)) for n in systems
            ]
        else:
            runs = compare(sc, systems, quiet=True, jobs=args.jobs, conversations=convs)
        by_seed[seed] = runs
        b = scenario_bound(sc, convs)
        bounds[seed] = None if b is None else b.reference_rps
        print_results(f"seed {seed}", runs)
    label_gain(args, by_seed)
    wall = time.perf_counter() - t
    cpu = time.process_time() - cpu
    table = seed_table(by_seed, bounds)
    print(f"\n{table}\nwhole run: {wall:.0f} s wall, {cpu:.0f} s CPU of this process", flush=True)
    if not args.write:
        return
    sc = _scale_scenario(args)
    gpus = preset(sc.preset).truth.hardware.gpus * sc.sim.nodes
    prefill = sc.sim.prefill_nodes
    md = [
        f"# App. D.2 setting: {sc.sim.nodes} nodes ({gpus:,} GB300 GPUs), 10 agents per GPU, over seeds\n",
        f"Command: `{command_line()}`\n",
        f"{sc.agents:,} agents, {(sc.warmup_s + sc.duration_s) / 60:g} simulated minutes "
        f"({sc.warmup_s / 60:g} warmup), {args.ramp:g} s ramp, {sc.sim.block_size}-token simulation "
        f"blocks; planned systems start from "
        f"{prefill}P{sc.sim.nodes - prefill}D, static-cache-aware stays there. The seed draws the "
        f"conversations' order and the iteration noise. {wall:.0f} s wall, {cpu:.0f} s CPU of the bench "
        f"process ({min(args.jobs, len(systems))} simulation(s) at once on 2 cores).\n",
        f"## {sc.agents:,} concurrent agents\n\n{table}",
    ]
    if any(r["summary"].get("fit_error") for rs in by_seed.values() for r in rs):
        md.append(fit_error_table(by_seed, fitted_only=True))
    section = {
        "agents": sc.agents,
        "scenario": scenario_dict(sc),
        "bounds": {str(k): v for k, v in bounds.items()},
        "results_by_seed": slim(by_seed),
    }
    payload: dict[str, Any] = {"command": md[1], "sections": [section]}
    write_seeds(args.name or "scale_seeds", md, payload)
