"""An engine replaced under load, as a rolling update replaces it: the router and the engines from
their command lines, clients streaming chat completions through the router, SIGTERM to one engine.
It drains (what runs finishes, what arrives is handed back, a prefill node waits for its decode
nodes to take their hand-overs) and exits 0; the router places the rest on the other engines: every
client request is answered in full, and no hand-over is recomputed."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from dataclasses import dataclass

import aiohttp
import pytest
from engine_processes import Pool

pytestmark = pytest.mark.integration
# a request takes about 0.2 s of prefill and 4 x 0.05 s of decode
SLOW = {"sim": {"c0": 0.2, "c1": 0.0, "d0": 0.05, "chunkTokens": 64}}
MAX_TOKENS = 5


@dataclass(frozen=True)
class Layout:
    name: str
    roles: tuple[str, ...]
    """Of nodes n0, n1, ...: n0 is the one replaced."""


LAYOUTS = [
    Layout("colocated", ("both", "both")),
    Layout("disaggregated, a prefill node replaced", ("prefill", "prefill", "decode")),
]


async def one_completion(http: aiohttp.ClientSession, url: str, n: int) -> tuple[int, str, str]:
    """(status, streamed text, last SSE data) of one streamed chat completion."""
    body = {
        "model": "test-model",
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


def handovers_recomputed(metrics: str) -> float:
    m = re.search(r'^agentpool_engine_fetch_failures_total\{kind="handover"\} (\S+)$', metrics, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
async def test_an_engine_replaced_under_load_loses_no_request(pool: Pool, layout: Layout) -> None:
    engines = [await pool.engine(f"n{i}", role, **SLOW) for i, role in enumerate(layout.roles)]
    await pool.router(
        [(e, f"n{i}", role) for i, (e, role) in enumerate(zip(engines, layout.roles, strict=True))]
    )
    replaced = engines[0]
    async with aiohttp.ClientSession() as http:
        answers: list[tuple[float, tuple[int, str, str]]] = []
        stop_load = asyncio.Event()

        async def client(n: int) -> None:
            i = 0
            while not stop_load.is_set():
                answers.append((time.monotonic(), await one_completion(http, pool.url, n * 1000 + i)))
                i += 1

        clients = [asyncio.create_task(client(n)) for n in range(6)]
        await asyncio.sleep(1.5)
        replaced.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(replaced.proc.wait(), 15) == 0, replaced.text()
        gone = time.monotonic()
        await asyncio.sleep(1.5)  # the load goes on without it
        stop_load.set()
        await asyncio.gather(*clients)
        recomputed = 0.0
        for e in engines[1:]:
            async with http.get(e.url + "/metrics") as r:
                recomputed += handovers_recomputed(await r.text())
    expected = "".join(f"t{i} " for i in range(MAX_TOKENS))
    failed = [a for _, a in answers if a != (200, expected, "[DONE]")]
    assert not failed, failed[:3]
    assert sum(t > gone for t, _ in answers) >= 3  # answered after the engine had gone
    assert len(answers) >= 20
    assert recomputed == 0  # every hand-over of the replaced prefill node was taken before it left
    assert "drained: stopping" in replaced.text(), replaced.text()
