"""A Kubernetes API for the operator tests: KMock with the bookkeeping kopf needs, or a real server.

KMock (`kmock.KubernetesEmulator`) stores objects and serves list/watch, but gives objects no
`uid`, `resourceVersion` or `generation`, and bumps nothing on a patch; kopf needs them (its
finalizer patch, its change detection). `BookkeepingEmulator` adds them as kube-apiserver does:
a uid and `generation: 1` on create, `resourceVersion` from one counter on every write, and
`generation + 1` when a write through the main endpoint changes `spec` (never on `/status`).

No controller runs behind either server here (KMock has none; a real server for these tests is a
bare API server, as the engine images do not run on these machines), so `Controllers` plays the
StatefulSet and Deployment controllers through the API: pods for each StatefulSet replica, and
`availableReplicas` / `readyReplicas` in the workloads' status.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import uuid
from datetime import UTC, datetime
from typing import Any

import kmock
from kmock._internal import enums
from kmock._internal.k8s import KubernetesObjectConflictError

from agentpool.api import GROUP, KIND, PLURAL, VERSION
from agentpool.operator.kube import KubeApi, KubeConflict, KubeNotFound

POOL_RESOURCE = f"{GROUP}/{VERSION}/{PLURAL}"
REQUEST_LOG = 16


def _merged(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = _merged(base.get(key), value)
        return out
    return patch


def _set_data(request: Any, data: dict[str, Any]) -> None:
    """KMock's requests are frozen, and its reactions match the logged request object itself, so
    the body is replaced in place (as if the client had sent it)."""
    object.__setattr__(request, "data", data)


class BookkeepingEmulator(kmock.KubernetesEmulator):
    """KMock plus uid, resourceVersion and generation, kept as kube-apiserver keeps them."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._versions = itertools.count(1)

    async def _handle(self, request: Any) -> Any:
        # KMock matches each request against every reaction's view of its request log, scanning the
        # log for the request itself (linear per reaction and request, 14 reactions): keep only the
        # latest requests, or every API call costs tens of milliseconds. The request being handled
        # is the last one, and none of the tests' reactions looks further back.
        if len(self._requests) > 2 * REQUEST_LOG:
            del self._requests[:-REQUEST_LOG]
        data = request.data
        if request.resource is not None and isinstance(data, dict):
            if request.action == enums.action.CREATE:
                given = data.get("metadata") or {}
                if not given.get("name") and given.get("generateName"):  # as kopf names its Events
                    given = {**given, "name": f"{given['generateName']}{uuid.uuid4().hex[:5]}"}
                meta = {
                    **given,
                    "uid": str(uuid.uuid4()),
                    "resourceVersion": str(next(self._versions)),
                    "generation": 1,
                    "creationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
                body = {**data, "metadata": meta}
                if str(request.resource) == str(kmock.resource(POOL_RESOURCE)):
                    body.pop("status", None)  # the status subresource drops it on create
                _set_data(request, body)
            elif request.action == enums.action.UPDATE and request.name is not None:
                key = (request.resource, request.namespace, request.name)
                meta_patch: dict[str, Any] = {"resourceVersion": str(next(self._versions))}
                if key in self.objects and not self.objects[key].deleted:
                    current = self.objects[key].raw
                    sent = (data.get("metadata") or {}).get("resourceVersion")
                    if sent is not None and sent != current["metadata"].get("resourceVersion"):
                        raise KubernetesObjectConflictError()  # optimistic concurrency
                    spec_changed = "spec" in data and _merged(
                        current.get("spec"), data["spec"]
                    ) != current.get("spec")
                    if request.subresource is None and spec_changed:
                        meta_patch["generation"] = int(current["metadata"].get("generation") or 1) + 1
                meta = {**(data.get("metadata") or {}), **meta_patch}
                _set_data(request, {**data, "metadata": meta})
        return await super()._handle(request)


def pool_resource_info() -> kmock.ResourceInfo:
    return kmock.ResourceInfo(
        kind=KIND,
        namespaced=True,
        singular=KIND.lower(),
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        shortnames={"asp"},
        subresources={"status"},
    )


def _ready(obj: dict[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class Controllers:
    """The StatefulSet and Deployment controllers, played through the API every `period_s`."""

    def __init__(self, api: KubeApi, namespace: str, period_s: float = 0.2) -> None:
        self.api = api
        self.namespace = namespace
        self.period_s = period_s

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(KubeConflict, KubeNotFound):  # raced; the next step catches up
                await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.period_s)

    async def _all(self, kind: str) -> list[dict[str, Any]]:
        return await self.api.list_objects(kind, self.namespace, {})

    async def step(self) -> None:
        pods = {p["metadata"]["name"]: p for p in await self._all("Pod")}
        for sts in await self._all("StatefulSet"):
            name = sts["metadata"]["name"]
            replicas = int(sts["spec"].get("replicas") or 0)
            owned = {n: p for n, p in pods.items() if n.rsplit("-", 1)[0] == name}
            for i in range(replicas):
                if f"{name}-{i}" not in owned:
                    await self.api.create(self._pod(sts, i))
            for pod_name in owned:
                ordinal = pod_name.rsplit("-", 1)[-1]
                if ordinal.isdigit() and int(ordinal) >= replicas:
                    await self.api.delete("Pod", self.namespace, pod_name)
            # a managed Redis counts as ready once it runs; engines when their pods say so
            ready = (
                replicas
                if name.endswith("-redis")
                else sum(1 for n, p in owned.items() if _ready(p) and int(n.rsplit("-", 1)[-1]) < replicas)
            )
            if (sts.get("status") or {}).get("readyReplicas") != ready:
                await self.api.merge_patch(
                    "StatefulSet",
                    self.namespace,
                    name,
                    {"status": {"replicas": replicas, "readyReplicas": ready}},
                    "status",
                )
        for deployment in await self._all("Deployment"):
            replicas = int(deployment["spec"].get("replicas") or 1)
            if (deployment.get("status") or {}).get("availableReplicas") != replicas:
                await self.api.merge_patch(
                    "Deployment",
                    self.namespace,
                    deployment["metadata"]["name"],
                    {"status": {"replicas": replicas, "availableReplicas": replicas}},
                    "status",
                )

    def _pod(self, sts: dict[str, Any], ordinal: int) -> dict[str, Any]:
        template = copy.deepcopy(sts["spec"]["template"])
        meta = sts["metadata"]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                **template.get("metadata", {}),
                "name": f"{meta['name']}-{ordinal}",
                "namespace": self.namespace,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "StatefulSet",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": template["spec"],
        }


class Engines:
    """What happens to engine pods outside the operator: they become ready or finish draining
    (readiness), and the planner shows the role each serves, which it reads from the routers, as
    `agentpool.io/observed-role` (engines themselves write nothing to the API)."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api = api
        self.namespace = namespace

    async def serve(self, name: str, role: str | None = None, ready: bool = True) -> None:
        pod = await self.api.get("Pod", self.namespace, name)
        assert pod is not None, name
        desired = role or (pod["metadata"].get("annotations") or {}).get("agentpool.io/role")
        if desired is not None:
            await self.api.merge_patch(
                "Pod",
                self.namespace,
                name,
                {"metadata": {"annotations": {"agentpool.io/observed-role": desired}}},
            )
        condition = {"type": "Ready", "status": "True" if ready else "False"}
        await self.api.merge_patch(
            "Pod", self.namespace, name, {"status": {"conditions": [condition]}}, "status"
        )
