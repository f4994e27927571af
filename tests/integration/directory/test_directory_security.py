"""Token authentication, TLS and the Prometheus endpoint of the directory server."""

from __future__ import annotations

import asyncio
import hmac
import os
import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp
import grpc
import pytest
import redis.asyncio as aioredis
from conftest import config_for
from process_helpers import free_port
from pydantic import SecretStr
from tls_certs import ca_and_certs, self_signed

import agentpool.directory.auth as auth_module
from agentpool.directory.client import DirectoryClient, DirectoryRpcError, NodePublisher
from agentpool.directory.ingest import resync_block_limit
from agentpool.directory.server import DirectoryConfig, DirectoryServer
from agentpool.kv import ROOT_HASH, HeldBlock, Role, Tier
from agentpool.secret_file.local_tokens import TOKEN_DIR_ENV
from agentpool.v1 import directory_pb2 as pb

pytestmark = pytest.mark.integration

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
TOKEN = "test-token-0123456789abcdef"


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
            assert await c.switch_phase("p1", Role.PREFILL) is None
    finally:
        await srv.stop()


async def test_tls_and_metrics(namespace: str, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    srv = DirectoryServer(config_for(namespace, tls_cert_file=cert, tls_key_file=key, metrics_port=0))
    await srv.start()
    try:
        async with DirectoryClient(srv.address, root_certificates=cert.read_bytes()) as c:
            await c.switch_phase("p1", Role.PREFILL)
            await c.resolve([5, 6], "a")
            await c.place("a", "p1", [5, 6])
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

    monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
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
                await NodePublisher(stream, "n1", Role.PREFILL).resync(held)
            assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
            assert f"resync has {limit + 1} blocks, more than the limit {limit}" in err.value.reason
            ack = await NodePublisher(c.open_events(), "n1", Role.PREFILL).resync(held[:limit])
            assert not ack.resync_requested
            assert (await c.health()).blocks == limit
    finally:
        await srv.stop()


async def test_mutual_tls_requires_a_client_certificate(namespace: str, tmp_path: Path) -> None:
    f = ca_and_certs(tmp_path)
    srv = DirectoryServer(
        config_for(
            namespace,
            auth_token="s3cret",
            tls_cert_file=f["srv.crt"],
            tls_key_file=f["srv.key"],
            tls_client_ca_file=f["ca.crt"],
        )
    )
    await srv.start()
    try:
        ca = f["ca.crt"].read_bytes()
        async with DirectoryClient(srv.address, token="s3cret", root_certificates=ca, timeout_s=2) as c:
            with pytest.raises(DirectoryRpcError) as err:  # no client certificate: the handshake fails
                await c.health()
            assert err.value.code is grpc.StatusCode.UNAVAILABLE
        cert, key = f["cli.crt"].read_bytes(), f["cli.key"].read_bytes()
        async with DirectoryClient(
            srv.address, token="s3cret", root_certificates=ca, client_cert=cert, client_key=key
        ) as c:
            assert (await c.health()).serving
        async with DirectoryClient(
            srv.address, token="nope", root_certificates=ca, client_cert=cert, client_key=key
        ) as c:
            with pytest.raises(DirectoryRpcError) as err:  # mTLS does not replace the token
                await c.health()
            assert err.value.code is grpc.StatusCode.UNAUTHENTICATED
    finally:
        await srv.stop()


def test_config_is_secure_by_default(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a bearer token"):
        DirectoryConfig()
    with pytest.raises(ValueError, match="redis_url carries a password"):
        DirectoryConfig(insecure=True, redis_url="redis://:hunter2@127.0.0.1:6379/0")
    with pytest.raises(ValueError, match="mTLS"):
        DirectoryConfig(insecure=True, tls_client_ca_file=tmp_path / "ca.crt")
    assert DirectoryConfig(auth_token=SecretStr("x" * 16)).auth_token is not None


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentpool.directory", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_command_line_refuses_unsafe_starts(tmp_path: Path) -> None:
    """Run as users run it: a short or missing token file, a per-user token folder others can read, a
    password in the URL are refused with a clear message (exit status 2) before anything listens."""
    open_folder = tmp_path / "open-tokens"
    open_folder.mkdir()
    open_folder.chmod(0o755)
    r = _cli("--port", "0", env={**os.environ, TOKEN_DIR_ENV: str(open_folder)})
    assert r.returncode == 2 and "is open to other users" in r.stderr and "chmod 700" in r.stderr, r.stderr
    r = _cli("--insecure", "--auth-token-file", str(tmp_path / "t"), "--port", "0")
    assert r.returncode == 2 and "exclude each other" in r.stderr
    r = _cli("--insecure", "--port", "0", "--redis-url", "redis://:hunter2@127.0.0.1:6379/0")
    assert r.returncode == 2 and "--redis-url must not carry a password" in r.stderr
    assert "hunter2" not in r.stderr.replace("redis://:hunter2@", "")  # not echoed beyond the usage
    short = tmp_path / "token"
    short.write_text("short\n")
    r = _cli("--auth-token-file", str(short), "--port", "0")
    assert r.returncode == 2 and "fewer than 16" in r.stderr
    r = _cli("--auth-token-file", str(tmp_path / "missing"), "--port", "0")
    assert r.returncode == 2 and "cannot read the directory token file" in r.stderr


async def test_redis_password_from_a_file_or_the_environment(tmp_path: Path) -> None:
    """A private redis-server with requirepass: the directory started from its command line with
    --redis-password-file serves, so does one with AGENTPOOL_REDIS_PASSWORD; without the password it
    cannot load its state and exits."""
    port = free_port()
    redis = await asyncio.create_subprocess_exec(
        REDIS_SERVER,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--requirepass",
        "pw-0123456789",
        "--dir",
        str(tmp_path),
        stdout=asyncio.subprocess.DEVNULL,
    )
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    pw = tmp_path / "redis-password"
    pw.write_text("pw-0123456789\n")
    url = f"redis://127.0.0.1:{port}/0"
    base = ["--auth-token-file", str(token), "--port", "0", "--redis-url", url]
    try:
        await _wait_redis(port, "pw-0123456789")
        no_pw = await asyncio.to_thread(_cli, *base)
        assert no_pw.returncode == 1 and "cannot load the agent state" in no_pw.stderr, no_pw.stderr
        assert "Traceback" not in no_pw.stderr
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agentpool.directory",
            *base,
            "--redis-password-file",
            str(pw),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            assert line.startswith("directory listening on "), line
            async with DirectoryClient(line.split()[-1], token=TOKEN) as c:
                await c.switch_phase("p1", Role.PREFILL)
                assert (await c.health()).store_ok
            r = aioredis.Redis(port=port, password="pw-0123456789")
            assert await r.hget("agentpool:dir:nodes", "p1") == b"prefill"
            await r.aclose()
        finally:
            proc.terminate()
            await proc.wait()
        env = dict(os.environ, AGENTPOOL_REDIS_PASSWORD="pw-0123456789")  # or from the environment
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentpool.directory", *base, stdout=asyncio.subprocess.PIPE, env=env
        )
        try:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            assert line.startswith("directory listening on "), line
            async with DirectoryClient(line.split()[-1], token=TOKEN) as c:
                assert (await c.health()).nodes == 1  # p1, reloaded from the password-protected Redis
        finally:
            proc.terminate()
            await proc.wait()
    finally:
        redis.kill()
        await redis.wait()


async def _wait_redis(port: int, password: str) -> None:
    r = aioredis.Redis(port=port, password=password)
    try:
        for _ in range(100):
            try:
                if await r.ping():
                    return
            except (OSError, aioredis.ConnectionError):
                await asyncio.sleep(0.05)
        raise AssertionError("redis did not start")
    finally:
        await r.aclose()
