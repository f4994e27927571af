"""Drain for removal (the operator's ``agentpool.io/drain``), in process: no new work, the queue
handed back, running work finishes, then /ready says drained; role switches no longer happen."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from engine_processes import engine_config, gen_body
from process_helpers import ENGINE_AUTH

from agentpool.engine.app import EngineApp
from agentpool.engine.config import EngineConfig
from agentpool.node import Role

pytestmark = pytest.mark.integration


async def events(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[str]:
    async with http.post(url + "/agentpool/v1/generate", json=body, headers=ENGINE_AUTH) as r:
        assert r.status == 200, await r.text()
        return [json.loads(line)["type"] async for line in r.content if line.strip()]


async def test_retire_drains_for_good() -> None:
    cfg = EngineConfig.model_validate(engine_config("r", sim={"c0": 0.3, "c1": 0.0, "chunkTokens": 16}))
    app = EngineApp(cfg)
    await app.start()
    try:
        async with aiohttp.ClientSession() as http:
            running = asyncio.create_task(events(http, app.url, gen_body("a", list(range(16)), max_tokens=2)))
            queued = asyncio.create_task(
                events(http, app.url, gen_body("b", list(range(50, 66)), max_tokens=2))
            )
            for _ in range(200):
                if app.backend.load().queue and any(
                    j.state.value == "prefill" for j in app.backend.jobs.values()
                ):
                    break
                await asyncio.sleep(0.01)
            app.retire()
            async with http.get(app.url + "/ready") as r:
                assert r.status == 503 and "draining for removal" in await r.text()
            assert await queued == ["requeue"]
            assert (await running)[-1] == "done"
            assert await events(http, app.url, gen_body("c", list(range(9)))) == ["requeue"]
            app.switcher.set_desired(Role.PREFILL, "test")
            await asyncio.sleep(0.1)
            assert app.backend.role is Role.BOTH and not app.switcher.history
            async with http.get(app.url + "/ready") as r:
                assert r.status == 503 and "drained for removal" in await r.text()
            assert app.build_report().accepting is False
    finally:
        await app.stop()
