"""The planner tells the KV directory when an engine serves its new phase (Algorithm E.2 lines
14-15: a D->P switch resets the node's branch counts, P->D keeps them), and the cooldown starts when
the switch completed. Real directory (gRPC on loopback, state in the real Redis) and KMock's
Kubernetes API."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from kubernetes import client as k8s
from process_helpers import delete_namespace
from prometheus_client import CollectorRegistry

from agentpool.directory.client import DirectoryClient
from agentpool.directory.server import DirectoryConfig, DirectoryServer
from agentpool.kv import Role
from agentpool.kv.hashing import block_hashes
from agentpool.models import (
    DecodeModel,
    MoeShape,
    NodeModel,
    OccupancySample,
    PrefillModel,
    RequestWorkRecord,
    Work,
)
from agentpool.models.synthetic import decode_records, prefill_records
from agentpool.planner.config import PlannerConfig
from agentpool.planner.controller import PlannerController
from agentpool.planner.core import Outcome
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.kube import PodRoles
from agentpool.planner.metrics import PlannerMetrics
from agentpool.planner.roles import ObjectRef, ServedRoles

pytestmark = pytest.mark.integration

NS = "agents"
POOL = ObjectRef("agentpool.io/v1alpha1", "AgentServingPool", "demo", NS, "pool-uid")
NODE = NodeModel(
    prefill=PrefillModel(c0=0.015, c1=4e-5, c2=2e-10, c3=1e-6),
    decode=DecodeModel(d0=0.012, d1=0.018, d2=2.5e-4, experts_active=8, experts_total=256),
)
SHAPE = MoeShape(experts_active=8, experts_total=256)
OSWORLD = (Work(t_uc=12000, t_c=80000, t_out=300), 60.0)  # prefill-heavy: more prefill nodes
PODS = ["engine-0", "engine-1", "engine-2", "engine-3"]
CHAIN = block_hashes(list(range(8)), 4)
TOKEN = "planner-directory-token"


def pod_body(name: str, role: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"agentpool.io/pool": "demo"},
            "annotations": {"agentpool.io/role": role},
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "generation": 1,
        },
        "spec": {"containers": [{"name": "engine", "image": "engine:dev"}]},
    }


@pytest.fixture()
async def directory() -> AsyncIterator[DirectoryClient]:
    namespace = f"agentpool-test:{uuid.uuid4().hex}"
    config = DirectoryConfig.model_validate(
        {
            "port": 0,
            "redis_url": "redis://127.0.0.1:6379/0",
            "namespace": namespace,
            "page_size": 4,
            "auth_token": TOKEN,
        }
    )
    server = DirectoryServer(config)
    await server.start()
    try:
        async with DirectoryClient(server.address, token=TOKEN) as client:
            yield client
    finally:
        await server.stop()
        await delete_namespace(namespace)


async def counts_on(directory: DirectoryClient, node: str) -> dict[int, int]:
    stream = directory.watch_counts(node)
    try:
        first = await asyncio.wait_for(anext(stream), 5)
    finally:
        await stream.aclose()
    assert first.snapshot
    return {h: c for h, c in first.counts.items() if c}


async def test_a_switch_resets_the_counts_of_engines_moved_to_prefill_once_they_serve_it(
    kmock: Any, directory: DirectoryClient
) -> None:
    for i, name in enumerate(PODS):
        kmock.objects[kmock.resource("v1", "pods"), NS, name] = pod_body(
            name, "prefill" if i == 0 else "decode"
        )
    kmock.resources["v1/events"] = {}
    api = k8s.ApiClient(k8s.Configuration(host=str(kmock.url).rstrip("/")))
    inbox = PlannerInbox()
    served = ServedRoles()  # what the routers' work batches say each engine serves
    for i, name in enumerate(PODS):
        served.update(name, "prefill" if i == 0 else "decode", 1.0)
    controller = PlannerController(
        pods=PodRoles(api, NS, "agentpool.io/pool=demo", served),
        inbox=inbox,
        config=lambda: PlannerConfig(window_s=600, slices=10, warmup_s=60, cooldown_s=120, initial_prefill=1),
        pool=POOL,
        metrics=PlannerMetrics(CollectorRegistry()),
        shape=SHAPE,
        directory=directory,
    )
    try:
        rng = np.random.default_rng(3)
        for name in PODS:
            inbox.add_iterations(prefill_records(name, NODE, 200, 0.02, rng, start=0.0, spacing=0.5))
            inbox.add_iterations(decode_records(name, NODE, 200, 0.02, rng, start=0.0, spacing=0.5))
        controller.fit(0.0, 100.0)
        # Every decode engine holds one branch's counts in the directory.
        for name in PODS[1:]:
            assert await directory.switch_phase(name, Role.DECODE) is None  # registers it
            await directory.resolve(CHAIN, branch=f"agent-{name}")
            await directory.place(f"agent-{name}", name, CHAIN)
            assert await counts_on(directory, name) == {CHAIN[0]: 1, CHAIN[1]: 1}
        # A window of prefill-heavy work: the planner moves decode engines to prefill.
        work, q = OSWORLD
        inbox.add_requests(RequestWorkRecord(float(t), work) for t in np.arange(600, 1200, 3.0))
        inbox.add_occupancy(OccupancySample(float(t), q) for t in np.arange(600, 1200, 6.0))
        ev = await controller.evaluate_window(600.0, 1200.0)
        assert ev is not None and ev.decision.outcome is Outcome.SWITCH, ev.decision.reason
        moved = list(ev.decision.to_prefill)
        stayed = [n for n in PODS[1:] if n not in moved]
        assert moved and stayed
        # The engines still drain: the directory is not told yet, counts stay.
        assert not await controller.observe_switch(at=1210.0)
        assert list(controller.announced) == []
        assert await counts_on(directory, moved[0]) == {CHAIN[0]: 1, CHAIN[1]: 1}
        # The first moved engine serves prefill: it alone is announced, and its counts are reset.
        served.update(moved[0], "prefill", 2.0)
        assert not await controller.observe_switch(at=1220.0) or len(moved) == 1
        assert list(controller.announced)[:1] == [(moved[0], Role.PREFILL)]
        assert await counts_on(directory, moved[0]) == {}
        for name in moved[1:]:
            served.update(name, "prefill", 3.0)
        assert await controller.observe_switch(at=1250.0)
        assert sorted(n for n, _ in controller.announced) == sorted(moved)
        for name in moved:
            assert await counts_on(directory, name) == {}
        for name in stayed:  # not switched: their counts stay
            assert await counts_on(directory, name) == {CHAIN[0]: 1, CHAIN[1]: 1}
        # The cooldown counts from the completion (1250), not from the decision (1200).
        sw = controller.last_switch
        assert sw is not None and (sw.applied_at, sw.settled_at) == (1200.0, 1250.0)
        inbox.add_requests(RequestWorkRecord(float(t), work) for t in np.arange(1200, 1360, 3.0))
        inbox.add_occupancy(OccupancySample(float(t), q) for t in np.arange(1200, 1360, 6.0))
        ev = await controller.evaluate_window(1200.0, 1360.0)
        assert ev is not None and ev.decision.outcome is Outcome.COOLDOWN, ev.decision.reason
    finally:
        await asyncio.to_thread(api.close)
