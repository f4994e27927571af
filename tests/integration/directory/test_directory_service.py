"""The directory over real gRPC on loopback with its state in the real Redis."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentpool.directory.client import DirectoryClient, DirectoryRpcError, NodePublisher
from agentpool.directory.server import DirectoryServer
from agentpool.kv import HeldBlock, Role, Tier
from agentpool.kv.hashing import ROOT_HASH, block_hashes
from agentpool.v1 import directory_pb2 as pb

pytestmark = pytest.mark.integration

GH = Tier.GPU | Tier.HOST


async def test_figure4_c_through_the_service(client: DirectoryClient) -> None:
    chain = block_hashes(list(range(4 * 3)), 4)  # 3 blocks, page 4
    s = client.open_events()
    p1 = NodePublisher(s, "p1", Role.PREFILL)
    p2 = NodePublisher(s, "p2", Role.PREFILL)
    assert not (await p1.resync([])).resync_requested
    assert not (await p2.resync([])).resync_requested
    res = await client.resolve(chain[:2], branch="b1")
    assert res.branch is not None and res.branch.version == 1 and res.branch.is_new
    assert res.nodes == {}
    assert (await client.health()).branches == 0  # Resolve only looks
    placed = await client.place("b1", "p1", chain[:2])  # p1 took the request: E.1 + E.2
    assert placed.is_new and placed.version == 1 and (await client.health()).branches == 1
    await p1.stored(ROOT_HASH, chain[:2], GH)
    res = await client.resolve(chain, branch="b1")
    assert res.branch is not None and res.branch.previous_path == tuple(chain[:2])
    assert res.branch.new_path == tuple(chain) and not res.branch.version_bumped
    assert res.nodes["p1"].local_blocks == 2 and res.nodes["p1"].gpu_tokens == 8
    assert res.nodes["p1"].phase is Role.PREFILL
    placed = await client.place("b1", "p2", chain)
    assert placed.move_pending and not placed.version_bumped and placed.counted_nodes == ("p1", "p2")
    await p2.stored(ROOT_HASH, chain, Tier.GPU)
    res = await client.resolve(chain, branch="b1")
    assert res.branch is not None and res.branch.counted_nodes == ("p2",)
    order = await client.eviction_order("p1")
    assert sorted((e.block_hash, e.count) for e in order) == sorted([(chain[0], 0), (chain[1], 0)])
    assert await client.end_branch("b1") == 1
    await s.close()


async def test_sequence_gap_and_unknown_node_request_a_resync(client: DirectoryClient) -> None:
    chain = block_hashes(list(range(8)), 4)
    s = client.open_events()
    pub = NodePublisher(s, "n1", Role.DECODE)
    ack = await pub.stored(ROOT_HASH, chain, Tier.GPU)  # never resynced: unknown
    assert ack.resync_requested and "unknown" in ack.reason
    assert not (await pub.resync([HeldBlock(chain[0], ROOT_HASH, Tier.HOST)])).resync_requested
    assert not (await pub.stored(chain[0], chain[1:], Tier.GPU)).resync_requested
    pub.seq += 1  # lose a batch
    ack = await pub.removed(chain[:1], Tier.HOST)
    assert ack.resync_requested and "gap" in ack.reason
    ack = await pub.stored(ROOT_HASH, chain, Tier.GPU)  # still waiting for the resync
    assert ack.resync_requested
    assert not (await pub.resync([HeldBlock(chain[0], ROOT_HASH, GH)])).resync_requested
    res = await client.resolve(chain)
    assert res.nodes["n1"].local_blocks == 1 and res.branch is None
    await s.close()


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        (lambda c: c.resolve([0, 1]), "root hash"),
        (lambda c: c.resolve([1], branch="bad branch id"), "branch id"),
        (lambda c: c.resolve(list(range(1, 70_000))), "limit"),
        (lambda c: c.place("nope", "n1"), "unknown branch"),
        (lambda c: c.eviction_order("ghost"), "unknown node"),
        (lambda c: c.end_branch("ghost"), "unknown branch"),
        (lambda c: c.drop_node("-bad-"), "node name"),
    ],
)
async def test_bad_requests_get_a_status_and_a_reason(
    client: DirectoryClient, call: object, reason: str
) -> None:
    with pytest.raises(DirectoryRpcError) as err:
        await call(client)  # type: ignore[operator]
    assert err.value.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    assert reason in err.value.reason
    assert (await client.health()).serving  # never a crash


async def test_count_stream_gets_snapshot_then_changes(
    server: DirectoryServer, client: DirectoryClient
) -> None:
    chain = block_hashes(list(range(8)), 4)
    await client.switch_phase("w1", Role.PREFILL)
    await client.place("a", "w1", chain)
    stream = client.watch_counts("w1")
    first = await anext(stream)
    assert first.snapshot and first.counts == {chain[0]: 1, chain[1]: 1}
    await client.place("b", "w1", chain)
    upd = await asyncio.wait_for(anext(stream), 5)
    assert not upd.snapshot and upd.counts == {chain[0]: 2, chain[1]: 2}
    await client.end_branch("a")
    await client.end_branch("b")
    upd = await asyncio.wait_for(anext(stream), 5)
    while upd.counts != {chain[0]: 0, chain[1]: 0}:  # the two ends may arrive merged or not
        assert upd.counts == {chain[0]: 1, chain[1]: 1}
        upd = await asyncio.wait_for(anext(stream), 5)
    await stream.aclose()


async def test_oversized_eviction_limit_and_bad_phase(client: DirectoryClient) -> None:
    await client.switch_phase("n1", Role.PREFILL)
    with pytest.raises(DirectoryRpcError) as err:
        await client.eviction_order("n1", limit=10**8)
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT and "limit" in err.value.reason
    bad = client.stub.SwitchPhase(pb.SwitchPhaseRequest(node="n1", phase=pb.PHASE_UNSPECIFIED))
    with pytest.raises(grpc.aio.AioRpcError) as rpc_err:
        await bad
    assert rpc_err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("method", "kind"),
    [("Resolve", "unary_unary"), ("WatchCounts", "unary_stream"), ("PublishEvents", "stream_stream")],
)
async def test_malformed_bytes_get_invalid_argument(client: DirectoryClient, method: str, kind: str) -> None:
    garbage = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length-delimited, absurd length
    call = getattr(client.channel, kind)(f"/agentpool.v1.Directory/{method}")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        if kind == "unary_unary":
            await call(garbage)
        elif kind == "unary_stream":
            async for _ in call(garbage):
                pass
        else:
            stream = call()
            await stream.write(garbage)
            await stream.read()
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed" in (err.value.details() or "")
    assert (await client.health()).serving


async def test_a_request_no_node_took_changes_nothing(client: DirectoryClient) -> None:
    """Resolve is read-only: a rewrite resolved but never placed (the engine answered 429/503) keeps
    the branch's version, path and counts; the Place of the retried request applies E.1 once."""
    chain = block_hashes(list(range(4 * 4)), 4)
    await client.switch_phase("p1", Role.PREFILL)
    await client.place("a", "p1", chain[:3])
    rewrite = [chain[0], 77, 78]
    for _ in range(3):  # three rejected attempts of a rewriting request
        res = await client.resolve(rewrite, "a")
        assert res.branch is not None and res.branch.version == 2 and res.branch.version_bumped
    res = await client.resolve(chain[:4], "a")  # an extension instead: no bump
    assert res.branch is not None and res.branch.version == 1 and not res.branch.version_bumped
    assert await count_snapshot(client, "p1") == {h: 1 for h in chain[:3]}
    placed = await client.place("a", "p1", rewrite)
    assert (placed.version, placed.version_bumped) == (2, True)
    assert await count_snapshot(client, "p1") == {chain[0]: 1, 77: 1, 78: 1}
    placed = await client.place("a", "p1", rewrite)  # the decode binding of the same request
    assert (placed.version, placed.version_bumped) == (2, False)


async def count_snapshot(client: DirectoryClient, node: str) -> dict[int, int]:
    stream = client.watch_counts(node)
    first = await asyncio.wait_for(anext(stream), 5)
    await stream.aclose()
    return first.counts
