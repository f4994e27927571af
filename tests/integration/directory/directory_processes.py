"""Directory and Redis processes for the integration tests, started as users start them."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio as aioredis
from process_helpers import free_port, process_scratch_dir

REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
ROOT = Path(__file__).resolve().parents[3]
PYTHONPATH = os.pathsep.join(str(ROOT / r) for r in ("controlplane", "engine-image"))


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


TOKEN = "test-token-0123456789abcdef"


@functools.cache
def token_file() -> Path:
    """The token as a mounted Secret would hold it (with a trailing newline); one file per test
    process, removed at its exit."""
    path = process_scratch_dir() / "dir-token"
    path.write_text(TOKEN + "\n")
    return path


async def start_directory_process(
    namespace: str, *extra: str, port: int = 0
) -> tuple[asyncio.subprocess.Process, str]:
    """``python -m agentpool.directory`` as users start it: a token file, Redis, a port."""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentpool.directory",
        "--auth-token-file",
        str(token_file()),
        "--port",
        str(port),
        "--redis-url",
        REDIS_URL,
        "--namespace",
        namespace,
        "--page-size",
        "4",
        "--node-timeout-s",
        "60",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    assert line.startswith("directory listening on "), line
    return proc, line.split()[-1]


class PrivateRedis:
    """A private redis-server with AOF (``appendfsync`` as given) on a free port: killed (SIGKILL) and
    restarted on the same port and data directory by the test. The shared Redis on 6379 is never
    touched. Use it as ``async with PrivateRedis() as redis:`` (started; at the end killed and its
    data directory removed) or call :meth:`close` when done. The data directory lies in the test
    process's scratch directory, so one left by a test that never closed it goes at the process's
    exit."""

    def __init__(self, appendfsync: str = "always") -> None:
        self.appendfsync = appendfsync
        self.port = free_port()
        self.data = tempfile.mkdtemp(prefix="redis-", dir=process_scratch_dir())
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> PrivateRedis:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Kill the server and remove its data directory."""
        await self.kill()
        await asyncio.to_thread(shutil.rmtree, self.data, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.data,
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--save",
            "",
            stdout=asyncio.subprocess.DEVNULL,
        )
        client = aioredis.Redis(port=self.port)

        async def up() -> bool:
            try:
                return bool(await client.ping())
            except (OSError, aioredis.ConnectionError):
                return False

        await eventually(up)
        await client.aclose()

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
