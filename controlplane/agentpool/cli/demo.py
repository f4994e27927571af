"""`agentpool demo`: a local pool and a live replay of the bundled Claude Code sample, in minutes."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from agentpool.cli.replay import command_line, load_trace
from agentpool.cli.up import options_from
from agentpool.local.demo import context_limit, demo_manifest, run_demo
from agentpool.local.pool import ManifestError, PortInUse, free_port, load_manifest, local_ports
from agentpool.local.replay import ReplaySettings
from agentpool.local.run_replay import ReplayOutput, Slo
from agentpool.local.supervisor import StartError
from agentpool.sim.trace import cap_context

HELP = "run a local pool and replay the bundled Claude Code sample through it (about 4 minutes)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--file", type=Path, default=None, help="pool manifest (default: the demo's)")
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        help="the router's port (default: a free one, as the other services get)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--preset", default=None, help="node class of the sim engines (agentpool.sim presets)"
    )
    parser.add_argument(
        "--trace", type=Path, default=None, help="Claude Code trace (default: bundled sample)"
    )
    parser.add_argument("--conversations", type=int, default=None)
    parser.add_argument("--agents", type=int, default=12, help="conversations running at once")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before the measurement")
    parser.add_argument("--duration", type=float, default=150.0, help="measured seconds")
    parser.add_argument("--time-scale", type=float, default=10.0, help="divide recorded pauses by this")
    parser.add_argument("--max-pause", type=float, default=5.0, help="cap pauses (seconds, after scaling)")
    parser.add_argument("--max-output-tokens", type=int, default=128, help="cap recorded output lengths")
    parser.add_argument("--no-branch-headers", action="store_true", help="the stateless path")
    parser.add_argument(
        "--no-sim", action="store_true", help="do not simulate the same workload for comparison"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("demo-results"), help="report directory (the pool's logs in logs/)"
    )
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def run(args: argparse.Namespace) -> int:
    manifest = args.file or demo_manifest()
    try:
        pool = load_manifest(manifest)
        up_args = argparse.Namespace(
            host=args.host, port=args.port or free_port(args.host, None, local_ports()), redis_url=None,
            redis_password_file=None, time_scale=1.0, host_kv_size=None, no_engines=False, preset=args.preset,
        )  # fmt: skip
        options = options_from(up_args)
    except (ManifestError, PortInUse) as e:
        print(f"agentpool demo: {e}")
        return 2
    limit = context_limit(pool, options.preset)
    conversations, removed = cap_context(load_trace(args), limit)
    if removed:
        print(f"agentpool demo: {removed} trace requests over the {limit:,}-token context left out")

    def settings_for(url: str, model: str) -> ReplaySettings:
        return ReplaySettings(
            url=url, model=model, agents=args.agents, duration_s=args.duration, warmup_s=args.warmup,
            time_scale=args.time_scale, max_pause_s=args.max_pause, max_output_tokens=args.max_output_tokens,
            branch_headers=not args.no_branch_headers, drain_s=60.0,
        )  # fmt: skip

    slo = pool.spec.slo
    ttft = slo.ttft_slo()
    out = ReplayOutput(args.out, plots=not args.no_plots, title="agentpool demo", command=command_line())
    try:
        return asyncio.run(
            run_demo(
                pool, options, settings_for, conversations, out, Slo(ttft.base, ttft.per_token, slo.tpot_s),
                with_sim=not args.no_sim, quiet=args.quiet,
            )
        )  # fmt: skip
    except (StartError, PortInUse) as e:
        print(f"agentpool demo: {e}")
        return 1
