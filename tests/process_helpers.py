"""Start services from their command lines (``python -m ...``) as subprocesses, for tests: one process
handle for every service, the directory and router start-ups, a Redis key namespace, a kubeconfig."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis

import agentpool.local.pool as local_pool

REDIS_URL = "redis://127.0.0.1:6379/0"
ENGINE_TOKEN = "engine-token-for-the-tests-0123456789"
"""The engine token the tests' engines require and their routers send."""
ENGINE_AUTH = {"Authorization": f"Bearer {ENGINE_TOKEN}"}
"""Headers of a test's own calls to an engine's API."""


@functools.cache
def process_scratch_dir() -> Path:
    """One directory for this test process's small shared files (the token files), removed when the
    process exits."""
    path = Path(tempfile.mkdtemp(prefix="agentpool-tests-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def engine_token_file() -> Path:
    """A file holding :data:`ENGINE_TOKEN` (``tokenFile`` of the engines, ``--engine-token-file``)."""
    path = process_scratch_dir() / "engine-token"
    path.write_text(ENGINE_TOKEN + "\n")
    return path


@dataclass
class Proc:
    """A service started with :func:`launch`: its stdout and stderr, line by line, in ``output``."""

    name: str
    proc: asyncio.subprocess.Process
    output: list[str] = field(default_factory=list)
    url: str = ""
    _reader: asyncio.Task[None] | None = None

    def text(self) -> str:
        return "".join(self.output)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.output.append(line.decode(errors="replace"))

    async def wait_for(self, pattern: str, within_s: float = 60.0) -> re.Match[str]:
        """The first output line matching ``pattern`` (fails with the output if it exits first)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + within_s
        while True:
            for line in self.output:
                m = regex.search(line)
                if m is not None:
                    return m
            if self.proc.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.name} never printed {pattern!r}; its output:\n{self.text()}")
            await asyncio.sleep(0.05)

    def assert_alive(self, context: str = "") -> None:
        """Fail with the output when the process has exited."""
        if self.proc.returncode is not None:
            raise AssertionError(
                f"{self.name} exited with {self.proc.returncode} {context}; its output:\n{self.text()}"
            )

    async def assert_exited_not(self, within_s: float, context: str = "") -> None:
        """Fail with the output when the process exits within ``within_s`` (a refused connection may
        come a moment before the exit status)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), timeout=within_s)
        self.assert_alive(context)

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()

    async def stop(self, within_s: float = 15.0) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=within_s)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        assert self.proc.returncode is not None
        return self.proc.returncode


async def launch(name: str, module: str, *args: str, env: dict[str, str] | None = None) -> Proc:
    """``python -m module args``; ``env``: variables set over this process's environment."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip
    p = Proc(name, proc)
    p._reader = asyncio.create_task(p._read())
    return p


async def stop_cleanly(procs: Sequence[Proc]) -> None:
    """Stop ``procs``, the last started first: each must exit 0 with no traceback in its output."""
    for p in reversed(procs):
        assert await p.stop() == 0, p.text()
        assert "Traceback" not in p.text(), p.text()


@contextlib.asynccontextmanager
async def running(name: str, module: str, *args: str) -> AsyncIterator[Proc]:
    p = await launch(name, module, *args)
    try:
        yield p
    finally:
        await p.stop()


async def start_directory(
    namespace: str, token_file: Path, page_size: int, port: int = 0, *extra: str
) -> tuple[Proc, str]:
    """``python -m agentpool.directory`` on Redis with a token (and ``extra`` arguments); the process
    and its address."""
    d = await launch(
        "directory", "agentpool.directory",
        "--host", "127.0.0.1", "--port", str(port), "--redis-url", REDIS_URL, "--namespace", namespace,
        "--page-size", str(page_size), "--auth-token-file", str(token_file), *extra,
    )  # fmt: skip
    m = await d.wait_for(r"directory listening on (\S+)")
    return d, m.group(1)


async def start_router(config: Path, *args: str) -> tuple[Proc, str]:
    """``python -m agentpool.router`` on a free port; the process and its URL."""
    router = await launch(
        "router", "agentpool.router", "--config", str(config), "--host", "127.0.0.1", "--port", "0", *args
    )
    m = await router.wait_for(r"router listening on (http://\S+)")
    return router, m.group(1)


@contextlib.asynccontextmanager
async def redis_namespace(prefix: str) -> AsyncIterator[str]:
    """A unique key namespace on the shared Redis; its keys are deleted afterwards."""
    ns = f"{prefix}:{uuid.uuid4().hex}"
    try:
        yield ns
    finally:
        await delete_namespace(ns)


async def delete_namespace(namespace: str) -> None:
    """Delete every key under ``namespace:`` on the shared Redis (never FLUSHDB: others use it)."""
    r = aioredis.Redis.from_url(REDIS_URL)
    try:
        keys = [k async for k in r.scan_iter(match=f"{namespace}:*", count=1000)]
        if keys:
            await r.delete(*keys)
    finally:
        await r.aclose()


_HANDED_OUT: set[int] = set()
"""Ports this test process has handed out: a test reserves some before its services bind them."""


def free_port() -> int:
    """A port for a service a test starts: free now, outside the kernel's ephemeral range (which every
    outgoing connection and ``bind(0)`` of the suite draws from, so a port picked there can be taken
    before the service binds it), never handed out twice by this process, and of this test worker's
    own range (``conftest.py``)."""
    return local_pool.free_port("127.0.0.1", _HANDED_OUT, local_pool.local_ports())


def kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig for the API server at ``url`` (KMock), no credentials."""
    cluster = {"name": "kmock", "cluster": {"server": url.rstrip("/")}}
    context = {"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}
    body = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster], "contexts": [context]}
    body |= {"users": [{"name": "test", "user": {}}], "current-context": "kmock"}
    path.write_text(json.dumps(body))
    return path
