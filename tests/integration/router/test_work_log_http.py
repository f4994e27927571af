"""The work log served over real HTTP (the router's HTTP server on loopback), read by the planner's
router source."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from router_engine_standin import StandIn
from router_harness import chat_body, router_config, start_router

from agentpool.models import OccupancyCount, Work, slice_window
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.router_source import RouterWorkSource
from agentpool.router.http_server import HttpServer, Routes
from agentpool.router.work_log import WorkLog, mount, sampling
from agentpool.wire.work import WORK_PATH, WorkBatch, parse_cursor

pytestmark = pytest.mark.integration

Serve = Callable[[WorkLog, float], Awaitable[str]]


@pytest.fixture()
async def serve() -> AsyncIterator[Serve]:
    async with contextlib.AsyncExitStack() as stack:

        async def start(log: WorkLog, sample_interval_s: float = 3600.0) -> str:
            routes = Routes()
            mount(routes, log)
            server = HttpServer(routes, max_body_bytes=lambda: 1 << 20, body_timeout_s=lambda: 30.0)
            await stack.enter_async_context(sampling(log, sample_interval_s))
            port = await server.start("127.0.0.1", 0)
            stack.push_async_callback(server.stop, 0.1)
            return f"http://127.0.0.1:{port}"

        yield start


@pytest.fixture()
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_handler_serves_batches_and_rejects_bad_cursors(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    log = WorkLog("router-0")
    url = await serve(log, 3600.0)  # the sampler samples once at startup
    log.routed("a", Work(t_uc=100, t_c=900, t_out=2048))
    log.finished("a", 11)
    async with session.get(url + WORK_PATH) as resp:
        assert resp.status == 200
        batch = WorkBatch.model_validate_json(await resp.read())
    assert batch.router == "router-0" and batch.reset
    assert [(r.t_uc, r.t_c, r.t_out) for r in batch.requests] == [(100, 900, 10)]
    assert [s.requests for s in batch.occupancy] == [0]
    async with session.get(url + WORK_PATH, params={"since": batch.next}) as resp:
        again = WorkBatch.model_validate_json(await resp.read())
    assert again.requests == [] and again.occupancy == [] and not again.reset
    for bad in ({"since": "nonsense"}, {"limit": "0"}, {"limit": "many"}):
        async with session.get(url + WORK_PATH, params=bad) as resp:
            assert resp.status == 400, bad
            assert "error" in await resp.json()


async def test_source_polls_two_routers_into_the_inbox_and_sums_their_occupancy(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    logs = [WorkLog(f"router-{i}") for i in range(2)]
    for i, log in enumerate(logs):
        for j in range(10 * (i + 1)):  # router-0: 10 in flight, router-1: 20
            log.routed(f"{i}-{j}", Work(t_uc=1000, t_c=100 * i))
    urls = [await serve(log, 0.05) for log in logs]
    logs[0].finished("0-0", 101)
    await asyncio.sleep(0.3)  # a few samples each
    inbox = PlannerInbox()
    source = RouterWorkSource(urls, inbox, session, interval_s=0.05, limit=2)  # pages of 2
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    for _ in range(1000):  # a few polls of each router; a slow machine takes longer
        if all(r.records > 0 for r in source.routers) and inbox.requests(0, 1e12):
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert all(r.failures == 0 and r.records > 0 for r in source.routers)
    requests = inbox.requests(0, 1e12)
    assert [(r.work.t_uc, r.work.t_out) for r in requests] == [(1000, 100)]
    samples = inbox.occupancy(0, 1e12)
    assert {s.source for s in samples} == set(urls)
    assert {s.requests for s in samples if s.source == urls[1]} == {20}
    assert {s.requests for s in samples if s.source == urls[0]} <= {9, 10}
    start = min(s.at for s in samples)
    at = requests[0].at
    w = slice_window(
        requests, samples, min(start, at), max(s.at for s in samples) + 1, 1, OccupancyCount.IN_FLIGHT
    )
    assert 28 <= w.slices[0].decode_occupancy <= 30


async def test_source_survives_a_dead_router_and_a_restarted_one(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    log = WorkLog()
    url = await serve(log, 3600.0)
    inbox = PlannerInbox()
    source = RouterWorkSource([url, "http://127.0.0.1:9"], inbox, session, timeout_s=1.0)
    assert await source.poll_once() == 1  # the startup sample; port 9 refuses
    assert source.routers[1].failures == 1 and source.routers[0].failures == 0
    # The router restarts: a new process (new epoch) behind the router's address; the cursor
    # the source holds means nothing there: it reads everything the new one has.
    fresh = WorkLog()
    source.routers[0].url = await serve(fresh, 3600.0)
    fresh.sample()
    assert await source.poll_once() == 2
    assert parse_cursor(str(source.routers[0].cursor)) == (fresh.epoch, 2)


async def test_source_rejects_a_malformed_answer(session: aiohttp.ClientSession) -> None:
    app = web.Application()

    async def wrong(_: web.Request) -> web.Response:
        return web.json_response({"router": "x", "epoch": "e", "next": "e.1", "requests": [{"seq": 1}]})

    app.router.add_get(WORK_PATH, wrong)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        inbox = PlannerInbox()
        source = RouterWorkSource([f"http://127.0.0.1:{runner.addresses[0][1]}"], inbox, session)
        assert await source.poll_once() == 0
        assert source.routers[0].failures == 1 and source.routers[0].cursor is None
    finally:
        await runner.cleanup()


async def test_a_routed_request_reaches_the_planner_through_the_router(
    session: aiohttp.ClientSession,
) -> None:
    """End to end: a chat request through a real router becomes one work record for the planner.

    Skipped until ``flow.py``/``server.py`` call the work log (their owner adds the lines).
    """
    engine = await StandIn("a", tokens=4).start()
    router = await start_router(router_config([("a", engine.url, "both")]))
    try:
        if not hasattr(router.service.dispatcher, "work_log"):
            pytest.skip("the router does not record work yet (flow.py/server.py not wired)")
        async with session.post(f"{router.url}/v1/chat/completions", json=chat_body(max_tokens=4)) as resp:
            assert resp.status == 200
        inbox = PlannerInbox()
        source = RouterWorkSource([router.url], inbox, session)
        assert await source.poll_once() >= 2  # the record and the startup sample
        (record,) = inbox.requests(0, 1e12)
        assert record.work.t_out == 3 and record.work.t_uc + record.work.t_c > 0
        assert inbox.occupancy(0, 1e12)[0].requests == 0
    finally:
        await router.stop()
        await engine.kill()
