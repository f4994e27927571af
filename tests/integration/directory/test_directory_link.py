"""The Route link (the router's Resolves and Places on a framed connection) against a real directory
server with its state in the real Redis: the same answers as the gRPC Route stream, the token and TLS
required as on gRPC, bad input answered with a status, a restart survived by reconnecting."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from conftest import config_for
from directory_processes import TOKEN as TOKEN_FILE_TOKEN
from directory_processes import start_directory_process
from tls_certs import ca_and_certs

from agentpool.directory import framing
from agentpool.directory.client import DirectoryClient, DirectoryRpcError, NodePublisher
from agentpool.directory.link import BATCH, END, HELLO, MAGIC, frame
from agentpool.directory.link_client import LinkClient, client_ssl_context
from agentpool.directory.server import DirectoryServer
from agentpool.directory.session import DirectorySession
from agentpool.kv import Role, Tier
from agentpool.kv.hashing import ROOT_HASH, block_hashes
from agentpool.v1 import directory_pb2 as pb

pytestmark = pytest.mark.integration

CHAIN = block_hashes(list(range(4 * 6)), 4)  # 6 blocks, page 4
TOKEN = "link-token-0123456789"


@pytest.fixture
async def linked(namespace: str) -> AsyncIterator[DirectoryServer]:
    srv = DirectoryServer(config_for(namespace, auth_token=TOKEN, link_port=0))
    await srv.start()
    yield srv
    await srv.stop()


async def test_the_link_answers_as_the_grpc_stream_does(linked: DirectoryServer) -> None:
    assert linked.link_address is not None
    async with DirectoryClient(linked.address, token=TOKEN) as grpc_client:
        events = grpc_client.open_events()
        p1 = NodePublisher(events, "p1", Role.PREFILL)
        await p1.resync([])
        await p1.stored(ROOT_HASH, CHAIN[:4], Tier.GPU)
        link = LinkClient(linked.link_address, token=TOKEN)
        errors: list[DirectoryRpcError] = []
        over_link, over_grpc = DirectorySession(link, errors.append), DirectorySession(grpc_client)
        try:
            a = await over_link.resolve(CHAIN, "b1", omit_paths=False)
            b = await over_grpc.resolve(CHAIN, "b1", omit_paths=False)
            assert a == b and [(n.node, n.gpu_blocks) for n in a.nodes] == [("p1", 4)]
            # a quiet Place is seen by the next Resolve of the same link; EndBranch comes after it
            over_link.place("b1", "p1", CHAIN[:3])
            assert (await over_link.resolve([*CHAIN[:3], 5], "b1")).branch.version == 1
            assert (await over_link.resolve([CHAIN[0], 7], "b1")).branch.version_bumped
            assert (await over_link.place_and_wait("b1", "p1", CHAIN[:2])).counted_blocks == 2
            assert await over_link.end_branch("b1") == 1
            over_link.place("bad branch id", "p1", CHAIN)  # refused: reported, the link goes on
            assert (await over_link.resolve(CHAIN, None)).page_size == 4
            for _ in range(100):
                if errors:
                    break
                await asyncio.sleep(0.01)
            assert [e.code for e in errors] == [grpc.StatusCode.INVALID_ARGUMENT]
            health = await link.health()
            assert health.serving and health.nodes == 1 and health.blocks == 4
        finally:
            await over_link.close()
            await over_grpc.close()
            await events.close()


async def test_the_token_is_required_on_the_link(linked: DirectoryServer) -> None:
    assert linked.link_address is not None
    for token in (None, "wrong-token-0123456789", TOKEN + "x"):
        link = LinkClient(linked.link_address, token=token)
        with pytest.raises(DirectoryRpcError) as err:
            await link.health()
        assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
        session = DirectorySession(link)
        with pytest.raises(DirectoryRpcError) as err:
            await session.resolve(CHAIN, None)
        assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
        await session.close()
    assert linked.service.dir.branches.ids() == []


async def raw_exchange(address: str, data: bytes) -> pb.RouteError:
    """Send ``data`` on a bare connection; the END frame the directory answers with."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        while True:
            size, kind = struct.unpack(">IB", await asyncio.wait_for(reader.readexactly(5), 10))
            payload = await reader.readexactly(size - 1)
            if kind == END:
                return pb.RouteError.FromString(payload)
    finally:
        writer.close()


async def test_bad_frames_end_the_link_with_a_status(namespace: str) -> None:
    srv = DirectoryServer(config_for(namespace, auth_token=TOKEN, link_port=0, max_message_bytes=4096))
    await srv.start()
    try:
        address = srv.link_address
        assert address is not None
        hello = frame(HELLO, MAGIC + f"Bearer {TOKEN}".encode())
        invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
        end = await raw_exchange(address, frame(BATCH, b"\xff\xff"))  # no HELLO first
        assert end.code == invalid and "HELLO" in end.reason
        end = await raw_exchange(address, hello + frame(BATCH, b"\x0a\x05\x08"))  # a malformed RouteBatch
        assert end.code == invalid and "malformed RouteBatch" in end.reason
        end = await raw_exchange(address, hello + struct.pack(">IB", 100_000, BATCH))  # over the limit
        assert end.code == invalid and "more than the limit of 4096" in end.reason
        end = await raw_exchange(address, hello + frame(99))
        assert end.code == invalid and "kind 99" in end.reason
        ok = framing.route_op(1, resolve=framing.resolve_request(CHAIN, ""))
        end = await raw_exchange(address, hello + frame(BATCH, ok) + frame(3))  # DONE: a clean end
        assert end.code == 0
    finally:
        await srv.stop()


async def test_a_restarted_directory_is_reached_again(namespace: str) -> None:
    config = config_for(namespace, auth_token=TOKEN, link_port=0)
    srv = DirectoryServer(config)
    await srv.start()
    address = srv.link_address
    assert address is not None
    session = DirectorySession(LinkClient(address, token=TOKEN, timeout_s=2))
    try:
        assert (await session.resolve(CHAIN, None)).page_size == 4
        await srv.stop()
        with pytest.raises(DirectoryRpcError) as err:
            await session.resolve(CHAIN, None)
        assert err.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        srv = DirectoryServer(config.model_copy(update={"link_port": int(address.rsplit(":", 1)[1])}))
        await srv.start()
        assert (await session.resolve(CHAIN, None)).page_size == 4  # a new connection
    finally:
        await session.close()
        await srv.stop()


async def test_tls_and_mutual_tls_on_the_link(namespace: str, tmp_path: Path) -> None:
    f = ca_and_certs(tmp_path)
    srv = DirectoryServer(
        config_for(
            namespace,
            auth_token=TOKEN,
            link_port=0,
            tls_cert_file=f["srv.crt"],
            tls_key_file=f["srv.key"],
            tls_client_ca_file=f["ca.crt"],
        )
    )
    await srv.start()
    try:
        address = srv.link_address
        assert address is not None
        mtls = client_ssl_context(f["ca.crt"], f["cli.crt"], f["cli.key"])
        assert (await LinkClient(address, token=TOKEN, ssl_context=mtls).health()).serving
        session = DirectorySession(LinkClient(address, token=TOKEN, ssl_context=mtls))
        assert (await session.resolve(CHAIN, None)).page_size == 4
        await session.close()
        no_cert = client_ssl_context(f["ca.crt"])
        with pytest.raises(DirectoryRpcError) as err:  # no client certificate: the handshake fails
            await LinkClient(address, token=TOKEN, ssl_context=no_cert, timeout_s=2).health()
        assert err.value.code is grpc.StatusCode.UNAVAILABLE
        with pytest.raises(DirectoryRpcError) as err:  # plain TCP to a TLS listener
            await LinkClient(address, token=TOKEN, timeout_s=2).health()
        assert err.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        with pytest.raises(DirectoryRpcError) as err:  # mTLS does not replace the token
            await LinkClient(address, token="nope-0123456789abcdef", ssl_context=mtls).health()
        assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
    finally:
        await srv.stop()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
async def test_the_directory_cli_serves_the_link_and_the_grpc_stream_on_either_loop(
    namespace: str, loop: str
) -> None:
    """``python -m agentpool.directory --loop ...`` (uvloop by default): a Resolve, a quiet Place seen
    by the next Resolve and an EndBranch on the Route link and on the gRPC Route stream."""
    proc, address = await start_directory_process(namespace, "--link-port", "0", "--loop", loop)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("directory link listening on "), line
        async with DirectoryClient(address, token=TOKEN_FILE_TOKEN) as grpc_client:
            await grpc_client.switch_phase("p1", Role.BOTH)
            link = LinkClient(line.split()[-1], token=TOKEN_FILE_TOKEN)
            for i, session in enumerate((DirectorySession(link), DirectorySession(grpc_client))):
                try:
                    assert (await session.resolve(CHAIN, f"cli{i}")).branch.is_new
                    session.place(f"cli{i}", "p1", CHAIN[:3])
                    answer = await session.resolve(CHAIN, f"cli{i}")
                    assert not answer.branch.is_new and answer.branch.counted_nodes == ["p1"]
                    assert await session.end_branch(f"cli{i}") == 1
                finally:
                    await session.close()
            assert (await link.health()).serving
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 15) == 0
