"""Token authentication, TLS and the Prometheus endpoint of the directory server."""

from __future__ import annotations

import hmac
import subprocess
from pathlib import Path

import aiohttp
import grpc
import pytest
from conftest import config_for

import agentpool.directory.server as server_module
from agentpool.directory.client import DirectoryClient, DirectoryRpcError, NodePublisher
from agentpool.directory.ingest import resync_block_limit
from agentpool.directory.server import DirectoryServer
from agentpool.kv import ROOT_HASH, HeldBlock, Phase, Tier
from agentpool.v1 import directory_pb2 as pb

pytestmark = pytest.mark.integration


async def test_token_auth_rejects_missing_and_wrong_tokens(namespace: str) -> None:
    srv = DirectoryServer(config_for(namespace, auth_token="s3cret"))
    await srv.start()
    try:
        for token in (None, "wrong"):
            async with DirectoryClient(srv.address, token=token) as c:
                with pytest.raises(DirectoryRpcError) as err:
                    await c.health()
                assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(DirectoryRpcError) as err:
                    await anext(c.watch_counts("p1"))
                assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(DirectoryRpcError) as err:
                    await c.open_events().send(pb.KvEventBatch(node="x"))
                assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
        async with DirectoryClient(srv.address, token="s3cret") as c:
            assert (await c.health()).serving
            assert await c.switch_phase("p1", Phase.PREFILL) is None
    finally:
        await srv.stop()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "tls.crt", tmp / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_tls_and_metrics(namespace: str, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    srv = DirectoryServer(config_for(namespace, tls_cert_file=cert, tls_key_file=key, metrics_port=0))
    await srv.start()
    try:
        async with DirectoryClient(srv.address, root_certificates=cert.read_bytes()) as c:
            await c.switch_phase("p1", Phase.PREFILL)
            await c.resolve([5, 6], "a")
        async with DirectoryClient(srv.address, timeout_s=1.0) as plain:  # plaintext to a TLS port fails
            with pytest.raises(DirectoryRpcError) as err:
                await plain.health()
            assert err.value.code is grpc.StatusCode.UNAVAILABLE
        url = f"http://127.0.0.1:{srv.metrics_port}/metrics"
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            body = await resp.text()
        assert 'agentpool_directory_requests_total{code="OK",method="Resolve"} 1.0' in body
        assert "agentpool_directory_branches 1.0" in body
        assert "agentpool_directory_store_up 1.0" in body
    finally:
        await srv.stop()


async def test_token_is_compared_in_constant_time(namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(server_module.hmac, "compare_digest", spy)
    srv = DirectoryServer(config_for(namespace, auth_token="s3cret"))
    await srv.start()
    try:
        async with DirectoryClient(srv.address, token="s3creT") as c:
            with pytest.raises(DirectoryRpcError):
                await c.health()
        async with DirectoryClient(srv.address, token="s3cret") as c:
            assert (await c.health()).serving
        assert (b"Bearer s3creT", b"Bearer s3cret") in seen and (b"Bearer s3cret", b"Bearer s3cret") in seen
    finally:
        await srv.stop()


async def test_resync_limit_follows_the_max_message_size(namespace: str) -> None:
    """A resync within the block limit always fits in one message; one more block is answered
    INVALID_ARGUMENT with the reason (not a transport error), and the node can resync again."""
    srv = DirectoryServer(config_for(namespace, max_message_bytes=64 << 10))
    limit = resync_block_limit(64 << 10)
    assert srv.service.limits.max_resync_blocks == limit
    chain = [(i + 1) * 0x9E3779B97F4A7C15 % 2**64 or 1 for i in range(limit + 1)]
    held = [HeldBlock(h, chain[i - 1] if i else ROOT_HASH, Tier.GPU | Tier.HOST) for i, h in enumerate(chain)]
    await srv.start()
    try:
        async with DirectoryClient(srv.address) as c:
            stream = c.open_events()
            with pytest.raises(DirectoryRpcError) as err:
                await NodePublisher(stream, "n1", Phase.PREFILL).resync(held)
            assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
            assert f"resync has {limit + 1} blocks, more than the limit {limit}" in err.value.reason
            ack = await NodePublisher(c.open_events(), "n1", Phase.PREFILL).resync(held[:limit])
            assert not ack.resync_requested
            assert (await c.health()).blocks == limit
    finally:
        await srv.stop()
