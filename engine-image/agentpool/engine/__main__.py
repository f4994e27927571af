"""``python -m agentpool.engine --config engine.yaml``: one engine agent (see ``config.py``).

SIGTERM (what Kubernetes sends a pod it replaces or removes) drains the engine before it stops: it
admits nothing more (``/ready`` answers 503 and its next report says it is not accepting, so routers
send new work elsewhere), hands its queue back and lets the requests it runs finish, for at most
``--drain-timeout-s``; then it stops. SIGINT, or a second SIGTERM, stops it at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING

from agentpool.directory.auth import ConfigurationError as DirectoryTlsError
from agentpool.engine.config import ConfigError, load_config
from agentpool.engine.errors import BackendUnavailable
from agentpool.secret_file import SecretFileError
from agentpool.secret_file.tls import TlsFilesError

if TYPE_CHECKING:
    from agentpool.engine.app import EngineApp

log = logging.getLogger("agentpool.engine")

DRAIN_TIMEOUT_S = 270.0
"""Default for ``--drain-timeout-s``: under the 300 s termination grace the operator gives engine pods."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m agentpool.engine",
        description="The agentpool engine agent: serves prefill or decode for the router, switches role "
        "in place, keeps a host KV pool peers read with NIXL, publishes KV events to the directory.",
    )
    p.add_argument("--config", type=Path, required=True, help="engine config file (YAML or JSON)")
    p.add_argument("--host", help="listen address (overrides the config)")
    p.add_argument("--port", type=int, help="listen port, 0 for a free one (overrides the config)")
    p.add_argument(
        "--drain-timeout-s",
        type=float,
        default=DRAIN_TIMEOUT_S,
        help="on SIGTERM, how long running requests may take to finish before the engine stops "
        f"anyway (default {DRAIN_TIMEOUT_S:.0f}; keep it under the pod's termination grace period)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = p.parse_args(argv)
    if not args.drain_timeout_s >= 0:
        p.error("--drain-timeout-s must be a number of seconds, 0 or more")
    return args


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
    loop = asyncio.get_running_loop()
    drain = asyncio.Event()  # SIGTERM: finish what runs, then stop
    stop = asyncio.Event()  # SIGINT or a second SIGTERM: stop now
    loop.add_signal_handler(signal.SIGTERM, lambda: (stop if drain.is_set() else drain).set())
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await _first_of(drain.wait(), stop.wait(), engine.failed.wait())
    if drain.is_set() and not stop.is_set() and not engine.failed.is_set():
        await _drain(engine, args.drain_timeout_s, stop)
    await engine.stop()
    if engine.failed.is_set():
        print(f"engine: stopped after a failure: {engine.failure}", file=sys.stderr)
        return 1
    return 0


async def _first_of(*waits: Awaitable[object]) -> None:
    """Wait until one of ``waits`` is done; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


async def _drain(engine: EngineApp, timeout_s: float, stop: asyncio.Event) -> None:
    """Retire the engine (no new work, its queue handed back) and wait until what runs has
    finished and peers hold no lease here, ``timeout_s`` has passed, ``stop`` is set or the engine
    fails."""
    log.info("SIGTERM: draining, at most %g s (SIGINT or SIGTERM again stops now)", timeout_s)
    engine.retire()
    try:
        await asyncio.wait_for(_first_of(engine.wait_retired(), stop.wait(), engine.failed.wait()), timeout_s)
    except TimeoutError:
        log.warning("drain: requests still running after %g s; stopping anyway", timeout_s)
    if engine.retired:
        log.info("drained: stopping")


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
