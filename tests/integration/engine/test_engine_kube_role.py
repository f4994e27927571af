"""The desired role and the drain from the pod's annotations through a real Kubernetes watch (against
KMock); the engine only reads the API (the role it serves goes to the routers in its reports)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
from process_helpers import kubeconfig

from agentpool.engine.roles import DRAIN_ANNOTATION, ROLE_ANNOTATION, KubeRoleWatch
from agentpool.node import Role

pytestmark = pytest.mark.integration
NS = "agents"


def pod(name: str, role: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, "annotations": {ROLE_ANNOTATION: role}}
    meta |= {"uid": f"uid-{name}", "resourceVersion": "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": []}}


async def test_the_pod_annotation_reaches_the_engine_within_a_second(tmp_path: Path, kmock: Any) -> None:
    pods = kmock.resource("v1", "pods")
    kmock.objects[pods, NS, "engine-0"] = pod("engine-0", "both")
    kmock.objects[pods, NS, "engine-1"] = pod("engine-1", "decode")  # another pod: not ours
    seen: list[tuple[float, Role | None]] = []
    drains: list[int] = []
    watch = KubeRoleWatch(
        NS,
        "engine-0",
        lambda r, _src: seen.append((time.monotonic(), r)),
        kubeconfig(tmp_path / "kc", str(kmock.url)),
        read_timeout_s=1.0,
        on_drain=lambda: drains.append(1),
    )
    task = asyncio.create_task(watch.run())
    try:
        deadline = time.monotonic() + 10
        while not seen:
            assert time.monotonic() < deadline, "no role from the watch"
            await asyncio.sleep(0.02)
        assert seen[0][1] is Role.BOTH and all(r is Role.BOTH for _, r in seen)
        assert not drains
        # the planner's merge patch, through the API
        api = k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=str(kmock.url).rstrip("/"))))
        body = {"metadata": {"annotations": {ROLE_ANNOTATION: "prefill"}}}
        changed = time.monotonic()
        await asyncio.to_thread(api.patch_namespaced_pod, "engine-0", NS, body)
        deadline = time.monotonic() + 5
        while not any(r is Role.PREFILL for _, r in seen):
            assert time.monotonic() < deadline, f"the change never arrived: {seen}"
            await asyncio.sleep(0.01)
        at = next(t for t, r in seen if r is Role.PREFILL)
        assert at - changed < 1.0
        # the operator's drain for removal
        body = {"metadata": {"annotations": {DRAIN_ANNOTATION: "true"}}}
        await asyncio.to_thread(api.patch_namespaced_pod, "engine-0", NS, body)
        deadline = time.monotonic() + 5
        while not drains:
            assert time.monotonic() < deadline, "the drain annotation never arrived"
            await asyncio.sleep(0.01)
        assert watch.errors == 0
        # the engine's requests were reads only: the two writes are the test's own patches
        writes = [(r.method, r.url.path) for r in kmock if r.method != "GET"]
        assert writes == [("PATCH", f"/api/v1/namespaces/{NS}/pods/engine-0")] * 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
