"""The planner finds the pool's router replicas (pods by label, Kubernetes API of KMock), polls each
one and gives each the current fitted models; replicas that go away are dropped. Two real routers
on 127.0.0.1 and 127.0.0.2 with the same port, as two pods' IPs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kubernetes import client as k8s
from planner_link_harness import Router, router_config, start_router
from process_helpers import free_port

from agentpool.local.pool import port_free
from agentpool.models import DecodeModel, NodeModel, PrefillModel
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.kube import RouterPods
from agentpool.planner.router_models import ModelBroadcast
from agentpool.planner.router_source import RouterWorkSource

pytestmark = pytest.mark.integration

NS = "agents"
FIT = NodeModel(prefill=PrefillModel(0.01, 5e-5, 1e-10, 1e-7), decode=DecodeModel(0.01, 0.005, 1e-4))


def router_pod(name: str, ip: str | None, phase: str = "Running") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if ip is not None:
        status["podIP"] = ip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"app.kubernetes.io/component": "router"},
            "uid": f"uid-{name}",
            "resourceVersion": "1",
        },
        "spec": {"containers": [{"name": "router", "image": "router:dev"}]},
        "status": status,
    }


def port_free_on_both() -> int:
    for _ in range(50):
        port = free_port()  # outside the ephemeral range: nothing else takes it meanwhile
        if port_free("127.0.0.2", port):
            return port
    raise AssertionError("no port free on both loopback addresses")


@pytest.fixture()
async def routers() -> AsyncIterator[tuple[int, list[Router]]]:
    port = port_free_on_both()
    config = router_config([("e0", "http://127.0.0.1:9", "both")])
    started = [await start_router(config, host=h, port=port) for h in ("127.0.0.1", "127.0.0.2")]
    yield port, started
    for r in started:
        await r.stop()


async def test_router_replicas_are_found_polled_given_the_models_and_dropped_when_gone(
    kmock: Any, routers: tuple[int, list[Router]]
) -> None:
    port, (r1, r2) = routers
    pods = kmock.resource("v1", "pods")
    kmock.objects[pods, NS, "router-a"] = router_pod("router-a", "127.0.0.1")
    kmock.objects[pods, NS, "router-b"] = router_pod("router-b", "127.0.0.2")
    kmock.objects[pods, NS, "router-c"] = router_pod("router-c", None, phase="Pending")  # no IP yet
    api = k8s.ApiClient(k8s.Configuration(host=str(kmock.url).rstrip("/")))
    try:
        async with aiohttp.ClientSession() as http:
            found = RouterPods(api, NS, "app.kubernetes.io/component=router", port)
            broadcast = ModelBroadcast([], http)
            source = RouterWorkSource([], PlannerInbox(), http, models=broadcast, discover=found.urls)
            await source.poll_once()
            assert [r.url for r in source.routers] == [r1.url, r2.url]
            assert all(r.records > 0 and r.failures == 0 for r in source.routers)  # each one polled
            await broadcast.publish({"e0": FIT}, fitted_at=1.0)
            assert r1.service.nodes.fitted("e0") and r2.service.nodes.fitted("e0")
            # router-b goes away; router-c starts (on r2's address): the next poll follows
            del kmock.objects[pods, NS, "router-b"]
            await source.poll_once()
            assert [r.url for r in source.routers] == [r1.url]
            assert broadcast.urls == [r1.url]
            kmock.objects[pods, NS, "router-c"] = router_pod("router-c", "127.0.0.2")
            await source.poll_once()
            assert [r.url for r in source.routers] == [r1.url, r2.url]
    finally:
        await asyncio.to_thread(api.close)
