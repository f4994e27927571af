"""`agentpool simulate`: compare agentpool with baseline systems on an agent trace, in virtual time."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentpool.sim.parallel import run_parallel
from agentpool.sim.planners import ModelSource, PlannerSettings
from agentpool.sim.presets import preset
from agentpool.sim.report import markdown_report, write_json, write_plots
from agentpool.sim.run import (
    WORKLOADS,
    Scenario,
    best_reference,
    load_conversations,
    load_trace_for,
    reference_runs,
    run_system,
    scenario_bound,
    scenario_dict,
)
from agentpool.sim.simulator import DECODE_BINDINGS, TRUTHS, SimConfig
from agentpool.sim.systems import COLOCATED_DEFAULT, DISAGGREGATED_DEFAULT, SYSTEMS
from agentpool.sim.trace import Conversation

HELP = "simulate agentpool and baseline systems on an agent trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--systems",
        default=",".join(DISAGGREGATED_DEFAULT),
        help=f"comma-separated systems, or 'colocated' for {','.join(COLOCATED_DEFAULT)}; "
        f"known: {','.join(SYSTEMS)}",
    )
    parser.add_argument("--workload", default="claude-code", choices=WORKLOADS)
    parser.add_argument(
        "--trace", default=None, help="Claude Code trace (JSONL, .gz ok); default: bundled sample"
    )
    parser.add_argument("--conversations", type=int, default=None, help="use only the first N conversations")
    parser.add_argument("--nodes", type=int, default=9, help="nodes in the pool")
    parser.add_argument(
        "--prefill-nodes", type=int, default=6, help="initial prefill nodes (planned systems)"
    )
    parser.add_argument("--static-prefill-nodes", type=int, default=4, help="prefill nodes of static systems")
    parser.add_argument("--agents", type=int, default=90, help="concurrent agents (closed loop)")
    parser.add_argument("--arrival-rate", type=float, default=None, help="agents per minute (open loop)")
    parser.add_argument("--max-agents", type=int, default=258, help="admission limit (open loop)")
    parser.add_argument("--duration", type=float, default=1200.0, help="measured seconds after the warmup")
    parser.add_argument("--warmup", type=float, default=600.0, help="warmup seconds (not measured)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="glm52-4xgb300", help="node calibration preset")
    parser.add_argument("--block-tokens", type=int, default=512, help="KV block size of the simulation")
    parser.add_argument(
        "--max-pause",
        type=float,
        default=60.0,
        help="cap recorded pauses (seconds; 60 gives the paper's offered load, 0 or less: as recorded)",
    )
    parser.add_argument("--ramp", type=float, default=0.0, help="start closed-loop agents over N seconds")
    parser.add_argument(
        "--decode-binding",
        default="prefill-start",
        choices=list(DECODE_BINDINGS),
        help="when a disaggregated request is bound to its decode node (prefill-start: Algorithm E.3 and "
        "the live router; dispatch: SGLang PD, which the SGLang baselines always use)",
    )
    parser.add_argument("--shared-prefix", type=int, default=15000, help="shared system+tools prefix tokens")
    parser.add_argument(
        "--fit",
        default="online",
        choices=[m.value for m in ModelSource],
        help="agentpool's planner and router models: fitted online from the first planner window's "
        "iterations (the live planner's way), or the preset's Eq. 1/2 coefficients throughout",
    )
    parser.add_argument(
        "--fit-noise", type=float, default=0.0, help="extra relative noise on recorded iteration times"
    )
    parser.add_argument(
        "--no-refit",
        action="store_true",
        help="keep the online fit frozen (the paper's way) instead of refitting a node whose work "
        "leaves the range its models were fitted on (agentpool.models.refit, as the live planner does)",
    )
    parser.add_argument(
        "--min-relative-gain",
        type=float,
        default=PlannerSettings().min_relative_gain,
        help="agentpool's planner switches only for a mean gain of at least this fraction of the "
        "current split's predicted throughput (0: the paper's test alone; default %(default)s)",
    )
    parser.add_argument(
        "--truth",
        default="roofline",
        choices=list(TRUTHS),
        help="what iterations really take: the preset's architecture/GPU roofline model (default), or "
        "Eq. 1/2 with the preset's coefficients (the policies then face no model error)",
    )
    parser.add_argument(
        "--noise", type=float, default=None, help="relative noise of each iteration (default: the preset's)"
    )
    parser.add_argument(
        "--gpu-memory",
        default="shared",
        choices=["shared", "separate"],
        help="shared: the prefix cache holds what running requests leave of a node's GPU KV memory; "
        "separate: two pools of the preset's size (the former simulator)",
    )
    parser.add_argument(
        "--host-kv-tokens", type=int, default=None, help="host KV tier per node in tokens (default: preset)"
    )
    parser.add_argument("--out", default="sim-results", help="output directory")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--quiet", action="store_true", help="no progress (drawn only on a terminal anyway)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="systems simulated at once, one process each (default: one per system, at most one per CPU "
        "core); results do not depend on it",
    )


def _systems(arg: str) -> list[str]:
    if arg == "colocated":
        return list(COLOCATED_DEFAULT)
    names = [s.strip() for s in arg.split(",") if s.strip()]
    unknown = [n for n in names if n not in SYSTEMS]
    if unknown or not names:
        raise SystemExit(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    return names


def scenario_from(args: argparse.Namespace) -> Scenario:
    return Scenario(
        workload=args.workload,
        trace=args.trace,
        conversations=args.conversations,
        agents=args.agents,
        arrival_per_min=args.arrival_rate,
        max_agents=args.max_agents,
        shared_prefix_tokens=args.shared_prefix,
        max_pause_s=args.max_pause if args.max_pause is not None and args.max_pause > 0 else None,
        ramp_s=args.ramp,
        preset=args.preset,
        sim=SimConfig(
            nodes=args.nodes,
            prefill_nodes=args.prefill_nodes,
            block_size=args.block_tokens,
            decode_binding=args.decode_binding,
            truth=args.truth,
            noise=args.noise,
            shared_gpu_memory=args.gpu_memory == "shared",
            host_kv_tokens=args.host_kv_tokens,
        ),
        static_prefill_nodes=args.static_prefill_nodes,
        warmup_s=args.warmup,
        duration_s=args.duration,
        seed=args.seed,
        planner=PlannerSettings(
            fit=ModelSource(args.fit),
            fit_noise=args.fit_noise,
            fit_seed=args.seed,
            refit=not args.no_refit,
            min_relative_gain=args.min_relative_gain,
        ),
    )


class _Say:
    """One line per step on stderr, from the first second (``--quiet`` silences it)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.start = time.perf_counter()

    def __call__(self, text: str) -> None:
        if not self.quiet:
            print(f"agentpool simulate: {text}", file=sys.stderr, flush=True)


class _Bar:
    def __init__(self, label: str, quiet: bool) -> None:
        self.label = label
        self.quiet = quiet
        self.start = time.perf_counter()

    def __call__(self, fraction: float) -> None:
        if self.quiet:
            return
        n = int(30 * min(1.0, fraction))
        took = time.perf_counter() - self.start
        sys.stderr.write(f"\r{self.label:20s} [{'#' * n}{'.' * (30 - n)}] {fraction:5.0%} {took:6.1f}s")
        sys.stderr.flush()

    def done(self) -> None:
        if not self.quiet:
            self(1.0)
            sys.stderr.write("\n")


def default_jobs(names: list[str]) -> int:
    """One worker per system, at most one per CPU core."""
    return max(1, min(len(names), os.cpu_count() or 1))


def compare(
    sc: Scenario,
    names: list[str],
    quiet: bool = True,
    jobs: int = 1,
    conversations: Sequence[Conversation] | None = None,
) -> list[dict[str, Any]]:
    """Every system of ``names`` on ``sc``, in that order; ``jobs`` > 1 runs that many at once (same
    results, see :mod:`agentpool.sim.parallel`). ``conversations``: already loaded for ``sc`` (else
    loaded here)."""
    if conversations is None:
        conversations = load_conversations(sc)
    if jobs > 1 and len(names) > 1:
        return run_parallel(sc, names, conversations, jobs, quiet=quiet)
    results = []
    for name in names:
        bar = _Bar(name, quiet)
        results.append(run_system(name, sc, conversations, progress=bar))
        bar.done()
    return results


def run(args: argparse.Namespace, adjust: Callable[[Scenario], Scenario] | None = None) -> int:
    """``adjust``: changes the scenario the flags describe (``agentpool simulate -f POOL.yaml``)."""
    try:
        names = _systems(args.systems)
        sc = scenario_from(args)
        if adjust is not None:
            sc = adjust(sc)
    except ValueError as e:
        raise SystemExit(f"agentpool simulate: {e}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = default_jobs(names) if args.jobs is None else args.jobs
    if jobs < 1:
        raise SystemExit(f"agentpool simulate: --jobs must be at least 1, got {jobs}")
    quiet = args.quiet or not sys.stderr.isatty()  # a progress line redrawn in place only on a terminal
    say = _Say(args.quiet)
    if sc.workload == "claude-code":
        say(f"loading the Claude Code trace ({sc.trace or 'bundled sample'}) ...")
    conversations, left_out = load_trace_for(sc)
    if left_out:
        limit = preset(sc.preset).max_request_tokens
        say(f"{left_out} trace requests over the {limit:,}-token context (and what waits on them) left out")
    runs = reference_runs(names, sc.sim.nodes)
    plural = "s" if len(runs) > 1 else ""
    say(
        f"simulating {len(runs)} run{plural} ({', '.join(names)}), {min(jobs, len(runs))} at a time: "
        f"{(sc.warmup_s + sc.duration_s) / 60:g} simulated minutes each ..."
    )
    results = best_reference(compare(sc, runs, quiet=quiet, jobs=jobs, conversations=conversations))
    say(f"done in {time.perf_counter() - say.start:.0f} s")
    bound = scenario_bound(sc, conversations)
    command = shlex.join(["agentpool", "simulate", *sys.argv[2:]])
    scen = scenario_dict(sc)
    md = markdown_report("agentpool simulate", command, scen, results, bound)
    (out / "report.md").write_text(md, encoding="utf-8")
    payload: dict[str, Any] = {"command": command, "scenario": scen, "results": results}
    payload["bound"] = None if bound is None else bound.as_dict()
    write_json(out / "results.json", payload)
    if not args.no_plots:
        write_plots(out, results, sc.warmup_s + sc.duration_s)
    print(md)
    print(f"wrote {out / 'report.md'}, {out / 'results.json'}" + ("" if args.no_plots else " and PNG plots"))
    return 0
