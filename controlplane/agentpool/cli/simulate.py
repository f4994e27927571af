"""`agentpool simulate`, plus ``-f POOL.yaml``: what a pool manifest would do on a trace."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from agentpool.local.pool import ManifestError, read_manifest
from agentpool.local.pool_sim import apply_pool, pool_system
from agentpool.sim import cli as sim_cli
from agentpool.sim.systems import DISAGGREGATED_DEFAULT

HELP = sim_cli.HELP + " (-f POOL.yaml: the pool a manifest describes)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sim_cli.add_arguments(parser)
    parser.add_argument(
        "-f",
        "--file",
        type=Path,
        default=None,
        help="an AgentServingPool manifest: simulate its pool (nodes, split, SLO, planner, policy), its "
        "settings over the flags that set the same (--nodes, --min-relative-gain, --no-refit, ...); "
        "--systems adds others to compare",
    )


def run(args: argparse.Namespace) -> int:
    if args.file is None:
        return sim_cli.run(args)
    try:
        pool = read_manifest(args.file)
        own = pool_system(pool)
    except (ManifestError, ValueError) as e:
        raise SystemExit(f"agentpool simulate: {e}") from None
    default = ",".join(DISAGGREGATED_DEFAULT)
    given = [] if args.systems == default else [s for s in args.systems.split(",") if s.strip() != own]
    args.systems = ",".join([own, *given])
    return sim_cli.run(args, adjust=partial(apply_pool, pool=pool))
