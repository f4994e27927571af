"""What engines report reaches the planner through every router: t_acc on the work records, and
iteration records (once, however many routers carry them). Real routers and HTTP on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from planner_link_harness import Engine, chat, router_config, serve, start_router

from agentpool.models import DecodeIterationRecord, PrefillIterationRecord
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.router_source import RouterWorkSource

pytestmark = pytest.mark.integration


@pytest.fixture()
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_engine_reports_reach_the_planner_through_two_routers(session: aiohttp.ClientSession) -> None:
    engine = Engine(tokens=5)
    served = await serve(engine.app())
    config = router_config([("e0", served.url, "both")])
    routers = [await start_router(config) for _ in range(2)]
    report = {
        "node_id": "e0",
        "role": "both",
        "t_acc": 1.7,  # MTP: 1.7 tokens per decode iteration
        "iterations": [
            {"phase": "prefill", "seq": 0, "at": 100.0, "seconds": 0.25, "batch": [{"t_uc": 800, "t_c": 64}]},
            {"phase": "decode", "seq": 1, "at": 100.3, "seconds": 0.02, "running": 3},
        ],
    }
    try:
        for r in routers:  # the engine reports to every router replica
            async with session.post(f"{r.url}/agentpool/v1/report", json=report) as resp:
                assert resp.status == 200, await resp.text()
        async with session.post(f"{routers[0].url}/v1/chat/completions", json=chat()) as resp:
            assert resp.status == 200, await resp.text()
        inbox = PlannerInbox()
        source = RouterWorkSource([r.url for r in routers], inbox, session)
        await source.poll_once()
        (record,) = inbox.requests(0, 1e12)
        assert record.work.t_acc == 1.7 and record.work.t_out == 4
        prefill, decode = inbox.iterations(0, 1e12)
        assert isinstance(prefill, PrefillIterationRecord) and prefill.node == "e0"
        assert prefill.batch[0].t_uc == 800 and prefill.seconds == 0.25
        assert decode == DecodeIterationRecord("e0", 100.3, 3, 0.02)
        assert source.iterations.duplicates == 2  # the second router's copies
    finally:
        for r in routers:
            await r.stop()
        await served.stop()
