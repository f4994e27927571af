"""Start engines from their command lines as subprocesses, for tests (the process handle, the directory
and the router: ``tests/process_helpers.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from process_helpers import ENGINE_AUTH, Proc, engine_token_file, free_port, launch

PAGE = 4
SGLANG_STANDIN = str(Path(__file__).with_name("sglang_standin.py"))


def sglang_checked_section(tmp: Path, node: str) -> dict[str, Any]:
    """An agent's ``sglang`` section launching the stand-in, whose decode side asks the prefill side's
    bootstrap server for the room (a transfer can fail)."""
    return {
        "model": "stand-in/model",
        "port": free_port(),
        "kvEventsEndpoint": f"tcp://127.0.0.1:{free_port()}",
        "bootstrapPort": free_port(),
        "launcher": [
            sys.executable, SGLANG_STANDIN, "--record", str(tmp / f"argv-{node}.json"), "--load-s", "0.2",
            "--standin-check-rooms",
        ],
        "requireGpu": False,
        "loadPollS": 0.2,
    }  # fmt: skip


def metric_value(text: str, name: str) -> float:
    """The value of an unlabelled sample ``name`` in a Prometheus exposition (0 when absent)."""
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def engine_config(node_id: str, **kw: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "nodeId": node_id,
        "tokenFile": str(engine_token_file()),
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


async def start_engine(tmp: Path, cfg: dict[str, Any], *args: str) -> Proc:
    """``python -m agentpool.engine --config <cfg> args``, once it listens (``url`` set)."""
    path = tmp / f"engine-{cfg['nodeId']}.json"
    path.write_text(json.dumps(cfg))
    p = await launch(f"engine {cfg['nodeId']}", "agentpool.engine", "--config", str(path), *args)
    p.url = (await p.wait_for(r"engine listening on (http://\S+)")).group(1)
    return p


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
    async with http.post(url + "/agentpool/v1/generate", json=body, headers=ENGINE_AUTH) as r:
        assert r.status == 200, await r.text()
        return [json.loads(line) for line in (await r.text()).splitlines() if line]


async def state(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/agentpool/v1/state") as r:
        assert r.status == 200
        out: dict[str, Any] = await r.json()
        return out


async def wait_ready(http: aiohttp.ClientSession, engine: Proc, what: str, within_s: float = 30) -> None:
    """Until the engine's ``/ready`` answers 200 (``what`` names the wait in a failure)."""

    async def ready() -> bool:
        async with http.get(engine.url + "/ready") as r:
            return r.status == 200

    await wait_until(ready, within_s, what, alive=[engine])


async def wait_until(
    check: Callable[[], Awaitable[bool]], within_s: float, what: str, alive: Sequence[Proc] = ()
) -> None:
    """Poll ``check`` until it holds; fails at the deadline, or at once with its output when a process
    in ``alive`` has exited (a connection refused by a dead service then says why it died)."""
    deadline = time.monotonic() + within_s
    while True:
        for p in alive:
            p.assert_alive(f"while waiting for {what}")
        try:
            if await check():
                return
        except aiohttp.ClientConnectionError:
            if not alive:
                raise
            for p in alive:  # refused because one died: say so, with its output
                await p.assert_exited_not(within_s=1.0, context=f"while waiting for {what}")
            raise
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


REPORT_TOKEN = "r" * 32


class Pool:
    """A router on a known port (started from its CLI) and the engines reporting to it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[Proc] = []
        self.configs: dict[str, dict[str, Any]] = {}
        report_token = tmp / "report-token"
        report_token.write_text(REPORT_TOKEN)
        self.report_token = report_token
        self.common: dict[str, Any] = {"routers": [{"url": self.url, "tokenFile": str(report_token)}]}

    async def engine(self, node: str, role: str, **kw: Any) -> Proc:
        cfg = engine_config(node, role=role, **self.common, **kw)
        self.configs[node] = cfg
        p = await start_engine(self.tmp, cfg)
        self.procs.append(p)
        return p

    async def router(self, engines: list[tuple[Proc, str, str]]) -> Proc:
        config = self.tmp / "router.json"
        nodes = [{"id": node, "url": p.url, "role": role} for p, node, role in engines]
        config.write_text(
            json.dumps({"model": "test-model", "policy": "least-loaded", "pageSize": PAGE, "nodes": nodes})
        )
        router = await launch(
            "router", "agentpool.router", "--config", str(config), "--host", "127.0.0.1",
            "--port", str(self.port), "--report-token-file", str(self.report_token),
            "--engine-token-file", str(engine_token_file()),
        )  # fmt: skip
        self.procs.append(router)
        await router.wait_for(r"router listening on (http://\S+)")
        async with aiohttp.ClientSession() as http:

            async def reported() -> bool:
                for p, _, _ in engines:
                    s = await state(http, p.url)
                    if s["reports_sent"] < 2 or s["report_error"] is not None:
                        return False
                async with http.get(self.url + "/ready") as r:
                    return r.status == 200

            await wait_until(reported, 60, "the router to take every engine's reports", alive=self.procs)
        return router

    async def stop(self) -> None:
        for p in self.procs:
            if p.proc.returncode is None:
                os.kill(p.proc.pid, signal.SIGCONT)
            await p.stop()
