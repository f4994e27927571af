"""An engine replaced under load, as a rolling update replaces it: the router and two engines from
their command lines, clients streaming chat completions through the router, SIGTERM to one engine.
It drains (what runs finishes, what arrives is handed back) and exits 0; the router places the rest
on the other engine: every client request is answered in full."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from engine_processes import engine_config, start_engine, wait_until
from process_helpers import Proc, free_port, launch, stop_cleanly

pytestmark = pytest.mark.integration
PAGE = 4
# a request takes about 0.2 s of prefill and 4 x 0.05 s of decode
SLOW = {"sim": {"c0": 0.2, "c1": 0.0, "d0": 0.05, "chunkTokens": 64}}
MAX_TOKENS = 5


async def one_completion(http: aiohttp.ClientSession, url: str, n: int) -> tuple[int, str, str]:
    """(status, streamed text, last SSE data) of one streamed chat completion."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"agent {n} asks for a few blocks of prompt " * 3}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    text, last = "", ""
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            return resp.status, await resp.text(), ""
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                last = line.removeprefix("data: ")
                if last != "[DONE]":
                    for choice in json.loads(last).get("choices", ()):  # none in an error event
                        text += (choice.get("delta") or {}).get("content") or ""
    return 200, text, last


async def test_an_engine_replaced_under_load_loses_no_request(tmp_path: Path) -> None:
    router_url = f"http://127.0.0.1:{free_port()}"
    procs: list[Proc] = []
    try:
        engines = []
        for node in ("e0", "e1"):
            cfg: dict[str, Any] = engine_config(node, routers=[{"url": router_url}], **SLOW)
            del cfg["tokenFile"]  # the per-user engine token, which the router sends too
            engines.append(await start_engine(tmp_path, cfg))
        procs.extend(engines)
        config = tmp_path / "router.json"
        nodes = [{"id": n, "url": e.url, "role": "both"} for n, e in zip(("e0", "e1"), engines, strict=True)]
        config.write_text(
            json.dumps({"model": "m", "policy": "least-loaded", "pageSize": PAGE, "nodes": nodes})
        )
        router = await launch(
            "router", "agentpool.router", "--config", str(config), "--host", "127.0.0.1",
            "--port", router_url.rsplit(":", 1)[1], "--directory", "inprocess",
        )  # fmt: skip
        procs.append(router)
        await router.wait_for(r"router listening on")
        async with aiohttp.ClientSession() as http:

            async def reported() -> bool:
                for e in engines:
                    async with http.get(e.url + "/agentpool/v1/state") as r:
                        s = await r.json()
                    if s["reports_sent"] < 1 or s["report_error"] is not None:
                        return False
                async with http.get(router_url + "/ready") as r:
                    return r.status == 200

            await wait_until(reported, 30, "both engines' reports", alive=procs)
            answers: list[tuple[float, tuple[int, str, str]]] = []
            stop_load = asyncio.Event()

            async def client(n: int) -> None:
                i = 0
                while not stop_load.is_set():
                    answers.append((time.monotonic(), await one_completion(http, router_url, n * 1000 + i)))
                    i += 1

            clients = [asyncio.create_task(client(n)) for n in range(6)]
            await asyncio.sleep(1.5)
            engines[0].proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(engines[0].proc.wait(), 15) == 0, engines[0].text()
            gone = time.monotonic()
            await asyncio.sleep(1.5)  # the load goes on with one engine
            stop_load.set()
            await asyncio.gather(*clients)
        expected = "".join(f"t{i} " for i in range(MAX_TOKENS))
        failed = [a for _, a in answers if a != (200, expected, "[DONE]")]
        assert not failed, (failed[:3], router.text()[-3000:])
        assert sum(t > gone for t, _ in answers) >= 3  # answered after the engine had gone
        assert len(answers) >= 20
        assert "drained: stopping" in engines[0].text(), engines[0].text()
        await stop_cleanly([p for p in procs if p is not engines[0]])
    finally:
        for p in procs:
            await p.stop()
