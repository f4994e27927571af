"""`agentpool up -f POOL.yaml`: the whole pool on this machine, as real processes, until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from agentpool.api import byte_quantity
from agentpool.local.pool import (
    DEFAULT_PRESET,
    LOCAL_PORTS_ENV,
    LocalOptions,
    ManifestError,
    engine_available,
    load_manifest,
    local_ports,
)
from agentpool.local.up import serve
from agentpool.sim.presets import presets

HELP = "run an AgentServingPool on this machine: Redis, directory, sim engines, router, planner"


def add_pool_arguments(parser: argparse.ArgumentParser, manifest_required: bool = True) -> None:
    """The options ``up`` and ``demo`` share."""
    parser.add_argument(
        "-f", "--file", type=Path, required=manifest_required, help="the AgentServingPool manifest (YAML)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address every service listens on")
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="the router's port (the other services get free ports of 20000-32767, "
        f"or of ${LOCAL_PORTS_ENV}: LOW-HIGH)",
    )
    parser.add_argument("--redis-url", default=None, help="use this Redis (default: start redis-server)")
    parser.add_argument("--redis-password-file", type=Path, default=None, help="password of --redis-url")
    parser.add_argument("--time-scale", type=float, default=1.0, help="sim engines: model seconds per second")
    parser.add_argument(
        "--host-kv-size", default=None, help="host KV pool per engine, e.g. 256Mi (default: the manifest's)"
    )
    parser.add_argument(
        "--preset", default=DEFAULT_PRESET, help=f"node class the sim engines model ({', '.join(presets())})"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep configs, secrets and logs here")
    parser.add_argument(
        "--no-engines", action="store_true", help="start the control plane only (no engine processes)"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_pool_arguments(parser)


def options_from(args: argparse.Namespace) -> LocalOptions:
    if args.time_scale <= 0:
        raise ManifestError(f"--time-scale must be positive, got {args.time_scale}")
    if not 0 < args.port < 65536:
        raise ManifestError(f"--port must be within 1..65535, got {args.port}")
    try:
        host_kv = byte_quantity(args.host_kv_size) if args.host_kv_size else None
    except ValueError as e:
        raise ManifestError(f"--host-kv-size: {e}") from None
    name = args.preset or DEFAULT_PRESET
    if name not in presets():
        raise ManifestError(f"--preset: unknown node preset {name!r}; known: {', '.join(presets())}")
    if not args.no_engines and not engine_available():
        raise ManifestError(
            "the engine agent (agentpool.engine) is not installed here; --no-engines starts the control "
            "plane without engines"
        )
    return LocalOptions(
        host=args.host,
        router_port=args.port,
        redis_url=args.redis_url,
        redis_password_file=args.redis_password_file,
        time_scale=args.time_scale,
        host_kv_bytes=host_kv,
        engines=not args.no_engines,
        preset=name,
        ports=local_ports(),
    )


def run(args: argparse.Namespace) -> int:
    try:
        pool = load_manifest(args.file)
        options = options_from(args)
    except ManifestError as e:
        print(f"agentpool up: {e}")
        return 2
    return asyncio.run(serve(pool, options, args.workdir))
