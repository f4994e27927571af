"""The planner of a local pool: the same controller as in a cluster, with roles in files.

``python -m agentpool.local.planner --pool NAME --roles-dir DIR --engine NAME=URL [...] --router URL
--router-token-file F --directory HOST:PORT --directory-token-file F --settings planner.json``

It runs :class:`agentpool.planner.controller.PlannerController` with a
:class:`~agentpool.local.file_roles.FileRoleBoard` instead of pod annotations, polls the routers for
work records and iteration records, pushes fitted models to them, and tells the directory when an
engine serves its new phase, as ``python -m agentpool.planner`` does in a cluster. No restart
state is kept (a local pool starts fresh). SIGTERM or SIGINT stops it (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry

from agentpool.directory.client import DirectoryClient
from agentpool.local.file_roles import FileRoleBoard
from agentpool.models import MoeShape
from agentpool.planner.controller import PlannerController, PlannerError
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.metrics import PlannerMetrics
from agentpool.planner.process import drive, serve_until_signal
from agentpool.planner.roles import ObjectRef, ServedRoles
from agentpool.planner.router_models import ModelBroadcast
from agentpool.planner.router_source import RouterWorkSource
from agentpool.planner.settings_file import PlannerSettings
from agentpool.secret_file.local_tokens import router_and_directory_tokens

log = logging.getLogger("agentpool.local.planner")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agentpool.local.planner", description=__doc__)
    p.add_argument("--pool", required=True, help="the pool's name (Events are about it)")
    p.add_argument("--roles-dir", type=Path, required=True, help="a desired-role file per engine")
    p.add_argument("--engine", action="append", required=True, help="NAME=URL of an engine (repeatable)")
    p.add_argument("--router", action="append", required=True, help="a router's base URL (repeatable)")
    p.add_argument(
        "--router-token-file",
        type=Path,
        default=None,
        help="the routers' report token (default: the per-user file)",
    )
    p.add_argument("--directory", default=None, help="the directory's HOST:PORT (told of phase switches)")
    p.add_argument("--directory-token-file", type=Path, default=None)
    p.add_argument("--settings", type=Path, required=True, help="planner settings (YAML/JSON), reloaded")
    p.add_argument("--experts-active", type=int, default=0)
    p.add_argument("--experts-total", type=int, default=0)
    p.add_argument("--poll-interval-s", type=float, default=2.0)
    p.add_argument("--log-level", default="INFO")
    return p


def engines_of(specs: list[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise ValueError(f"--engine takes NAME=http://HOST:PORT, got {spec!r}")
        out[name] = url
    return out


async def run(args: argparse.Namespace, stop: asyncio.Event) -> int:
    try:
        engines = engines_of(args.engine)
        settings = PlannerSettings({}, args.settings)
        shape = MoeShape(args.experts_active, args.experts_total)
        router_token, directory_token = await asyncio.to_thread(
            router_and_directory_tokens,
            args.router_token_file,
            args.directory_token_file,
            bool(args.directory),
        )
    except (ValueError, OSError) as e:
        log.error("planner not started: %s", e)
        return 1
    inbox = PlannerInbox()
    served = ServedRoles()  # each engine's KV capacity, from its reports through the routers
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(aiohttp.ClientSession())
        controller = PlannerController(
            pods=FileRoleBoard(args.roles_dir, engines, session),
            inbox=inbox,
            config=settings,
            pool=ObjectRef("agentpool.io/v1alpha1", "AgentServingPool", args.pool, "local"),
            metrics=PlannerMetrics(CollectorRegistry()),
            shape=shape,
            kv_capacity=served,
        )
        broadcast = ModelBroadcast(args.router, session, token=router_token)
        controller.models_out = broadcast
        if args.directory:
            controller.directory = await stack.enter_async_context(
                DirectoryClient(args.directory, token=directory_token)
            )
        source = RouterWorkSource(
            args.router, inbox, session, interval_s=args.poll_interval_s, models=broadcast, served=served
        )
        code = await drive(controller, source, settings, stop, (PlannerError, ValueError))
    if code == 0:
        log.info("planner stopped")
    return code


async def serve(args: argparse.Namespace) -> int:
    return await serve_until_signal(run, args)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    raise SystemExit(main())
