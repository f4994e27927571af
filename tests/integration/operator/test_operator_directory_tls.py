"""The files the operator mounts for directory TLS and mutual TLS work with the real services: the
router's directory connection from its flags' files (a real directory with mTLS on loopback), the
planner's and engine's reader of the same files, and the router's command line refusing bad ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from agentpool.directory.auth import ConfigurationError, read_client_tls
from agentpool.directory.client import DirectoryRpcError
from agentpool.directory.server import DirectoryConfig, DirectoryServer
from agentpool.router.__main__ import directory_view
from agentpool.router.grpc_directory import GrpcDirectoryView

TOKEN = "directory-token-0123456789"


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def issue(tmp: Path, ca: str, who: str, cn: str, ext: str) -> None:
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp / f"{who}.key"),
            "-out", str(tmp / f"{who}.csr"), "-subj", f"/CN={cn}")  # fmt: skip
    (tmp / f"{who}.ext").write_text(ext + "\n")
    openssl("x509", "-req", "-in", str(tmp / f"{who}.csr"), "-CA", str(tmp / f"{ca}.crt"),
            "-CAkey", str(tmp / f"{ca}.key"), "-CAcreateserial", "-out", str(tmp / f"{who}.crt"),
            "-days", "1", "-extfile", str(tmp / f"{who}.ext"))  # fmt: skip


def pki(tmp: Path) -> Path:
    """Two CAs as `directoryTls` names them: one signs the directory's certificate, the other the
    clients' (each Secret's `ca.crt` is the CA of its own `tls.crt`)."""
    for ca in ("server-ca", "client-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp / f"{ca}.key"),
                "-out", str(tmp / f"{ca}.crt"), "-days", "1", "-subj", f"/CN={ca}")  # fmt: skip
    issue(tmp, "server-ca", "directory", "localhost", "subjectAltName=IP:127.0.0.1")
    issue(tmp, "client-ca", "client", "agentpool-client", "")
    (tmp / "token").write_text(TOKEN)
    return tmp


async def test_the_router_reaches_a_mutual_tls_directory_with_the_mounted_files(tmp_path: Path) -> None:
    f = pki(tmp_path)
    server = DirectoryServer(
        DirectoryConfig(
            port=0,
            redis_url=None,
            auth_token=TOKEN,
            tls_cert_file=f / "directory.crt",
            tls_key_file=f / "directory.key",
            tls_client_ca_file=f / "client-ca.crt",
        )
    )
    await server.start()
    try:
        view = directory_view(
            server.address, 64, f / "token", f / "server-ca.crt", f / "client.crt", f / "client.key"
        )
        assert isinstance(view, GrpcDirectoryView)
        try:
            assert (await view.client.health()).serving
        finally:
            await view.close()
        # without the client certificate the handshake fails: the directory requires it
        view = directory_view(server.address, 64, f / "token", f / "server-ca.crt")
        assert isinstance(view, GrpcDirectoryView)
        try:
            with pytest.raises(DirectoryRpcError) as err:
                await view.client.health()
            assert err.value.code is grpc.StatusCode.UNAVAILABLE
        finally:
            await view.close()
    finally:
        await server.stop()


async def test_the_router_reaches_the_route_link_with_the_same_files(tmp_path: Path) -> None:
    """``--directory link://HOST:PORT`` with the same mTLS files the operator mounts: the link's TLS
    needs the client certificate as the gRPC port does."""
    f = pki(tmp_path)
    server = DirectoryServer(
        DirectoryConfig(
            port=0,
            link_port=0,
            redis_url=None,
            auth_token=TOKEN,
            tls_cert_file=f / "directory.crt",
            tls_key_file=f / "directory.key",
            tls_client_ca_file=f / "client-ca.crt",
        )
    )
    await server.start()
    try:
        target = f"link://{server.link_address}"
        view = directory_view(
            target, 64, f / "token", f / "server-ca.crt", f / "client.crt", f / "client.key"
        )
        assert isinstance(view, GrpcDirectoryView)
        try:
            assert await view.health() == "ok"
            assert (await view.resolve([1, 2], "agent-1", None)).branch_version == 1
        finally:
            await view.close()
        view = directory_view(target, 64, f / "token", f / "server-ca.crt")
        try:
            with pytest.raises(DirectoryRpcError) as err:  # no client certificate: no handshake
                await view.client.health()
            assert err.value.code is grpc.StatusCode.UNAVAILABLE
        finally:
            await view.close()
    finally:
        await server.stop()


def test_the_clients_reader_refuses_what_would_not_work(tmp_path: Path) -> None:
    f = pki(tmp_path)
    tls = read_client_tls(f / "server-ca.crt", f / "client.crt", f / "client.key")
    assert tls.root_certificates == (f / "server-ca.crt").read_bytes()
    assert tls.client_key is not None and b"PRIVATE KEY" in tls.client_key
    with pytest.raises(ConfigurationError, match="needs its key file"):
        read_client_tls(f / "server-ca.crt", f / "client.crt")
    with pytest.raises(ConfigurationError, match="cannot read the directory CA file"):
        read_client_tls(f / "missing.crt")
    with pytest.raises(ConfigurationError, match="is not PEM"):
        read_client_tls(f / "token")


def test_the_router_command_line_says_which_tls_file_is_wrong(tmp_path: Path) -> None:
    f = pki(tmp_path)
    config = tmp_path / "router.json"
    config.write_text("{}")
    argv = [
        sys.executable, "-m", "agentpool.router", f"--config={config}", "--port=0",
        "--directory=127.0.0.1:1", f"--directory-token-file={f / 'token'}",
        f"--report-token-file={f / 'token'}", f"--engine-token-file={f / 'token'}",
        f"--directory-ca-file={f / 'server-ca.crt'}",
        f"--directory-client-cert-file={f / 'client.crt'}",
    ]  # fmt: skip
    run = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert run.returncode != 0
    assert "agentpool.router: a client certificate file needs its key file" in run.stderr
    argv[5] = "--directory=link://127.0.0.1:1"  # the Route link reads the same files
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert run.returncode != 0
    assert "agentpool.router: a client certificate file needs its key file" in run.stderr
