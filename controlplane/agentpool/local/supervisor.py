"""Start, watch and stop the local pool's processes: each in its own process group, nothing left behind.

A :class:`ProcessSpec` is one service: its command line, what it reads on stdin (Redis takes its
configuration, password included, there, so no secret is on a command line), its log file and
how to tell it is ready (a TCP port accepting, or an HTTP URL answering 200). The
:class:`Supervisor` starts specs in order, waits for each to be ready, and stops them all in
reverse order: SIGTERM to the process group, SIGKILL to the group after ``grace_s``. A spec
that exits or does not get ready in time fails the start with the last lines of its log, and
everything started before it is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp


class StartError(RuntimeError):
    """A service did not start; the message says which and why."""


@dataclass(frozen=True, slots=True)
class TcpReady:
    host: str
    port: int

    async def check(self, session: aiohttp.ClientSession) -> bool:
        del session
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 1.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True


@dataclass(frozen=True, slots=True)
class HttpReady:
    url: str

    async def check(self, session: aiohttp.ClientSession) -> bool:
        try:
            async with session.get(self.url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    name: str
    argv: Sequence[str]
    ready: TcpReady | HttpReady | None
    log: Path
    stdin: bytes | None = None
    env: dict[str, str] | None = None
    ready_timeout_s: float = 60.0
    essential: bool = True  # the pool cannot run without it (an engine is not: the pool degrades)


@dataclass(slots=True)
class Running:
    spec: ProcessSpec
    proc: asyncio.subprocess.Process
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


class Supervisor:
    def __init__(self, grace_s: float = 10.0) -> None:
        self.grace_s = grace_s
        self.running: list[Running] = []
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Supervisor:
        self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_all()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def start(self, spec: ProcessSpec) -> Running:
        """Start ``spec`` and wait until it is ready; StartError (and it stopped) if it is not."""
        spec.log.parent.mkdir(parents=True, exist_ok=True)
        with spec.log.open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=asyncio.subprocess.PIPE if spec.stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=spec.env,
                start_new_session=True,  # its own process group: stopped as a whole, children included
            )
        run = Running(spec, proc)
        self.running.append(run)
        if spec.stdin is not None and proc.stdin is not None:
            proc.stdin.write(spec.stdin)
            await proc.stdin.drain()
            proc.stdin.close()
        await self._wait_ready(run)
        return run

    async def start_all(
        self, specs: Sequence[ProcessSpec], on_ready: Callable[[Running], None] | None = None
    ) -> None:
        """Start ``specs`` in order; on any failure stop what was started, then raise StartError."""
        try:
            for spec in specs:
                run = await self.start(spec)
                if on_ready is not None:
                    on_ready(run)
        except BaseException:
            await self.stop_all()
            raise

    async def _wait_ready(self, run: Running) -> None:
        spec = run.spec
        deadline = time.monotonic() + spec.ready_timeout_s
        assert self._session is not None, "use the Supervisor as an async context manager"
        while True:
            if not run.alive:
                tail = log_tail(spec.log)
                raise StartError(
                    f"{spec.name} exited with code {run.proc.returncode} while starting"
                    + (f"; its log ({spec.log}) ends:\n{tail}" if tail else "")
                )
            if spec.ready is None or await spec.ready.check(self._session):
                return
            if time.monotonic() > deadline:
                raise StartError(
                    f"{spec.name} was not ready within {spec.ready_timeout_s:.0f} s; see {spec.log}"
                )
            await asyncio.sleep(0.1)

    def exited(self) -> list[Running]:
        """Processes that have exited since they started."""
        return [r for r in self.running if not r.alive]

    async def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to ``name``'s process group (tests: an engine dies mid-run)."""
        for r in self.running:
            if r.spec.name == name and r.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(r.pid, sig)
                await r.proc.wait()
                return
        raise KeyError(f"no running process {name!r}")

    async def stop_all(self) -> None:
        """SIGTERM every process group, newest first; SIGKILL what is left after ``grace_s``."""
        for r in reversed(self.running):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(r.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for r in reversed(self.running):
            left = max(0.0, deadline - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(r.proc.wait(), left)
        for r in self.running:
            # the group, even when its leader is gone: a child it started may still run
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(r.pid, signal.SIGKILL)
            if r.alive:
                await r.proc.wait()
        self.running.clear()
