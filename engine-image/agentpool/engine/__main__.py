"""``python -m agentpool.engine --config engine.yaml``: one engine agent (see ``config.py``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from agentpool.directory.auth import ConfigurationError as DirectoryTlsError
from agentpool.engine.config import ConfigError, load_config
from agentpool.engine.errors import BackendUnavailable
from agentpool.secret_file import SecretFileError
from agentpool.secret_file.tls import TlsFilesError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m agentpool.engine",
        description="The agentpool engine agent: serves prefill or decode for the router, switches role "
        "in place, keeps a host KV pool peers read with NIXL, publishes KV events to the directory.",
    )
    p.add_argument("--config", type=Path, required=True, help="engine config file (YAML or JSON)")
    p.add_argument("--host", help="listen address (overrides the config)")
    p.add_argument("--port", type=int, help="listen port, 0 for a free one (overrides the config)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p.parse_args(argv)


async def _serve(args: argparse.Namespace) -> int:
    from agentpool.engine.app import EngineApp

    cfg = load_config(args.config)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        cfg = cfg.model_copy(update=overrides)
    engine = EngineApp(cfg)
    await engine.start()
    # one write of one line: log lines from other threads go to the same pipe in tests and pods
    sys.stdout.write(f"engine listening on {engine.url}\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(engine.failed.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for w in waits:
        w.cancel()
    await engine.stop()
    if engine.failed.is_set():
        print(f"engine: stopped after a failure: {engine.failure}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("nixl").setLevel(logging.WARNING)
    try:
        return asyncio.run(_serve(args))
    except (ConfigError, SecretFileError, BackendUnavailable, DirectoryTlsError, TlsFilesError) as e:
        print(f"engine: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            pass
        return 0


if __name__ == "__main__":
    sys.exit(main())
