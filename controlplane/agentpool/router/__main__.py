"""Run the router: ``python -m agentpool.router --config router.yaml [--host H] [--port P]``.

``--directory inprocess`` keeps a KV directory in this process (single-router deployments, demos);
``--directory HOST:PORT`` uses the directory service over gRPC. ``--loop uvloop`` runs the router on
uvloop (an optional dependency, ``pip install uvloop``), which cuts the per-request overhead of the
event loop; the default is the standard asyncio loop.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from pathlib import Path

from aiohttp import web

from agentpool.kv import Directory
from agentpool.router.config import ConfigFile
from agentpool.router.directory_view import DirectoryView, InProcessDirectoryView
from agentpool.router.server import build_app
from agentpool.router.service import RouterService


def directory_view(
    spec: str, page_size: int, token_file: Path | None = None, ca_file: Path | None = None
) -> DirectoryView:
    if spec == "inprocess":
        if token_file is not None or ca_file is not None:
            raise SystemExit("--directory-token-file/--directory-ca-file need --directory HOST:PORT")
        return InProcessDirectoryView(Directory(page_size), time.monotonic)
    from agentpool.router.grpc_directory import GrpcDirectoryView

    token = token_file.read_text().strip() if token_file is not None else None
    certs = ca_file.read_bytes() if ca_file is not None else None
    return GrpcDirectoryView(spec, token=token, root_certificates=certs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentpool.router", description=__doc__)
    parser.add_argument(
        "--config", required=True, help="router config file (YAML or JSON); reloaded on change"
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--directory", default="inprocess", help="'inprocess' or the directory's HOST:PORT")
    parser.add_argument(
        "--directory-token-file", type=Path, default=None, help="bearer token for the directory service"
    )
    parser.add_argument(
        "--directory-ca-file", type=Path, default=None, help="CA certificate (PEM): use TLS to the directory"
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop: the standard asyncio one, or uvloop (optional dependency: pip install uvloop)",
    )
    args = parser.parse_args(argv)
    loop = event_loop(args.loop, parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config_file = ConfigFile(args.config)
    config = config_file.load()
    view = directory_view(args.directory, config.page_size, args.directory_token_file, args.directory_ca_file)
    service = RouterService(config, view, config_file=config_file)
    web.run_app(build_app(service), host=args.host, port=args.port, access_log=None, loop=loop)


def event_loop(kind: str, parser: argparse.ArgumentParser) -> asyncio.AbstractEventLoop:
    if kind == "asyncio":
        return asyncio.new_event_loop()
    try:
        import uvloop
    except ImportError:
        parser.error("--loop uvloop needs the optional dependency uvloop (pip install uvloop)")
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


if __name__ == "__main__":
    main()
