"""A prefill node that dies after prefilling, before the decode node took the KV: a router and engine
agents, each started from its command line.

- ``sglang`` backend (stand-ins, the decode one checking the prefill one's bootstrap room): SGLang's
  decode mode cannot prefill, so the decode agent hands the request back (``requeue``, reason
  ``kv_source_lost``) and the router places it again from the start on the other prefill node; the
  client gets every token once (``agentpool_router_retries_total{reason="kv_source_lost"}``).
- ``sim`` backend: the decode engine prefills the prompt itself and streams the tokens after the
  first one, which the dead prefill node had sent.

The moment: the decode agent is stopped (SIGSTOP) before the request, so the router's decode call waits
in its socket while the test kills the prefill node; then the decode agent goes on (SIGCONT)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from engine_processes import (
    Pool,
    metric_value,
    sglang_checked_section,
    wait_until,
)
from process_helpers import Proc

pytestmark = pytest.mark.integration


async def read_sse(resp: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


def text_of(events: list[Any]) -> str:
    return "".join(
        e["choices"][0].get("text") or "" for e in events if isinstance(e, dict) and e.get("choices")
    )


def kill_agent(p: Proc) -> None:
    """SIGKILL the agent and the process group of each child it started (the SGLang stand-in)."""
    pid = p.proc.pid
    children = [c for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]
    p.kill()
    for child in children:
        os.killpg(int(child), signal.SIGKILL)


async def port_closed(port: int) -> bool:
    try:
        _, w = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    w.close()
    return False


async def test_sglang_a_dead_prefill_node_is_placed_again_from_the_start(pool: Pool, tmp_path: Path) -> None:
    prefill = {
        n: await pool.engine(n, "prefill", backend="sglang", sglang=sglang_checked_section(tmp_path, n))
        for n in ("p0", "p1")
    }
    d0 = await pool.engine("d0", "decode", backend="sglang", sglang=sglang_checked_section(tmp_path, "d0"))
    router = await pool.router(
        [(prefill["p0"], "p0", "prefill"), (prefill["p1"], "p1", "prefill"), (d0, "d0", "decode")]
    )
    standin_port = {n: int(pool.configs[n]["sglang"]["port"]) for n in prefill}
    async with aiohttp.ClientSession() as http:

        async def prefills(node: str) -> int:
            async with http.get(f"http://127.0.0.1:{standin_port[node]}/standin/requests") as r:
                return len((await r.json())["requests"])

        os.kill(d0.proc.pid, signal.SIGSTOP)  # the router's decode call waits in d0's socket
        body = {
            "model": "test-model",
            "prompt": "a prompt for the pool " * 4,
            "max_tokens": 3,
            "stream": True,
        }

        async def complete() -> list[Any]:
            # the router answers once the first token is there (after the kill below)
            async with http.post(pool.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, (await resp.text()) + router.text() + d0.text()
                return [e async for e in read_sse(resp)]

        client = asyncio.create_task(complete())
        first: list[str] = []

        async def prefilled_somewhere() -> bool:
            for node in prefill:
                if await prefills(node) > 0:
                    first.append(node)
                    return True
            return False

        await wait_until(prefilled_somewhere, 10, "a prefill on p0 or p1")

        async def decode_bound() -> bool:  # the router read `started` (`prefilled` came with it)
            async with http.get(pool.url + "/metrics") as r:
                text = await r.text()
            return (
                metric_value(
                    text, 'agentpool_router_decisions_total{node="d0",phase="decode",policy="least-loaded"}'
                )
                == 1
            )

        await wait_until(decode_bound, 10, "the router to bind d0")
        await asyncio.sleep(0.3)  # and call d0 with `prefilled`'s transfer id
        dead = first[0]
        kill_agent(prefill[dead])
        await wait_until(lambda: port_closed(standin_port[dead]), 10, f"{dead}'s SGLang gone")
        os.kill(d0.proc.pid, signal.SIGCONT)
        try:
            events = await asyncio.wait_for(client, 30)
        except TimeoutError:
            pytest.fail("no answer within 30 s; router and d0 said:\n" + router.text() + d0.text())
        assert events[-1] == "[DONE]", events
        assert not any(isinstance(e, dict) and "error" in e for e in events), events
        assert text_of(events) == "w0 w1 w2 ", events  # every token once
        live = "p1" if dead == "p0" else "p0"
        assert await prefills(live) == 1  # placed again from the start on the live prefill node
        async with http.get(pool.url + "/metrics") as r:
            rm = await r.text()
        logs = router.text() + d0.text()  # what the router and the decode agent said, on a failure
        assert metric_value(rm, 'agentpool_router_retries_total{reason="kv_source_lost"}') == 1, rm + logs
        assert metric_value(rm, 'agentpool_router_engine_failures_total{kind="engine"}') == 0, rm + logs
        async with http.get(d0.url + "/metrics") as r:
            dm = await r.text()
        assert metric_value(dm, 'agentpool_engine_requeued_requests_total{reason="kv_source_lost"}') == 1, dm
    assert "Traceback" not in router.text(), router.text()
    assert "Traceback" not in d0.text(), d0.text()


async def test_sim_a_dead_prefill_node_is_recomputed_on_the_decode_node(pool: Pool) -> None:
    p0 = await pool.engine("p0", "prefill")
    d0 = await pool.engine("d0", "decode")
    router = await pool.router([(p0, "p0", "prefill"), (d0, "d0", "decode")])
    async with aiohttp.ClientSession() as http:
        os.kill(d0.proc.pid, signal.SIGSTOP)
        body = {
            "model": "test-model",
            "prompt": "a prompt for the pool " * 4,
            "max_tokens": 4,
            "stream": True,
        }
        async with http.post(pool.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            events: list[Any] = []
            async for e in read_sse(resp):
                events.append(e)
                if len(events) == 1:  # the first token came from p0's `prefilled`
                    kill_agent(p0)
                    await p0.proc.wait()
                    os.kill(d0.proc.pid, signal.SIGCONT)
        assert events[-1] == "[DONE]", events
        assert not any(isinstance(e, dict) and "error" in e for e in events), events
        assert text_of(events) == "t0 t1 t2 t3 ", events  # every token once
        async with http.get(d0.url + "/metrics") as r:
            dm = await r.text()
        assert metric_value(dm, "agentpool_engine_handover_recomputed_total") == 1, dm
        async with http.get(pool.url + "/metrics") as r:
            rm = await r.text()
        assert metric_value(rm, 'agentpool_router_retries_total{reason="kv_source_lost"}') == 0, rm
    assert "Traceback" not in router.text(), router.text()
