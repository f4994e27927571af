"""Makes ``tests/`` importable, so that test directories share helpers (``process_helpers``), and
keeps the per-user token files (``agentpool.secret_file.local_tokens``) of every service the tests
start, in process or as a subprocess, in a folder of this run instead of the user's own; under
pytest-xdist, gives each worker ports of its own."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from agentpool.local.pool import DEFAULT_LOCAL_PORTS, LOCAL_PORTS_ENV
from agentpool.secret_file.local_tokens import TOKEN_DIR_ENV

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.append(TESTS)

_TOKENS = tempfile.TemporaryDirectory(prefix="agentpool-test-tokens-")
os.environ[TOKEN_DIR_ENV] = str(Path(_TOKENS.name) / "tokens")


def worker_ports(worker: str, workers: int, ports: range = DEFAULT_LOCAL_PORTS) -> range:
    """The share of ``ports`` of pytest-xdist worker ``worker`` (``gw0``, ``gw1``, ...) of ``workers``: a
    port one worker picked and has not bound yet is never picked by another worker, nor by a pool
    one of them starts (``agentpool up`` reads the same variable)."""
    index = int(worker.removeprefix("gw"))
    size = len(ports) // workers
    return ports[index * size : (index + 1) * size]


if "PYTEST_XDIST_WORKER" in os.environ:
    share = worker_ports(os.environ["PYTEST_XDIST_WORKER"], int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ[LOCAL_PORTS_ENV] = f"{share.start}-{share.stop - 1}"
