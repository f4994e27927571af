"""Test certificates made with ``openssl``: a self-signed server certificate, or a CA with a server
certificate for 127.0.0.1 and a client certificate signed by it (directory, Route link and router
TLS tests)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _new_key(key: Path, out: Path, subject: str, *extra: str) -> None:
    """A new RSA key in ``key`` and, with ``extra`` ``-x509 ...``, a certificate (else a request)."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", out, "-subj", subject, *extra)


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key."""
    cert, key = tmp / "tls.crt", tmp / "tls.key"
    _new_key(
        key,
        cert,
        "/CN=localhost",
        "-x509",
        "-days",
        "1",
        "-addext",
        "subjectAltName=IP:127.0.0.1,DNS:localhost",
    )
    return cert, key


def ca_and_certs(tmp: Path, server_names: str = "IP:127.0.0.1") -> dict[str, Path]:
    """A CA, a server certificate for ``server_names`` (a subjectAltName list; 127.0.0.1 by default)
    and a client certificate, both signed by the CA."""
    out = {name: tmp / name for name in ("ca.crt", "ca.key", "srv.crt", "srv.key", "cli.crt", "cli.key")}
    _new_key(out["ca.key"], out["ca.crt"], "/CN=agentpool-test-ca", "-x509", "-days", "1")
    for who, cn, ext in (("srv", "localhost", f"subjectAltName={server_names}"), ("cli", "engine-1", "")):
        csr, extfile = tmp / f"{who}.csr", tmp / f"{who}.ext"
        _new_key(out[f"{who}.key"], csr, f"/CN={cn}")
        extfile.write_text(ext + "\n")
        _openssl(
            "x509", "-req", "-in", csr, "-CA", out["ca.crt"], "-CAkey", out["ca.key"], "-CAcreateserial",
            "-out", out[f"{who}.crt"], "-days", "1", "-extfile", extfile,
        )  # fmt: skip
    return out
