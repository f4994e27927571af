"""What engines report reaches the planner through every router: t_acc on the work records, and
iteration records (once, however many routers carry them); and what the planner fits reaches every
router and decides its routing. Real routers and HTTP on loopback."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import aiohttp
import pytest
from planner_link_harness import Engine, Router, chat, router_config, serve, start_router

from agentpool.models import (
    DecodeIterationRecord,
    DecodeModel,
    NodeModel,
    PrefillIterationRecord,
    PrefillModel,
)
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.router_models import ModelBroadcast
from agentpool.planner.router_source import RouterWorkSource
from agentpool.wire.fits import MODELS_PATH, ModelSet, ModelSetStatus, WireNodeModel

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


FAST = NodeModel(prefill=PrefillModel(0.01, 5e-5, 1e-10, 1e-7), decode=DecodeModel(0.01, 0.005, 1e-4))
SLOW = dataclasses.replace(FAST, prefill=PrefillModel(0.01, 2e-4, 4e-10, 1e-7))


async def _routed_to(session: aiohttp.ClientSession, url: str, engines: dict[str, Engine]) -> str:
    before = {n: len(e.received) for n, e in engines.items()}
    async with session.post(f"{url}/v1/chat/completions", json=chat("x " * 300)) as resp:
        assert resp.status == 200, await resp.text()
    (node,) = [n for n, e in engines.items() if len(e.received) > before[n]]
    return node


async def _models_of(session: aiohttp.ClientSession, url: str) -> ModelSetStatus:
    async with session.get(url + MODELS_PATH) as resp:
        assert resp.status == 200
        return ModelSetStatus.model_validate_json(await resp.read())


async def test_the_planners_fits_reach_every_router_replica_and_decide_the_routing(
    session: aiohttp.ClientSession,
) -> None:
    engines = {"e0": Engine(), "e1": Engine()}
    served = {n: await serve(e.app()) for n, e in engines.items()}
    token = "planner-and-engines-token"
    config = router_config([(n, s.url, "both") for n, s in served.items()])
    routers = [await start_router(config, token) for _ in range(2)]
    late: Router | None = None
    try:
        # The prior (configured nodeModel) makes both engines equal: idle ties go to e0.
        for r in routers:
            assert await _routed_to(session, r.url, engines) == "e0"
            assert (await _models_of(session, r.url)).version is None
        broadcast = ModelBroadcast([r.url for r in routers], session, token=token)
        await broadcast.publish({"e0": SLOW, "e1": FAST}, fitted_at=10.0)
        version = broadcast.current.version if broadcast.current else None
        assert version is not None and broadcast.failures == 0
        for r in routers:  # every replica uses e0's fit now: 4x slower per token
            status = await _models_of(session, r.url)
            assert status.version == version and status.nodes == ["e0", "e1"]
            assert await _routed_to(session, r.url, engines) == "e1"
            assert r.service.nodes.get("e0").model == SLOW
        # an older set is refused; without the token nothing is accepted
        stale = ModelSet(version=version - 1, fitted_at=1.0, models={"e0": WireNodeModel.of(FAST)})
        auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        async with session.put(
            routers[0].url + MODELS_PATH, data=stale.model_dump_json(), headers=auth
        ) as resp:
            assert resp.status == 409 and (await resp.json())["version"] == version
        newer = stale.model_copy(update={"version": version + 1})
        async with session.put(routers[0].url + MODELS_PATH, data=newer.model_dump_json()) as resp:
            assert resp.status == 401
        assert routers[0].service.nodes.fits_version == version
        # a router that starts (or restarts) empty gets the current set at the planner's next poll
        late = await start_router(config, token)
        inbox = PlannerInbox()
        source = RouterWorkSource([r.url for r in (*routers, late)], inbox, session, models=broadcast)
        broadcast.urls.append(late.url)
        await source.poll_once()
        assert (await _models_of(session, late.url)).version == version
        assert await _routed_to(session, late.url, engines) == "e1"
        assert broadcast.held == {r.url: version for r in (*routers, late)}
    finally:
        for r in (*routers, *([late] if late else [])):
            await r.stop()
        for s in served.values():
            await s.stop()
