"""Bad resync orders, per-client caps and memory after a purge, through the real gRPC service."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest
from conftest import config_for

from agentpool.directory.client import DirectoryClient, DirectoryRpcError, NodePublisher, stored_event
from agentpool.directory.server import DirectoryServer
from agentpool.kv import ROOT_HASH, HeldBlock, Role, Tier
from agentpool.v1 import directory_pb2 as pb

pytestmark = pytest.mark.integration

GH = Tier.GPU | Tier.HOST


def chain(n: int, start: int = 1) -> list[HeldBlock]:
    hs = [start + i for i in range(n)]
    return [HeldBlock(h, hs[i - 1] if i else ROOT_HASH, GH) for i, h in enumerate(hs)]


@pytest.mark.parametrize(
    ("blocks", "reason"),
    [
        ([HeldBlock(5, 5, GH)], "is its own parent"),
        ([HeldBlock(1, ROOT_HASH, GH), HeldBlock(1, ROOT_HASH, GH)], "is listed twice"),
        ([HeldBlock(2, 1, GH), HeldBlock(1, ROOT_HASH, GH)], "comes before its parent"),
        ([HeldBlock(1, 3, GH), HeldBlock(2, 1, GH), HeldBlock(3, 2, GH)], "comes before its parent"),  # cycle
        ([HeldBlock(0, ROOT_HASH, GH)], "root hash"),
    ],
)
async def test_bad_resync_orders_get_invalid_argument(
    client: DirectoryClient, blocks: list[HeldBlock], reason: str
) -> None:
    with pytest.raises(DirectoryRpcError) as err:
        await NodePublisher(client.open_events(), "p1", Role.PREFILL).resync(blocks)
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert reason in err.value.reason
    assert (await client.health()).blocks == 0  # nothing of it applied
    ack = await NodePublisher(client.open_events(), "p1", Role.PREFILL).resync(chain(3))
    assert not ack.resync_requested and (await client.health()).blocks == 3


@pytest.mark.parametrize(
    ("parent", "hashes", "reason"),
    [(7, [7, 8], "is its own parent"), (ROOT_HASH, [1, 2, 1], "listed twice")],
)
async def test_stored_chains_with_a_cycle_get_invalid_argument(
    client: DirectoryClient, parent: int, hashes: list[int], reason: str
) -> None:
    pub = NodePublisher(client.open_events(), "p1", Role.PREFILL)
    await pub.resync([])
    with pytest.raises(DirectoryRpcError) as err:
        await pub.events([stored_event(parent, hashes, Tier.GPU)])
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT and reason in err.value.reason


async def test_one_engine_cannot_store_more_than_its_cap(namespace: str) -> None:
    srv = DirectoryServer(config_for(namespace, max_blocks_per_node=10))
    await srv.start()
    try:
        async with DirectoryClient(srv.address) as c:
            with pytest.raises(DirectoryRpcError) as err:
                await NodePublisher(c.open_events(), "p1", Role.PREFILL).resync(chain(11))
            assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "more than the cap of 10 per node" in err.value.reason
            pub = NodePublisher(c.open_events(), "p1", Role.PREFILL)
            await pub.resync(chain(8))
            ack = await pub.stored(8, [9, 10], Tier.GPU)  # exactly the cap
            assert not ack.resync_requested
            ack = await pub.stored(ROOT_HASH, [1, 2, 3], Tier.HOST)  # held already: no new block
            assert not ack.resync_requested
            with pytest.raises(DirectoryRpcError) as err:
                await pub.stored(10, [11], Tier.GPU)
            assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "would hold 11 blocks" in err.value.reason
            assert (await c.health()).blocks == 10
            other = NodePublisher(c.open_events(), "p2", Role.PREFILL)  # the cap is per node
            assert not (await other.resync(chain(10, start=100))).resync_requested
    finally:
        await srv.stop()


async def test_branch_cap(namespace: str) -> None:
    srv = DirectoryServer(config_for(namespace, max_branches=2))
    await srv.start()
    try:
        async with DirectoryClient(srv.address) as c:
            await c.switch_phase("p1", Role.PREFILL)
            await c.place("a", "p1", [1])
            await c.place("b", "p1", [1])
            with pytest.raises(DirectoryRpcError) as err:
                await c.place("c", "p1", [1])
            assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED and "cap" in err.value.reason
            await c.place("a", "p1", [1, 2])  # known branches go on
            assert (await c.resolve([1], "c")).branch is not None  # so do lookups
    finally:
        await srv.stop()


async def test_node_cap(namespace: str) -> None:
    srv = DirectoryServer(config_for(namespace, max_nodes=2))
    await srv.start()
    try:
        async with DirectoryClient(srv.address) as c:
            await c.switch_phase("p1", Role.PREFILL)
            assert not (
                await NodePublisher(c.open_events(), "p2", Role.PREFILL).resync(chain(2))
            ).resync_requested
            with pytest.raises(DirectoryRpcError) as err:
                await NodePublisher(c.open_events(), "p3", Role.PREFILL).resync(chain(2))
            assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED and "2 nodes" in err.value.reason
            with pytest.raises(DirectoryRpcError) as err:
                await c.switch_phase("p3", Role.DECODE)
            assert err.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert await c.switch_phase("p1", Role.DECODE) is Role.PREFILL  # known nodes go on
            await c.drop_node("p2")
            await c.switch_phase("p3", Role.DECODE)  # room again
    finally:
        await srv.stop()


async def test_malformed_batch_kinds_are_refused(client: DirectoryClient) -> None:
    with pytest.raises(DirectoryRpcError) as err:
        await client.open_events().send(pb.KvEventBatch(node="p1", seq=1, events=[pb.KvEvent()]))
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT


async def test_a_resync_whose_stream_goes_away_is_applied_whole(server: DirectoryServer) -> None:
    """The engine's stream is cancelled while its big resync is being applied in steps: the resync still
    completes (a half-applied one would leave bits without last-access entries), and the node is
    consistent: every block indexed, a purge then clears it all."""
    n = 200_000
    held = chain(n, start=10)
    async with DirectoryClient(server.address) as c:
        stream = c.open_events()
        send = asyncio.ensure_future(NodePublisher(stream, "big", Role.PREFILL).resync(held))

        async def busy() -> bool:
            return bool(server.service.ingest._busy)

        for _ in range(500):
            if await busy():
                break
            await asyncio.sleep(0.01)
        assert await busy(), "the resync never started"
        send.cancel()
        stream._call.cancel()  # the engine went away mid-resync

        async def done() -> bool:
            return (await c.health()).blocks == n and not await busy()

        for _ in range(3000):
            if await done():
                break
            await asyncio.sleep(0.01)
        assert await done()
        assert server.service.dir.index.node_block_count("big") == n
        assert (await c.resolve([h.block_hash for h in held[:50]])).nodes["big"].local_blocks == 50
        assert await c.drop_node("big") == (0, n)
        assert (await c.health()).blocks == 0 and len(server.service.dir.index) == 0


async def test_a_big_count_snapshot_comes_in_parts(namespace: str) -> None:
    """The first part replaces, the others add; together they are every positive count, and a change
    made while the parts go out follows them."""
    srv = DirectoryServer(config_for(namespace))
    srv.service.limits = dataclasses.replace(srv.service.limits, snapshot_part=100)
    await srv.start()
    try:
        async with DirectoryClient(srv.address) as c:
            await c.switch_phase("p1", Role.PREFILL)
            path = [h.block_hash for h in chain(250, start=5)]
            await c.place("a", "p1", path)
            await c.place("b", "p1", path[:10])
            stream = c.watch_counts("p1")
            parts = [await asyncio.wait_for(anext(stream), 5) for _ in range(3)]
            assert [p.snapshot for p in parts] == [True, False, False]
            assert [len(p.counts) for p in parts] == [100, 100, 50]
            merged = {h: n for p in parts for h, n in p.counts.items()}
            assert merged == {h: (2 if i < 10 else 1) for i, h in enumerate(path)}
            await c.end_branch("b")
            change = await asyncio.wait_for(anext(stream), 5)
            assert not change.snapshot and change.counts == {h: 1 for h in path[:10]}
            await stream.aclose()
    finally:
        await srv.stop()
