"""The router's ``Route`` stream over real gRPC, state in the real Redis: operations apply in order,
quiet Places answer only when they fail, bad operations do not end the stream, a restart is survived."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from conftest import config_for

from agentpool.directory import framing
from agentpool.directory.client import DirectoryClient, DirectoryRpcError, NodePublisher
from agentpool.directory.redis_store import RedisBranchStore
from agentpool.directory.server import DirectoryConfig, DirectoryServer
from agentpool.directory.session import DirectorySession
from agentpool.kv import Role, Tier
from agentpool.kv.hashing import ROOT_HASH, block_hashes
from agentpool.v1 import directory_pb2 as pb

pytestmark = pytest.mark.integration

CHAIN = block_hashes(list(range(4 * 6)), 4)  # 6 blocks, page 4


async def test_resolve_and_place_on_the_stream_match_the_unary_calls(client: DirectoryClient) -> None:
    events = client.open_events()
    p1 = NodePublisher(events, "p1", Role.PREFILL)
    await p1.resync([])
    await p1.stored(ROOT_HASH, CHAIN[:4], Tier.GPU)
    session = DirectorySession(client)
    try:
        answer = await session.resolve(CHAIN, "b1", omit_paths=False)
        unary = await client.resolve(CHAIN, "b1")
        assert [(n.node, n.gpu_blocks, n.local_tokens) for n in answer.nodes] == [("p1", 4, 16)]
        assert unary.nodes["p1"].gpu_blocks == 4 and unary.branch is not None
        assert answer.branch.version == unary.branch.version == 1 and answer.branch.is_new
        assert tuple(answer.branch.new_path) == tuple(CHAIN)
        assert (await client.health()).branches == 0  # Resolve only looks

        placed = await session.place_and_wait("b1", "p1", CHAIN[:3])
        assert placed.is_new and placed.version == 1 and placed.counted_nodes == ["p1"]
        assert placed.counted_blocks == 3
        rewritten = [*CHAIN[:2], 99, 98]
        answer = await session.resolve(rewritten, "b1")
        assert answer.branch.version_bumped and not answer.branch.new_path  # omit_paths by default
    finally:
        await session.close()
        await events.close()


async def test_a_quiet_place_is_seen_by_the_next_resolve_on_the_stream(
    client: DirectoryClient, server: DirectoryServer
) -> None:
    """The place is not waited for, yet the Resolve sent after it sees it: one stream, one order."""
    errors: list[DirectoryRpcError] = []
    session = DirectorySession(client, errors.append)
    try:
        await client.switch_phase("p1", Role.BOTH)
        # each Resolve extends the path just placed: had the Place not been applied first, the first
        # would create the branch and the third would bump it
        for version, path in ((1, CHAIN[:2]), (1, CHAIN[:4]), (2, [CHAIN[0], 7])):
            session.place("agent", "p1", path)
            answer = await session.resolve([*path, 5], "agent")
            assert answer.branch.version == version
            assert not answer.branch.is_new and not answer.branch.version_bumped
        assert server.service.dir.branches.get("agent").version == 2
        assert errors == []
        session.place("bad branch id with spaces", "p1", CHAIN)  # refused: reported, stream goes on
        assert (await session.resolve(CHAIN, None)).page_size == 4
        for _ in range(50):
            if errors:
                break
            await asyncio.sleep(0.01)
        assert [e.code for e in errors] == [grpc.StatusCode.INVALID_ARGUMENT]
    finally:
        await session.close()


async def test_bad_operations_get_error_replies_and_the_stream_goes_on(client: DirectoryClient) -> None:
    session = DirectorySession(client)
    try:
        with pytest.raises(DirectoryRpcError) as err:
            await session.resolve([0, 1], None)  # hash 0 is the root, not a block
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "root hash" in err.value.reason
        with pytest.raises(DirectoryRpcError) as err:
            await session.place_and_wait("never-seen", "p1")  # no hashes: the branch must exist
        assert err.value.code == grpc.StatusCode.NOT_FOUND
        assert (await session.resolve(CHAIN, "x")).branch.is_new
    finally:
        await session.close()


async def test_a_malformed_batch_ends_the_stream_with_invalid_argument(server: DirectoryServer) -> None:
    async with DirectoryClient(server.address) as c:
        call = c.channel.stream_stream("/agentpool.v1.Directory/Route")()
        await call.write(b"\xff\xff\xff")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed RouteBatch" in (err.value.details() or "")


async def test_operations_queued_together_travel_in_one_message(client: DirectoryClient) -> None:
    session = DirectorySession(client)
    try:
        answers = await asyncio.gather(*(session.resolve(CHAIN[: 1 + i % 6], f"a{i}") for i in range(40)))
        assert all(a.branch.is_new and a.page_size == 4 for a in answers)
    finally:
        await session.close()


@pytest.mark.parametrize(
    ("branch", "node", "hashes", "omit"),
    [("b", "n", CHAIN, True), ("", "", [], False), ("é" * 200, "n" * 130, [(1 << 64) - 1] * 40, True)],
)
def test_hand_written_requests_are_the_generated_encodings(
    branch: str, node: str, hashes: list[int], omit: bool
) -> None:
    """Byte for byte what protobuf writes (empty fields left out, strings as UTF-8, long lengths)."""
    expected = pb.ResolveRequest(block_hashes=hashes, branch=branch, omit_paths=omit).SerializeToString()
    assert framing.resolve_request(hashes, branch, omit) == expected
    placed = pb.PlaceRequest(branch=branch, node=node, block_hashes=hashes).SerializeToString()
    assert framing.place_request(branch, node, hashes) == placed


def test_a_string_utf8_cannot_hold_is_refused_as_protobuf_refuses_it() -> None:
    with pytest.raises(ValueError):
        framing.resolve_request(CHAIN, "\ud800")
    with pytest.raises(ValueError):
        framing.place_request("b", "\ud800", CHAIN)
    with pytest.raises(ValueError):
        pb.PlaceRequest(branch="b", node="\ud800").SerializeToString()


def test_hand_written_encodings_parse_as_the_generated_messages() -> None:
    batch = pb.RouteBatch.FromString(
        framing.route_op(7, resolve=framing.resolve_request(CHAIN, "b", omit_paths=True))
        + framing.route_op(300, place=framing.place_request("b", "n", CHAIN[:2]), quiet=True)
        + framing.route_op(1 << 40, place=framing.place_request("b", "n", []))
    )
    first, second, third = batch.ops
    assert first.id == 7 and list(first.resolve.block_hashes) == CHAIN and first.resolve.omit_paths
    assert second.id == 300 and second.quiet and list(second.place.block_hashes) == CHAIN[:2]
    assert third.id == 1 << 40 and third.WhichOneof("op") == "place" and not third.quiet
    replies = pb.RouteReplies.FromString(
        framing.resolve_reply(1, pb.ResolveResponse(page_size=4).SerializeToString())
        + framing.place_reply(2, pb.PlaceResponse(version=3))
        + framing.error_reply(3, grpc.StatusCode.NOT_FOUND.value[0], "gone")
    )
    assert [r.WhichOneof("result") for r in replies.replies] == ["resolve", "place", "error"]
    assert replies.replies[0].resolve.page_size == 4 and replies.replies[1].place.version == 3
    assert replies.replies[2].error.reason == "gone"
    with pytest.raises(ValueError):
        framing.route_op(1)
    with pytest.raises(ValueError):
        framing.resolve_request([-1], "")


async def test_the_stream_reopens_after_a_directory_restart(namespace: str) -> None:
    cfg: DirectoryConfig = config_for(namespace)
    first = DirectoryServer(cfg)
    await first.start()
    port = first.port
    errors: list[DirectoryRpcError] = []
    async with DirectoryClient(first.address, timeout_s=2) as c:
        session = DirectorySession(c, errors.append)
        try:
            await c.switch_phase("p1", Role.BOTH)
            session.place("agent", "p1", CHAIN[:3])
            assert (await session.resolve(CHAIN, "agent")).branch.version == 1
            await first.stop(grace=None)
            with pytest.raises(DirectoryRpcError):
                await session.resolve(CHAIN, "agent")
            second = DirectoryServer(config_for(namespace, port=port))
            await second.start()
            try:
                for _ in range(100):  # the channel reconnects; the next operation opens a new stream
                    try:
                        answer = await session.resolve(CHAIN, "agent")
                        break
                    except DirectoryRpcError:
                        await asyncio.sleep(0.05)
                else:
                    raise AssertionError("no answer from the restarted directory")
                assert not answer.branch.is_new  # the Place reached Redis before the restart
                assert errors == []
            finally:
                await second.stop()
        finally:
            await session.close()


async def test_a_wrong_token_fails_the_resolve_with_unauthenticated(namespace: str) -> None:
    srv = DirectoryServer(config_for(namespace, auth_token="route-test-token-0123456789"))
    await srv.start()
    try:
        async with DirectoryClient(srv.address, token="not-the-token-0123456789") as c:
            session = DirectorySession(c)
            with pytest.raises(DirectoryRpcError) as err:
                await session.resolve(CHAIN, None)
            assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
            await session.close()
        async with DirectoryClient(srv.address, token="route-test-token-0123456789") as c:
            session = DirectorySession(c)
            assert (await session.resolve(CHAIN, None)).page_size == 4
            await session.close()
    finally:
        await srv.stop()


async def test_a_lone_quiet_place_goes_out_within_its_delay(
    client: DirectoryClient, server: DirectoryServer
) -> None:
    session = DirectorySession(client, place_delay_s=0.05)
    try:
        await client.switch_phase("p1", Role.BOTH)
        assert (await session.resolve(CHAIN, None)).page_size == 4  # the stream is open
        session.place("lone", "p1", CHAIN[:2])
        loop = asyncio.get_running_loop()
        sent = loop.time()
        while "lone" not in server.service.dir.branches:
            assert loop.time() - sent < 2.0, "the Place never went out"
            await asyncio.sleep(0.005)
        assert loop.time() - sent >= 0.04  # it waited for company first
    finally:
        await session.close()


class _CountedRoute:
    """The session's ``RouteClient`` seam over the real client, counting the messages written."""

    def __init__(self, client: DirectoryClient) -> None:
        self.client = client
        self.timeout_s = client.timeout_s
        self.messages: list[bytes] = []

    def open_route(self) -> _CountedStream:
        return _CountedStream(self, self.client.open_route())


class _CountedStream:
    def __init__(self, owner: _CountedRoute, inner: Any) -> None:
        self.owner, self.inner = owner, inner

    async def write(self, data: bytes) -> None:
        self.owner.messages.append(data)
        await self.inner.write(data)

    async def read(self) -> bytes:
        data: bytes = await self.inner.read()
        return data

    async def done_writing(self) -> None:
        await self.inner.done_writing()

    def cancel(self) -> None:
        self.inner.cancel()


async def test_a_quiet_place_travels_with_a_resolve_sent_10_ms_later(
    client: DirectoryClient, server: DirectoryServer
) -> None:
    """With the default delay, a router at 100 requests a second (a Resolve every 10 ms) sends each
    Place with the next Resolve: one message, applied in order (the Resolve sees the Place)."""
    counted = _CountedRoute(client)
    session = DirectorySession(counted)
    try:
        await client.switch_phase("p1", Role.BOTH)
        assert (await session.resolve(CHAIN, "ten")).branch.is_new  # the stream is open
        session.place("ten", "p1", CHAIN)
        await asyncio.sleep(0.01)
        before = len(counted.messages)
        answer = await session.resolve(CHAIN, "ten")
        assert not answer.branch.is_new and answer.branch.counted_nodes == ["p1"]  # saw the Place
        assert len(counted.messages) == before + 1
        ops = pb.RouteBatch.FromString(counted.messages[-1]).ops
        assert [op.WhichOneof("op") for op in ops] == ["place", "resolve"] and ops[0].quiet
    finally:
        await session.close()


async def test_closing_the_session_sends_the_places_still_queued(
    client: DirectoryClient, server: DirectoryServer
) -> None:
    errors: list[DirectoryRpcError] = []
    session = DirectorySession(client, errors.append, place_delay_s=10.0)
    await client.switch_phase("p1", Role.BOTH)
    session.place("queued", "p1", CHAIN[:2])
    session.place("bad id with spaces", "p1", CHAIN[:2])
    await session.close()
    assert server.service.dir.branches.get("queued").counted == {"p1": frozenset(CHAIN[:2])}
    assert [e.code for e in errors] == [grpc.StatusCode.INVALID_ARGUMENT]  # answered before the end


class _GatedRoute:
    """The session's ``RouteClient`` seam over the real client: each stream's writes wait for
    ``gate`` (a message being written when the session is closed)."""

    def __init__(self, client: DirectoryClient) -> None:
        self.client = client
        self.timeout_s = client.timeout_s
        self.gate = asyncio.Event()
        self.writing = asyncio.Event()

    def open_route(self) -> _GatedStream:
        return _GatedStream(self, self.client.open_route())


class _GatedStream:
    def __init__(self, owner: _GatedRoute, inner: Any) -> None:
        self.owner, self.inner = owner, inner

    async def write(self, data: bytes) -> None:
        self.owner.writing.set()
        await self.owner.gate.wait()
        await self.inner.write(data)

    async def read(self) -> bytes:
        data: bytes = await self.inner.read()
        return data

    async def done_writing(self) -> None:
        await self.inner.done_writing()

    def cancel(self) -> None:
        self.inner.cancel()


async def test_places_queued_while_a_message_is_written_go_out_before_the_session_closes(
    client: DirectoryClient, server: DirectoryServer
) -> None:
    """Closing while the writer is in the middle of a message: the Places queued meanwhile still go
    out (they were dropped and reported as failed with "the directory closed the Route stream")."""
    errors: list[DirectoryRpcError] = []
    gated = _GatedRoute(client)
    session = DirectorySession(gated, errors.append, place_delay_s=0.0)
    await client.switch_phase("p1", Role.BOTH)
    session.place("first", "p1", CHAIN[:2])
    await asyncio.wait_for(gated.writing.wait(), 2.0)  # "first" is being written
    session.place("second", "p1", CHAIN[:3])
    closing = asyncio.create_task(session.close())
    await asyncio.sleep(0.01)  # close() has asked the writer to finish
    gated.gate.set()
    await closing
    assert errors == []
    branches = server.service.dir.branches
    assert branches.get("second").counted == {"p1": frozenset(CHAIN[:3])}
    assert branches.get("first").counted == {"p1": frozenset(CHAIN[:2])}


async def test_places_applied_together_share_one_redis_round_trip(
    client: DirectoryClient, server: DirectoryServer
) -> None:
    """Group commit: the Places of one message are saved in one MULTI/EXEC, in order."""
    store = server.store
    assert isinstance(store, RedisBranchStore)
    await client.switch_phase("p1", Role.BOTH)
    session = DirectorySession(client)
    try:
        before = store.round_trips
        placed = await asyncio.gather(
            *(session.place_and_wait(f"g{i}", "p1", CHAIN[: 1 + i % 6]) for i in range(20))
        )
        assert all(p.is_new and p.counted_blocks == 1 + i % 6 for i, p in enumerate(placed))
        assert store.round_trips - before <= 2  # 20 Places (a sweep may add one)
    finally:
        await session.close()
    _, rows = await store.load()  # what Redis holds: every branch, its counts
    by_id = {r.branch_id: r for r in rows}
    assert all(by_id[f"g{i}"].counted["p1"] == frozenset(CHAIN[: 1 + i % 6]) for i in range(20))


@pytest.mark.parametrize("own_timeout", [False, True], ids=["caller-timeout", "resolve-timeout_s"])
async def test_a_stuck_stream_is_replaced_once_a_caller_gave_up_on_it(own_timeout: bool) -> None:
    """A peer that takes the stream and never answers (a hung directory): after a Resolve went
    unanswered for ``stale_s``, the next operation opens a new stream instead of queueing behind.
    The caller's limit is its own ``asyncio.timeout``, or the Resolve's ``timeout_s`` (the router's
    way: DEADLINE_EXCEEDED, well before the client's 30 s)."""
    opened: list[int] = []

    async def swallow(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> None:
        opened.append(1)
        async for _ in requests:
            pass
        await asyncio.sleep(3600)

    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(swallow)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("agentpool.v1.Directory", {"Route": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with DirectoryClient(f"127.0.0.1:{port}", timeout_s=30) as c:
            session = DirectorySession(c, stale_s=0.1)
            for attempt in (1, 2):
                if own_timeout:
                    loop = asyncio.get_running_loop()
                    asked = loop.time()
                    with pytest.raises(DirectoryRpcError) as err:
                        await session.resolve(CHAIN, None, timeout_s=0.3)
                    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
                    assert 0.25 <= loop.time() - asked < 5.0
                else:
                    with pytest.raises(TimeoutError):
                        async with asyncio.timeout(0.3):  # the caller's own limit
                            await session.resolve(CHAIN, None)
                for _ in range(100):
                    if len(opened) == attempt:
                        break
                    await asyncio.sleep(0.01)
                assert len(opened) == attempt  # a fresh stream for the second attempt
            await session.close(grace_s=0.1)
    finally:
        await server.stop(None)


async def test_an_end_branch_on_the_stream_comes_after_the_branchs_quiet_places(
    client: DirectoryClient, server: DirectoryServer
) -> None:
    await client.switch_phase("p1", Role.BOTH)
    session = DirectorySession(client, place_delay_s=10.0)  # the Place waits: only order can save it
    try:
        session.place("ending", "p1", CHAIN[:3])
        assert await session.end_branch("ending") == 1  # it saw the Place: one node released
        assert "ending" not in server.service.dir.branches
        assert server.service.dir.counts.counts_view("p1") == {}
        with pytest.raises(DirectoryRpcError) as err:
            await session.end_branch("ending")
        assert err.value.code == grpc.StatusCode.NOT_FOUND
    finally:
        await session.close()
    _, rows = await server.store.load()
    assert "ending" not in {r.branch_id for r in rows}
