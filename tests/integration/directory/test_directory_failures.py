"""Failure behaviour: directory process restart, Redis restart, silent nodes, idle branches."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis
from conftest import REDIS_URL, config_for
from directory_engine_double import EngineDouble
from directory_processes import TOKEN, PrivateRedis, eventually, start_directory_process

from agentpool.directory.client import DirectoryClient, DirectoryRpcError
from agentpool.directory.server import DirectoryServer
from agentpool.kv import Role
from agentpool.kv.hashing import block_hashes

pytestmark = pytest.mark.integration

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
ROOT = Path(__file__).resolve().parents[3]


async def count_snapshot(client: DirectoryClient, node: str) -> dict[int, int]:
    stream = client.watch_counts(node)
    first = await asyncio.wait_for(anext(stream), 5)
    await stream.aclose()
    assert first.snapshot
    return first.counts


async def build_agent_state(client: DirectoryClient, p1: EngineDouble, d1: EngineDouble) -> list[int]:
    chain = block_hashes(list(range(4 * 6)), 4)
    await client.resolve(chain[:4], "a")
    await client.place("a", "p1", chain[:4])
    await p1.store(chain[:4])
    await client.place("a", "d1")  # decode binding: P2D keeps both copies counted
    await d1.store(chain[:4])
    await client.resolve(chain[:3], "b")
    await client.place("b", "p1", chain[:3])
    compacted = [chain[0], *block_hashes(list(range(100, 112)), 4, parent=chain[0])]
    res = await client.resolve(compacted, "b")  # compaction: version 2
    assert res.branch is not None and res.branch.version == 2
    await client.place("b", "p1", compacted)
    await p1.store(compacted[1:], parent=chain[0])
    return chain


async def test_directory_process_restart_keeps_branches_and_counts(namespace: str) -> None:
    proc, addr = await start_directory_process(namespace)
    p1, d1 = EngineDouble("p1", Role.PREFILL), EngineDouble("d1", Role.DECODE)
    try:
        async with DirectoryClient(addr, token=TOKEN) as client:
            for e in (p1, d1):
                e.connect(client)
                await e.resync()
            chain = await build_agent_state(client, p1, d1)
            counts = {n: await count_snapshot(client, n) for n in ("p1", "d1")}
            assert counts["p1"][chain[0]] == 2 and counts["d1"][chain[0]] == 1
            prefixes = (await client.resolve(chain)).nodes
        proc.kill()
        await proc.wait()

        proc, addr = await start_directory_process(namespace)
        async with DirectoryClient(addr, token=TOKEN) as client:
            health = await client.health()
            assert (health.serving, health.branches, health.nodes, health.blocks) == (True, 2, 2, 0)
            assert {n: await count_snapshot(client, n) for n in ("p1", "d1")} == counts
            assert (await client.resolve(chain)).nodes == {}  # the index waits for the engines
            for e in (p1, d1):
                e.connect(client)
                await e.heartbeat()  # unknown to the new process: resync requested and sent
                assert e.resyncs == 2
            assert (await client.resolve(chain)).nodes == prefixes
            a = await client.resolve(chain[:4], "a")
            assert a.branch is not None and (a.branch.version, a.branch.version_bumped) == (1, False)
            assert a.branch.counted_nodes == ("d1", "p1")
            health = await client.health()
            assert health.blocks > 0
    finally:
        proc.kill()
        await proc.wait()


@pytest.fixture
async def private_redis() -> AsyncIterator[PrivateRedis]:
    async with PrivateRedis() as r:
        yield r


async def test_a_private_redis_removes_its_data_directory_when_done() -> None:
    """Each PrivateRedis writes its AOF into a temp directory of its own: gone after the test."""
    async with PrivateRedis() as r:
        client = aioredis.Redis(port=r.port)
        await client.set("k", "v")
        await client.aclose()
        await r.kill()  # a test's kill and restart keep the data directory
        await r.start()
        assert await asyncio.to_thread(os.path.isdir, r.data)
    assert r.proc is not None and r.proc.returncode is not None
    assert not await asyncio.to_thread(os.path.exists, r.data)


async def test_redis_restart_reports_unhealthy_reconnects_and_keeps_state(
    private_redis: PrivateRedis,
) -> None:
    srv = DirectoryServer(config_for("agentpool-test:redis-restart", redis_url=private_redis.url))
    await srv.start()
    p1, d1 = EngineDouble("p1", Role.PREFILL), EngineDouble("d1", Role.DECODE)
    try:
        async with DirectoryClient(srv.address) as client:
            for e in (p1, d1):
                e.connect(client)
                await e.resync()
            chain = await build_agent_state(client, p1, d1)
            counts = {n: await count_snapshot(client, n) for n in ("p1", "d1")}

            await private_redis.kill()

            async def unhealthy() -> bool:
                return not (await client.health()).serving

            await eventually(unhealthy)
            with pytest.raises(DirectoryRpcError) as err:
                await client.place("a", "p1", chain)
            assert err.value.code is grpc.StatusCode.UNAVAILABLE
            assert (await client.resolve(chain)).nodes["p1"].local_blocks == 4  # reads keep working

            await private_redis.start()

            async def healthy() -> bool:
                return (await client.health()).serving

            await eventually(healthy)
            assert {n: await count_snapshot(client, n) for n in ("p1", "d1")} == counts
            b = await client.resolve([chain[0]], "b")
            assert b.branch is not None and b.branch.version == 3  # 2 before, +1: not an extension
            assert (await client.health()).branches == 2
    finally:
        await srv.stop()


async def test_silent_node_is_purged_and_its_counts_released(namespace: str) -> None:
    srv = DirectoryServer(config_for(namespace, node_timeout_s=0.6))
    await srv.start()
    p1, p2 = EngineDouble("p1", Role.PREFILL), EngineDouble("p2", Role.PREFILL)
    try:
        async with DirectoryClient(srv.address) as client:
            chain = block_hashes(list(range(16)), 4)
            for e in (p1, p2):
                e.connect(client)
                await e.resync()
                await e.store(chain[:2])
            for branch, node in (("a", "p1"), ("b", "p2")):
                await client.place(branch, node, chain[:2])
            t0 = time.monotonic()
            while time.monotonic() - t0 < 1.5:  # p2 stays alive, p1 is silent
                await p2.heartbeat()
                await asyncio.sleep(0.1)
            res = await client.resolve(chain[:2], "a")
            assert set(res.nodes) == {"p2"}
            assert res.branch is not None and res.branch.counted_nodes == ()
            assert await count_snapshot(client, "p2") == {chain[0]: 1, chain[1]: 1}
            assert (await client.health()).nodes == 1
            r = aioredis.Redis.from_url(REDIS_URL)
            assert await r.hkeys(f"{namespace}:nodes") == [b"p2"]
            await r.aclose()
            ack = await p1.heartbeat()  # p1 comes back: it is unknown and resyncs
            assert p1.resyncs == 2 and not ack.resync_requested
    finally:
        await srv.stop()


async def test_idle_branches_expire(namespace: str) -> None:
    srv = DirectoryServer(config_for(namespace, idle_ttl_s=0.4))
    await srv.start()
    try:
        async with DirectoryClient(srv.address) as client:
            await client.switch_phase("p1", Role.PREFILL)
            await client.place("idle", "p1", [1, 2])
            assert await count_snapshot(client, "p1") == {1: 1, 2: 1}

            async def gone() -> bool:
                return (await client.health()).branches == 0

            await eventually(gone, within=5)
            assert await count_snapshot(client, "p1") == {}
            r = aioredis.Redis.from_url(REDIS_URL)
            assert await r.exists(f"{namespace}:branch:{{idle}}") == 0
            await r.aclose()
    finally:
        await srv.stop()
