"""The comparisons on the paper's CC setting (9 nodes, the Claude Code trace, closed loop) of
``python -m bench.bench_sim``: ``cc`` (the systems at 90/108/126 agents, or over seeds with the
analytic bound), ``fit`` (agentpool with the preset's models against its online fit, with extra
noise) and ``pressure`` (host pools below the working set: branch-count eviction against LRU)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from agentpool.sim.cli import compare
from agentpool.sim.planners import ModelSource
from agentpool.sim.run import Scenario, load_conversations, run_system, scenario_bound
from agentpool.sim.simulator import SimConfig
from agentpool.sim.systems import DISAGGREGATED_DEFAULT
from bench.sim_tables import (
    Bounds,
    BySeed,
    command_line,
    fit_error_table,
    label_gain,
    over_seeds,
    planner_settings,
    print_results,
    seed_table,
    slim,
    write_sections,
    write_seeds,
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
