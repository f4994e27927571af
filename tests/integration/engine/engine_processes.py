"""Start engines (and the directory and router) from their command lines as subprocesses, for tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REDIS_URL = "redis://127.0.0.1:6379/0"
PAGE = 4


@dataclass
class Proc:
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


async def launch(name: str, module: str, *args: str) -> Proc:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    p = Proc(name, proc)
    p._reader = asyncio.create_task(p._read())
    return p


def engine_config(node_id: str, **kw: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "nodeId": node_id,
        "port": 0,
        "role": "both",
        "pageSize": PAGE,
        "hostKvBytes": 256 * 16384,
        "blockBytes": 16384,
        "reportIntervalS": 0.2,
        "sim": {"timeScale": 1.0, "c0": 0.01, "c1": 1e-4, "d0": 0.005, "d1": 0.0, "d2": 0.0},
        "fetch": {"timeoutS": 3.0},
    }
    for k, v in kw.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    return cfg


async def start_engine(tmp: Path, cfg: dict[str, Any]) -> Proc:
    path = tmp / f"engine-{cfg['nodeId']}.json"
    path.write_text(json.dumps(cfg))
    p = await launch(f"engine {cfg['nodeId']}", "agentpool.engine", "--config", str(path))
    p.url = (await p.wait_for(r"engine listening on (http://\S+)")).group(1)
    return p


async def start_directory(namespace: str, token_file: Path) -> tuple[Proc, str]:
    d = await launch(
        "directory", "agentpool.directory",
        "--host", "127.0.0.1", "--port", "0", "--redis-url", REDIS_URL, "--namespace", namespace,
        "--page-size", str(PAGE), "--auth-token-file", str(token_file),
    )  # fmt: skip
    m = await d.wait_for(r"directory listening on (\S+)")
    return d, m.group(1)


def gen_body(
    rid: str, tokens: list[int], phase: str = "both", max_tokens: int = 4, **kw: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "request_id": rid,
        "dispatch_seq": 0,
        "phase": phase,
        "endpoint": "completion",
        "body": {"max_tokens": max_tokens},
        "prompt_token_ids": tokens,
    }
    body.update(kw)
    return body


async def generate(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with http.post(url + "/agentpool/v1/generate", json=body) as r:
        assert r.status == 200, await r.text()
        return [json.loads(line) for line in (await r.text()).splitlines() if line]


async def state(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/agentpool/v1/state") as r:
        assert r.status == 200
        out: dict[str, Any] = await r.json()
        return out


async def wait_until(check: Callable[[], Awaitable[bool]], within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
