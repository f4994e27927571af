"""Test certificates made with ``openssl``: a CA, a server certificate for 127.0.0.1 and a client
certificate signed by it (directory, Route link and router TLS tests)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def ca_and_certs(tmp: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    out = {name: tmp / name for name in ("ca.crt", "ca.key", "srv.crt", "srv.key", "cli.crt", "cli.key")}
    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(out["ca.key"]),
        "-out",
        str(out["ca.crt"]),
        "-days",
        "1",
        "-subj",
        "/CN=agentpool-test-ca",
    )
    for who, cn, ext in (("srv", "localhost", "subjectAltName=IP:127.0.0.1"), ("cli", "engine-1", "")):
        csr = tmp / f"{who}.csr"
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(out[f"{who}.key"]),
            "-out",
            str(csr),
            "-subj",
            f"/CN={cn}",
        )
        extfile = tmp / f"{who}.ext"
        extfile.write_text(ext + "\n")
        run(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(out["ca.crt"]),
            "-CAkey",
            str(out["ca.key"]),
            "-CAcreateserial",
            "-out",
            str(out[f"{who}.crt"]),
            "-days",
            "1",
            "-extfile",
            str(extfile),
        )
    return out
