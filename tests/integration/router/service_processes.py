"""Start the control-plane services from their command lines (``python -m ...``) as subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class Service:
    name: str
    proc: asyncio.subprocess.Process
    output: list[str] = field(default_factory=list)
    _reader: asyncio.Task[None] | None = None

    def text(self) -> str:
        return "".join(self.output)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.output.append(line.decode(errors="replace"))

    async def wait_for(self, pattern: str, within_s: float = 30.0) -> re.Match[str]:
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


async def launch(name: str, module: str, *args: str) -> Service:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    service = Service(name, proc)
    service._reader = asyncio.create_task(service._read())
    return service


@contextlib.asynccontextmanager
async def running(name: str, module: str, *args: str) -> AsyncIterator[Service]:
    service = await launch(name, module, *args)
    try:
        yield service
    finally:
        await service.stop()
