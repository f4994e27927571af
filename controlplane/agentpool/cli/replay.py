"""`agentpool replay`: drive an agent trace through a running router over HTTP, then report."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path

import aiohttp

from agentpool.local.live_report import Progress
from agentpool.local.replay import ReplaySettings
from agentpool.local.run_replay import ReplayOutput, Slo, replay, served_model, write_reports
from agentpool.sim.run import bundled_trace_path
from agentpool.sim.trace import Conversation, TraceError, cap_context, load_claude_code

HELP = "replay an agent trace through a router's OpenAI API (streaming, branch headers) and report"


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload options ``replay`` and ``demo`` share."""
    parser.add_argument(
        "--trace", type=Path, default=None, help="Claude Code trace (JSONL, .gz ok); default: bundled sample"
    )
    parser.add_argument("--conversations", type=int, default=None, help="use only the first N conversations")
    parser.add_argument("--agents", type=int, default=8, help="conversations running at once (closed loop)")
    parser.add_argument("--duration", type=float, default=120.0, help="measured seconds after the warmup")
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds before the measurement starts")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="divide the trace's recorded pauses by this factor"
    )
    parser.add_argument(
        "--max-pause", type=float, default=None, help="cap (scaled) pauses at this many seconds"
    )
    parser.add_argument(
        "--max-output-tokens", type=int, default=None, help="cap each request's recorded output length"
    )
    parser.add_argument(
        "--no-branch-headers",
        action="store_true",
        help="send no x-agentpool-* headers (the router infers sessions: the stateless path)",
    )
    parser.add_argument("--shared-prefix", type=int, default=15000, help="shared system+tools prefix tokens")
    parser.add_argument("--ramp", type=float, default=0.0, help="start the agents evenly over N seconds")
    parser.add_argument(
        "--drain", type=float, default=120.0, help="seconds to wait for requests in flight at the end"
    )
    parser.add_argument("--out", type=Path, default=Path("replay-results"), help="report directory")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the router's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="model name (default: the router's /v1/models)")
    add_trace_arguments(parser)
    parser.add_argument("--slo-ttft-base", type=float, default=2.0, help="TTFT deadline base (s)")
    parser.add_argument(
        "--slo-ttft-per-token", type=float, default=1e-4, help="TTFT deadline per prompt token (s)"
    )
    parser.add_argument("--slo-tpot", type=float, default=0.1, help="TPOT limit (s)")
    parser.add_argument(
        "--unreachable-timeout",
        type=float,
        default=30.0,
        help="stop early (exit 1) once no request could connect to the router for this many seconds",
    )


def settings_from(args: argparse.Namespace, url: str, model: str) -> ReplaySettings:
    return ReplaySettings(
        url=url,
        model=model,
        agents=args.agents,
        duration_s=args.duration,
        warmup_s=args.warmup,
        time_scale=args.time_scale,
        max_pause_s=args.max_pause,
        max_output_tokens=args.max_output_tokens,
        branch_headers=not args.no_branch_headers,
        shared_prefix_tokens=args.shared_prefix,
        drain_s=args.drain,
        ramp_s=args.ramp,
        unreachable_s=args.unreachable_timeout,
    )


def command_line() -> str:
    return "agentpool " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def load_trace(args: argparse.Namespace) -> list[Conversation]:
    path = args.trace or bundled_trace_path()
    if not path.is_file():
        raise SystemExit(f"agentpool: no trace file {path}")
    try:
        return load_claude_code(path, limit=args.conversations)
    except TraceError as e:
        raise SystemExit(f"agentpool: bad trace {path}: {e}") from None


async def _main(args: argparse.Namespace) -> int:
    try:
        async with aiohttp.ClientSession() as session:
            served = await served_model(session, args.url)
    except (aiohttp.ClientError, ValueError, TimeoutError) as e:
        raise SystemExit(f"agentpool replay: cannot reach the router at {args.url}: {e}") from None
    model = args.model or served.id
    conversations = load_trace(args)
    removed = 0
    if served.context_length is not None:
        conversations, removed = cap_context(conversations, served.context_length)
        if removed:
            print(
                f"agentpool replay: {removed} trace requests over the router's "
                f"{served.context_length:,}-token context (and what waits on them) left out"
            )
    try:
        settings = settings_from(args, args.url, model)
    except ValueError as e:
        raise SystemExit(f"agentpool replay: {e}") from None
    slo = Slo(args.slo_ttft_base, args.slo_ttft_per_token, args.slo_tpot)
    progress = Progress(enabled=False if args.quiet else None)
    result = await replay(settings, conversations, slo, progress=progress)
    out = ReplayOutput(args.out, plots=not args.no_plots, command=command_line())
    extra = {
        "trace": str(args.trace or bundled_trace_path()),
        "context_length": served.context_length,
        "left_out_over_context": removed,
    }
    print(write_reports(out, settings, [result], extra))
    print(
        f"wrote {args.out / 'report.md'}, {args.out / 'results.json'}"
        + ("" if args.no_plots else " and PNG plots")
    )
    if result["summary"]["stopped_early"]:
        print(f"agentpool replay: stopped early: {result['summary']['stopped_early']}", file=sys.stderr)
        return 1
    return 0 if result["summary"]["failed"] == 0 else 1


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_main(args))
