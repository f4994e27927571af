"""Engines found while the router runs: they register with their reports (the registry) or appear in
a Service's EndpointSlices (KMock stands in for the API server), get requests, and are removed when
they go, so a dead engine is not retried forever."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from process_helpers import kubeconfig
from router_engine_standin import StandIn
from router_harness import chat_body, router_config, start_router, wait_until

from agentpool.router.auth import ReportAuth

pytestmark = pytest.mark.integration
TOKEN = "engine-token-0123456789"
AUTH = {"authorization": f"Bearer {TOKEN}"}
CHAT = "/v1/chat/completions"


async def post_report(http: aiohttp.ClientSession, url: str, body: dict[str, Any], auth: bool = True) -> int:
    async with http.post(url + "/agentpool/v1/report", json=body, headers=AUTH if auth else {}) as resp:
        return resp.status


async def test_engines_register_with_their_reports_and_leave_when_they_stop_reporting() -> None:
    a, b = await StandIn("a", tokens=1).start(), await StandIn("b", tokens=1).start()
    config = router_config([("a", a.url, "both")], discovery={"registryTtl": 0.5})
    r = await start_router(config, report_auth=ReportAuth.token(TOKEN))
    r.service.discovery.tick_s = 0.05
    try:
        async with aiohttp.ClientSession() as http:
            joining = {"node_id": "b", "role": "both", "url": b.url}
            assert await post_report(http, r.url, joining, auth=False) == 401  # forged: nobody joins
            assert await post_report(http, r.url, {"node_id": "b", "role": "both"}) == 404  # no url
            assert "b" not in r.service.nodes
            assert await post_report(http, r.url, joining) == 200
            assert r.service.nodes.get("b").source == "registry"
            await a.kill()  # the configured engine dies; the registered one serves
            for _ in range(4):
                async with http.post(r.url + CHAT, json=chat_body()) as resp:
                    assert resp.status == 200, await resp.text()
            assert len(b.completed) == 4
            # b stops reporting: it is removed within the TTL, and requests find no node
            await wait_until(lambda: "b" not in r.service.nodes, 5, "b removed")
            async with http.post(r.url + CHAT, json=chat_body()) as resp:
                assert resp.status in (502, 503), await resp.text()
            assert len(b.received) == 4
            # it comes back, then leaves cleanly
            assert await post_report(http, r.url, joining) == 200
            async with http.delete(r.url + "/agentpool/v1/engines/b") as resp:
                assert resp.status == 401
            async with http.delete(r.url + "/agentpool/v1/engines/b", headers=AUTH) as resp:
                assert resp.status == 200
            assert "b" not in r.service.nodes
            async with http.delete(r.url + "/agentpool/v1/engines/a", headers=AUTH) as resp:
                assert resp.status == 404  # configured, not registered: the config file says
        metric = r.service.metrics.registry.get_sample_value(
            "agentpool_router_discovered_engines_total", {"source": "registry", "event": "removed"}
        )
        assert metric == 2
    finally:
        await r.stop()
        await a.kill()
        await b.kill()


def endpoint_slice(engines: list[StandIn]) -> dict[str, Any]:
    eps = []
    for e in engines:
        port = int(e.url.rsplit(":", 1)[1])
        eps.append(
            {
                "addresses": ["127.0.0.1"],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": e.node_id, "namespace": "agents"},
                "hints": None,
            }
        )
    labels = {"kubernetes.io/service-name": "engines"}
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "engines-x", "namespace": "agents", "labels": labels},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": eps,
    }


async def test_engines_come_and_go_with_the_services_endpointslices(kmock: Any, tmp_path: Path) -> None:
    k = await StandIn("engine-0", tokens=1).start()
    res = kmock.resource("discovery.k8s.io/v1", "endpointslices")
    kmock.resources["discovery.k8s.io/v1/endpointslices"] = {}
    kmock.objects[res, "agents", "engines-x"] = endpoint_slice([k])
    kube = {
        "namespace": "agents",
        "service": "engines",
        "interval": 0.05,
        "kubeconfig": str(kubeconfig(tmp_path / "kubeconfig", str(kmock.url))),
    }
    r = await start_router(
        router_config([], discovery={"kubernetes": kube}), report_auth=ReportAuth.token(TOKEN)
    )
    r.service.discovery.tick_s = 0.05
    try:
        await wait_until(lambda: "engine-0" in r.service.nodes, 10, "engine-0 discovered")
        entry = r.service.nodes.get("engine-0")
        assert entry.url == k.url and entry.source == "kubernetes"
        async with aiohttp.ClientSession() as http:
            async with http.post(r.url + CHAT, json=chat_body()) as resp:
                assert resp.status == 503  # its role is not known before it reports
            assert not k.received
            assert await post_report(http, r.url, {"node_id": "engine-0", "role": "both"}) == 200
            async with http.post(r.url + CHAT, json=chat_body()) as resp:
                assert resp.status == 200, await resp.text()
            assert len(k.completed) == 1
            del kmock.objects[res, "agents", "engines-x"]
            await wait_until(lambda: "engine-0" not in r.service.nodes, 10, "engine-0 removed")
            async with http.post(r.url + CHAT, json=chat_body()) as resp:
                assert resp.status == 503
        assert len(k.received) == 1
    finally:
        await r.stop()
        await k.kill()


async def test_an_engine_removed_while_it_serves_a_request_finishes_it() -> None:
    b = await StandIn("b", tokens=3, prefill_s=0.3).start()
    r = await start_router(router_config([]), report_auth=ReportAuth.token(TOKEN))
    try:
        async with aiohttp.ClientSession() as http:
            assert await post_report(http, r.url, {"node_id": "b", "role": "both", "url": b.url}) == 200
            pending = asyncio.ensure_future(http.post(r.url + CHAT, json=chat_body(max_tokens=3)))
            await wait_until(lambda: bool(b.received), 5, "b got the request")
            async with http.delete(r.url + "/agentpool/v1/engines/b", headers=AUTH) as resp:
                assert resp.status == 200  # gone from the table while its prefill runs
            async with await pending as resp:
                body = await resp.json()
            assert resp.status == 200, body
            assert body["choices"][0]["message"]["content"] == "tok0 tok1 tok2 "
            assert "b" not in r.service.nodes
    finally:
        await r.stop()
        await b.kill()
