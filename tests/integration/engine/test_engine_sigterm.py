"""SIGTERM, as Kubernetes sends it to a pod it replaces, drains the engine started from its command
line: what runs finishes, new work is handed back, then the process exits 0. A drain that takes
longer than ``--drain-timeout-s`` stops anyway; a second SIGTERM stops at once."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from engine_processes import engine_config, gen_body, start_engine, wait_until
from process_helpers import ENGINE_AUTH, Proc, launch

from agentpool.engine.kv_peers import LEASE_PATH

pytestmark = pytest.mark.integration

# one prefill iteration takes this long: a request runs for about that long
SLOW_PREFILL = {"sim": {"c0": 1.5, "c1": 0.0, "chunkTokens": 16}}


async def event_types(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[str]:
    async with http.post(url + "/agentpool/v1/generate", json=body, headers=ENGINE_AUTH) as r:
        assert r.status == 200, await r.text()
        return [json.loads(line)["type"] async for line in r.content if line.strip()]


async def start_slow_request(http: aiohttp.ClientSession, engine: Proc) -> asyncio.Task[list[str]]:
    """A request the engine is running (its prefill takes the config's ``c0``)."""
    task = asyncio.create_task(event_types(http, engine.url, gen_body("long", list(range(16)), max_tokens=2)))

    async def running() -> bool:
        async with http.get(engine.url + "/agentpool/v1/state") as r:
            body = await r.json()
        return int(body["jobs"]) > 0 and int(body["queue"]) == 0  # admitted, not waiting

    await wait_until(running, 10, "the request to run", alive=[engine])
    return task


async def sigterm(engine: Proc) -> float:
    """Send SIGTERM once the engine says it drains; when it was sent (``time.monotonic``)."""
    sent = time.monotonic()
    engine.proc.send_signal(signal.SIGTERM)
    await engine.wait_for("SIGTERM: draining", within_s=5)
    return sent


async def test_sigterm_lets_running_work_finish_then_exits_0(tmp_path: Path) -> None:
    engine = await start_engine(tmp_path, engine_config("t", **SLOW_PREFILL))
    try:
        async with aiohttp.ClientSession() as http:
            running = await start_slow_request(http, engine)
            sent = await sigterm(engine)
            async with http.get(engine.url + "/ready") as r:
                assert r.status == 503 and "draining for removal" in await r.text()
            # new work is handed back for the router to place elsewhere, not failed
            assert await event_types(http, engine.url, gen_body("late", list(range(30, 40)))) == ["requeue"]
            assert (await running)[-1] == "done"
            assert await asyncio.wait_for(engine.proc.wait(), 15) == 0
            assert time.monotonic() - sent < 15
    finally:
        rc = await engine.stop()
    out = engine.text()
    assert rc == 0 and "drained: stopping" in out and "Traceback" not in out, out


async def test_the_drain_waits_for_a_peers_lease_before_stopping(tmp_path: Path) -> None:
    """A peer holding a lease here (a decode node still to read its hand-over) keeps a draining
    engine up until it releases the lease."""
    engine = await start_engine(tmp_path, engine_config("t"))
    try:
        async with aiohttp.ClientSession() as http:
            lease_url = engine.url + LEASE_PATH
            async with http.post(
                lease_url, json={"block_hashes": [7], "ttl_s": 60}, headers=ENGINE_AUTH
            ) as r:
                assert r.status == 200, await r.text()
                lease = (await r.json())["lease"]
            await sigterm(engine)
            await engine.assert_exited_not(within_s=1.0, context="while a peer held a lease")
            async with http.delete(f"{lease_url}/{lease}", headers=ENGINE_AUTH) as r:
                assert r.status == 200
            assert await asyncio.wait_for(engine.proc.wait(), 5) == 0
    finally:
        await engine.stop()
    assert "drained: stopping" in engine.text(), engine.text()


async def test_a_drain_past_its_timeout_or_a_second_sigterm_stops_at_once(tmp_path: Path) -> None:
    cfg = engine_config("t", **{"sim": {"c0": 30.0, "c1": 0.0, "chunkTokens": 16}})
    for second_signal in (False, True):
        engine = await start_engine(tmp_path, cfg, "--drain-timeout-s", "60" if second_signal else "0.5")
        try:
            async with aiohttp.ClientSession() as http:
                running = await start_slow_request(http, engine)
                sent = await sigterm(engine)
                if second_signal:
                    engine.proc.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(engine.proc.wait(), 10) == 0, engine.text()
                assert time.monotonic() - sent < 10
                with pytest.raises(aiohttp.ClientError):
                    await running  # the request that could not finish is cut, not answered "done"
        finally:
            await engine.stop()
        if not second_signal:
            said = "drain: requests still running after 0.5 s; stopping anyway"
            assert said in engine.text(), engine.text()


async def test_a_bad_drain_timeout_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(engine_config("t")))
    p = await launch("engine", "agentpool.engine", "--config", str(path), "--drain-timeout-s", "-1")
    assert await p.proc.wait() == 2
    await p.stop()
    assert "--drain-timeout-s" in p.text()
