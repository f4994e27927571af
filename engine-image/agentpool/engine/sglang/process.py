"""SGLang as the agent's child process: start it in its own process group, forward its output to the
agent's log, wait for its ``/health``, stop it (SIGTERM to the group, SIGKILL after a grace period).

A server that exits on its own is an error (:class:`SglangExited`, with its last output lines): the
agent stops too, so the pod restarts, rather than serving without a backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Sequence

import aiohttp

from agentpool.engine.errors import EngineError
from agentpool.errors import UnavailableError

log = logging.getLogger("agentpool.engine.sglang.server")
_TAIL_LINES = 40


class SglangExited(EngineError, UnavailableError):
    """The SGLang server exited (or never became healthy; 503)."""


class SglangProcess:
    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        self.proc: asyncio.subprocess.Process | None = None
        self.tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._forward: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    async def start(self) -> None:
        log.info("starting SGLang: %s", " ".join(self.argv))
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group: a stop reaches its workers too
            )
        except OSError as e:
            raise SglangExited(f"cannot start SGLang ({self.argv[0]}): {e}") from None
        self._forward = asyncio.create_task(self._forward_output())

    async def _forward_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()
            self.tail.append(text)
            log.info("%s", text)

    def _exited(self, code: int | None) -> SglangExited:
        last = "\n".join(self.tail) or "(no output)"
        return SglangExited(f"SGLang exited with code {code}; its last output:\n{last}")

    async def wait_healthy(self, http: aiohttp.ClientSession, url: str, timeout_s: float) -> None:
        """Until ``GET {url}/health`` answers 200; raises when the server exits or the time is up."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.returncode is not None:
                await self._drain_output()
                raise self._exited(self.proc.returncode)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        log.info("SGLang is healthy at %s", url)
                        return
            if time.monotonic() > deadline:
                raise SglangExited(f"SGLang did not become healthy at {url} within {timeout_s:.0f} s")
            await asyncio.sleep(0.2)

    async def watch(self) -> None:
        """Returns never: raises :class:`SglangExited` when the server exits."""
        assert self.proc is not None
        code = await self.proc.wait()
        await self._drain_output()
        raise self._exited(code)

    async def _drain_output(self) -> None:
        if self._forward is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._forward), 2.0)

    async def stop(self, timeout_s: float) -> int | None:
        """SIGTERM to the process group, SIGKILL after ``timeout_s``; the exit code."""
        p = self.proc
        if p is None:
            return None
        if p.returncode is None:
            self._signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(p.wait(), timeout_s)
            except TimeoutError:
                log.warning("SGLang did not stop within %.0f s: killing it", timeout_s)
                self._signal(signal.SIGKILL)
                await p.wait()
        else:
            self._signal(signal.SIGKILL)  # the leader is gone: take its workers with it
        await self._drain_output()
        if self._forward is not None:
            self._forward.cancel()
        log.info("SGLang stopped (exit code %s)", p.returncode)
        return p.returncode

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
