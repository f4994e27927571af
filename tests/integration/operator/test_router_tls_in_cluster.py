"""Router HTTPS as `spec.auth.routerTls` sets it up, with the real router started from its command
line over a certificate that names only the router Service (as a cluster's would): the operator
reads a colocated pool's router generation over HTTPS at the pod's IP, trusting only the `ca.crt`
of the Secret; the planner's poller and model pushes reach a router pod at its IP by the Service's
name, with its client certificate and no report token."""

from __future__ import annotations

import base64
import json
import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import Cluster
from process_helpers import engine_token_file, launch, stop_cleanly
from test_operator_kopf import create_pool, pool_manifest, router_pod, status_where
from tls_certs import ca_and_certs

from agentpool.models import DecodeModel, NodeModel, PrefillModel
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.router_models import ModelBroadcast
from agentpool.planner.router_source import RouterWorkSource

pytestmark = pytest.mark.integration

FIT = NodeModel(prefill=PrefillModel(0.01, 5e-5, 1e-10, 1e-7), decode=DecodeModel(0.01, 0.005, 1e-4))


async def https_router(tmp: Path, f: dict[str, Path], *extra: str) -> tuple[Any, str]:
    """The router from its CLI over ``f``'s server certificate, generation 1; its base URL."""
    config = tmp / "router.json"
    nodes = [{"id": "sim-engine-0", "url": "http://127.0.0.1:9", "role": "both"}]
    config.write_text(json.dumps({"model": "m", "policy": "lmetric", "nodes": nodes, "generation": 1}))
    report_token = tmp / "report-token"
    report_token.write_text("r" * 40)
    router = await launch(
        "router", "agentpool.router", "--config", str(config), "--host", "127.0.0.1", "--port", "0",
        "--report-token-file", str(report_token), "--engine-token-file", str(engine_token_file()),
        "--tls-cert-file", str(f["srv.crt"]), "--tls-key-file", str(f["srv.key"]),
        "--tls-client-ca-file", str(f["ca.crt"]), *extra,
    )  # fmt: skip
    url = (await router.wait_for(r"router listening on (https://\S+)")).group(1)
    return router, url


async def test_the_operator_reads_a_tls_routers_generation_by_the_services_name(
    cluster: Cluster, operator: Any, tmp_path: Path
) -> None:
    service = f"sim-router.{cluster.namespace}.svc"
    f = ca_and_certs(tmp_path, f"DNS:{service}")  # no IP: only the Service's name is checked
    data = {"ca.crt": base64.b64encode(f["ca.crt"].read_bytes()).decode()}  # all the operator reads
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": data}
    secret["metadata"] = {"name": "router-tls", "namespace": cluster.namespace}
    await cluster.api.create(secret)
    manifest = pool_manifest(cluster)
    del manifest["spec"]["initialSplit"]
    manifest["spec"].update(mode="colocated", planner={"enabled": False}, router={"policy": "lmetric"})
    manifest["spec"]["auth"] = {"routerTls": {"secretName": "router-tls"}}
    await create_pool(cluster, manifest)
    router, url = await https_router(tmp_path, f)
    try:
        await router_pod(cluster, url)
        obj = await status_where(
            cluster,
            lambda o: (
                (((o.get("status") or {}).get("config") or {}).get("router") or {}).get("loadedGeneration")
                == 1
            ),
            "the TLS router replica's generation",
        )
        assert obj["status"]["config"]["router"] == {
            "loadedGeneration": 1,
            "newestGeneration": 1,
            "replicas": 1,
        }
    finally:
        await stop_cleanly([router])


async def test_the_planner_reaches_router_pods_by_the_services_name_with_its_certificate(
    tmp_path: Path,
) -> None:
    f = ca_and_certs(tmp_path, "DNS:sim-router.team-a.svc")
    router, url = await https_router(tmp_path, f)
    try:
        context = ssl.create_default_context(cafile=str(f["ca.crt"]))
        context.load_cert_chain(f["cli.crt"], f["cli.key"])
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            # no report token: the verified client certificate stands for it
            named = ModelBroadcast([url], session, server_hostname="sim-router.team-a.svc")
            source = RouterWorkSource(
                [url], PlannerInbox(), session, models=named, server_hostname="sim-router.team-a.svc"
            )
            await named.publish({"sim-engine-0": FIT}, time.time())
            assert named.held[url] == named.current.version  # type: ignore[union-attr]
            await source.poll_once()
            (cursor,) = source.routers
            assert cursor.failures == 0 and cursor.config_generation == 1
            assert cursor.models_version == named.current.version  # type: ignore[union-attr]
            # at the pod's IP without the Service's name, the certificate does not match: refused
            by_ip = ModelBroadcast([url], session)
            await by_ip.publish({"sim-engine-0": FIT}, time.time())
            assert by_ip.failures == 1 and by_ip.held[url] is None
            blind = RouterWorkSource([url], PlannerInbox(), session)
            await blind.poll_once()
            assert blind.routers[0].failures == 1
    finally:
        await stop_cleanly([router])
