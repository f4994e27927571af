"""A request an engine refuses changes nothing in the directory: the router resolves (read-only), and
places the branch (E.1 then E.2 in the directory) only once an engine took the request."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from process_helpers import delete_namespace
from router_engine_standin import StandIn
from router_harness import chat_body, router_config, start_router

from agentpool.directory.client import DirectoryClient
from agentpool.directory.server import DirectoryConfig, DirectoryServer
from agentpool.kv import Role
from agentpool.router.grpc_directory import GrpcDirectoryView

pytestmark = pytest.mark.integration

REDIS_URL = "redis://127.0.0.1:6379/0"
TOKEN = "place-test-token-0123456789"


@pytest.fixture
async def directory() -> AsyncIterator[DirectoryServer]:
    namespace = f"agentpool-router-test:{uuid.uuid4().hex}"
    cfg = DirectoryConfig(port=0, redis_url=REDIS_URL, namespace=namespace, page_size=16, auth_token=TOKEN)
    srv = DirectoryServer(cfg)
    await srv.start()
    yield srv
    await srv.stop()
    await delete_namespace(namespace)


async def test_a_refused_request_leaves_the_branch_as_it_was(directory: DirectoryServer) -> None:
    a = await StandIn("a", tokens=1).start()
    config = router_config([("a", a.url, "both")], maxRequeues=1)
    router = await start_router(config, GrpcDirectoryView(directory.address, token=TOKEN))
    headers = {"x-agentpool-branch": "agent-1"}
    first, rewrite = "the first context " * 30, "a compacted context " * 30
    try:
        async with (
            DirectoryClient(directory.address, token=TOKEN) as d,
            aiohttp.ClientSession() as http,
        ):
            await d.switch_phase("a", Role.BOTH)

            async def ask(text: str) -> int:
                url = f"{router.url}/v1/chat/completions"
                async with http.post(url, json=chat_body(text), headers=headers) as resp:
                    await resp.read()
                    return resp.status

            assert await ask(first) == 200
            # the router sends its Place on its Route stream without waiting for it: it lands shortly
            await eventually(lambda: "agent-1" in directory.service.dir.branches)
            counts = await snapshot(d, "a")
            assert (await d.health()).branches == 1 and counts

            a.draining = True  # the engine gives every request back: nobody takes the rewrite
            assert await ask(rewrite) >= 500
            assert a.requeued
            assert await snapshot(d, "a") == counts  # no release of the dropped history
            branch_row = directory.service.dir.branches.get("agent-1")
            assert branch_row.version == 1  # no bump for a request nobody took

            a.draining = False
            assert await ask(rewrite) == 200
            await eventually(lambda: directory.service.dir.branches.get("agent-1").version == 2)
            assert await snapshot(d, "a") != counts
    finally:
        await router.stop()
        await a.kill()


async def eventually(check: Callable[[], bool], within_s: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "the router's Place did not arrive"
        await asyncio.sleep(0.01)


async def snapshot(d: DirectoryClient, node: str) -> dict[int, int]:
    stream = d.watch_counts(node)
    first = await anext(stream)
    await stream.aclose()
    return first.counts
