"""The router over HTTPS from its command line, with a client CA: its API serves clients without a
certificate, load reports and fitted models take a certificate the router verified in place of the
report token (mutual TLS), a certificate of another CA fails the handshake; a real engine agent
reports over it with its client certificate and a wrong token."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from engine_processes import engine_config, start_engine, wait_until
from process_helpers import engine_token_file, launch, stop_cleanly
from tls_certs import ca_and_certs

pytestmark = pytest.mark.integration


def client_tls(f: dict[str, Path], cert: dict[str, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(f["ca.crt"]))
    if cert is not None:
        context.load_cert_chain(cert["cli.crt"], cert["cli.key"])
    return context


async def post_report(url: str, tls: ssl.SSLContext, headers: dict[str, str] | None = None) -> int:
    report = {"node_id": "e0", "role": "both"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/agentpool/v1/report", json=report, headers=headers or {}, ssl=tls) as r,
    ):
        return r.status


async def test_reports_over_mutual_tls_need_no_token(tmp_path: Path) -> None:
    (tmp_path / "pool").mkdir()
    (tmp_path / "rogue").mkdir()
    f = ca_and_certs(tmp_path / "pool")
    rogue = ca_and_certs(tmp_path / "rogue")  # a client certificate of another CA
    report_token = tmp_path / "report-token"
    report_token.write_text("r" * 40)
    config = tmp_path / "router.json"
    config.write_text(json.dumps({"model": "m", "nodes": [{"id": "e0", "url": "http://127.0.0.1:9"}]}))
    router = await launch(
        "router", "agentpool.router", "--config", str(config), "--host", "127.0.0.1", "--port", "0",
        "--report-token-file", str(report_token), "--engine-token-file", str(engine_token_file()),
        "--tls-cert-file", str(f["srv.crt"]), "--tls-key-file", str(f["srv.key"]),
        "--tls-client-ca-file", str(f["ca.crt"]),
    )  # fmt: skip
    procs = [router]
    try:
        url = (await router.wait_for(r"router listening on (https://\S+)")).group(1)
        async with aiohttp.ClientSession() as http, http.get(url + "/v1/models", ssl=client_tls(f)) as r:
            assert r.status == 200 and (await r.json())["data"][0]["id"] == "m"  # no certificate needed

        assert await post_report(url, client_tls(f)) == 401
        assert await post_report(url, client_tls(f), {"authorization": "Bearer " + "r" * 40}) == 200
        assert await post_report(url, client_tls(f, f)) == 200  # the verified certificate, no token
        with pytest.raises(aiohttp.ClientError):
            await post_report(url, client_tls(f, rogue))  # another CA's certificate: no handshake
        models: dict[str, Any] = {"version": 1, "models": {}}
        async with (
            aiohttp.ClientSession() as http,
            http.put(url + "/agentpool/v1/models", json=models, ssl=client_tls(f)) as r,
        ):
            assert r.status == 401

        # an engine agent reports with its certificate; its token is wrong, the certificate suffices
        wrong = tmp_path / "wrong-token"
        wrong.write_text("w" * 40)
        target = {
            "url": url,
            "tokenFile": str(wrong),
            "caFile": str(f["ca.crt"]),
            "clientCertFile": str(f["cli.crt"]),
            "clientKeyFile": str(f["cli.key"]),
        }
        engine = await start_engine(tmp_path, engine_config("e0", routers=[target]))
        procs.append(engine)
        async with aiohttp.ClientSession() as http:

            async def reported() -> bool:
                async with http.get(engine.url + "/agentpool/v1/state") as r:
                    s = await r.json()
                return bool(s["reports_sent"] >= 2 and s["report_error"] is None)

            await wait_until(reported, 20, "the engine's reports over mutual TLS", alive=procs)
        await stop_cleanly(procs)
    finally:
        for p in procs:
            await p.stop()


async def test_tls_options_that_do_not_go_together_refuse_the_start(tmp_path: Path) -> None:
    (tmp_path / "pool").mkdir()
    f = ca_and_certs(tmp_path / "pool")
    config = tmp_path / "router.json"
    config.write_text(json.dumps({"model": "m", "nodes": [{"id": "e0", "url": "http://127.0.0.1:9"}]}))
    for args, said in (
        (["--tls-client-ca-file", str(f["ca.crt"])], "needs --tls-cert-file"),
        (["--tls-cert-file", str(f["srv.crt"])], "go together"),
        (["--tls-cert-file", str(f["srv.crt"]), "--tls-key-file", str(f["ca.crt"])], "cannot load"),
    ):
        router = await launch("router", "agentpool.router", "--config", str(config), "--port", "0", *args)
        assert await router.proc.wait() == 2, router.text()
        await router.stop()
        assert said in router.text() and "Traceback" not in router.text(), router.text()
