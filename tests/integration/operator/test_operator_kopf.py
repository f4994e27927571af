"""The real kopf operator against a Kubernetes API (KMock here; a real server with
AGENTPOOL_TEST_KUBECONFIG): the scenarios of a pool's life."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import OPERATOR_ARGS, Cluster, OperatorThread, load_example
from process_helpers import engine_token_file, start_router

from agentpool.operator.names import COMPONENT_LABEL, ENGINE_SETTINGS_ANNOTATION, POOL_LABEL, ROUTER

T = TypeVar("T")
CHILDREN = [
    ("ServiceAccount", "sim-engine"),
    ("Role", "sim-engine"),
    ("RoleBinding", "sim-engine"),
    ("ServiceAccount", "sim-directory"),
    ("ServiceAccount", "sim-redis"),
    ("ServiceAccount", "sim-planner"),
    ("Role", "sim-planner"),
    ("RoleBinding", "sim-planner"),
    ("ConfigMap", "sim-config"),
    ("ConfigMap", "sim-engines"),
    ("NetworkPolicy", "sim-engine"),
    ("NetworkPolicy", "sim-directory"),
    ("NetworkPolicy", "sim-redis"),
    ("Service", "sim-redis"),
    ("StatefulSet", "sim-redis"),
    ("Service", "sim-directory"),
    ("Deployment", "sim-directory"),
    ("Service", "sim-router"),
    ("Deployment", "sim-router"),
    ("Service", "sim-engine"),
    ("StatefulSet", "sim-engine"),
    ("Secret", "sim-auth"),
    ("Secret", "sim-redis"),
]


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = 60.0) -> T:
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def pool_manifest(cluster: Cluster) -> dict[str, Any]:
    manifest = copy.deepcopy(load_example("pool-sim.yaml"))
    manifest["metadata"]["namespace"] = cluster.namespace
    return manifest


async def create_pool(cluster: Cluster, manifest: dict[str, Any]) -> None:
    await cluster.api.create(manifest)


async def pool(cluster: Cluster, name: str = "sim") -> dict[str, Any]:
    got = await cluster.api.get("AgentServingPool", cluster.namespace, name)
    assert got is not None
    return got


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


async def status_where(
    cluster: Cluster, check: Callable[[dict[str, Any]], bool], what: str, name: str = "sim"
) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        obj = await pool(cluster, name)
        return obj if check(obj) else None

    return await eventually(probe, what)


async def versions(cluster: Cluster) -> dict[tuple[str, str], str]:
    out = {}
    for kind, name in CHILDREN:
        obj = await cluster.api.get(kind, cluster.namespace, name)
        if obj is not None:
            out[(kind, name)] = obj["metadata"]["resourceVersion"]
    return out


async def all_engines_serve(cluster: Cluster, n: int = 6) -> None:
    async def pods_have_roles() -> bool:
        for i in range(n):
            pod = await cluster.api.get("Pod", cluster.namespace, f"sim-engine-{i}")
            if pod is None or "agentpool.io/role" not in (pod["metadata"].get("annotations") or {}):
                return False
        return True

    await eventually(pods_have_roles, "initial roles on every engine pod")
    for i in range(n):
        await cluster.engines.serve(f"sim-engine-{i}")


async def children_exist(cluster: Cluster) -> None:
    async def probe() -> bool:
        return len(await versions(cluster)) == len(CHILDREN)

    await eventually(probe, "every child")


async def ready_pool(cluster: Cluster) -> dict[str, Any]:
    """A pool whose engines all serve their initial roles, and its Ready status."""
    await create_pool(cluster, pool_manifest(cluster))
    await children_exist(cluster)
    await all_engines_serve(cluster)
    return await status_where(
        cluster, lambda o: (condition(o, "Ready") or {}).get("status") == "True", "Ready"
    )


async def edit_spec(cluster: Cluster, spec: dict[str, Any], name: str = "sim") -> int:
    await cluster.api.merge_patch("AgentServingPool", cluster.namespace, name, {"spec": spec})
    return int((await pool(cluster, name))["metadata"]["generation"])


async def annotations(cluster: Cluster, pod: str) -> dict[str, str]:
    got = await cluster.api.get("Pod", cluster.namespace, pod)
    assert got is not None
    return dict(got["metadata"].get("annotations") or {})


async def planner_reports(
    cluster: Cluster, switches: dict[str, Any] | None = None, loaded: dict[str, Any] | None = None
) -> None:
    """Write what the planner writes to its ConfigMap: its state (with the switch count) and the
    settings generations it and the routers run."""
    data: dict[str, str] = {}
    if switches is not None:
        shape = {"experts_active": 0, "experts_total": 0, "t_fwd": 1.0}
        data["state.json"] = json.dumps(
            {"shape": shape, "fitted_at": 0.0, "models": {}, "switches": switches}
        )
    if loaded is not None:
        data["loaded.json"] = json.dumps(loaded)
    name = "sim-planner-state"
    if await cluster.api.get("ConfigMap", cluster.namespace, name) is None:
        meta = {"name": name, "namespace": cluster.namespace}
        await cluster.api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    else:
        await cluster.api.merge_patch("ConfigMap", cluster.namespace, name, {"data": data})


async def test_create_applies_children_and_reports_progressing(cluster: Cluster, operator: Any) -> None:
    await create_pool(cluster, pool_manifest(cluster))
    await children_exist(cluster)
    obj = await status_where(cluster, lambda o: condition(o, "Progressing") is not None, "a status")
    progressing = condition(obj, "Progressing")
    assert progressing is not None and progressing["status"] == "True"
    assert progressing["reason"] in ("Reconciling", "NodesStarting")
    ready = condition(obj, "Ready")
    assert ready is not None and ready["status"] == "False"
    sts = await cluster.api.get("StatefulSet", cluster.namespace, "sim-engine")
    assert sts is not None and sts["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]

    async def created_event() -> list[dict[str, Any]]:
        events = await cluster.api.list_events(cluster.namespace, "sim")
        return [e for e in events if e.get("reason") == "Created" and e.get("type") == "Normal"]

    (event,) = await eventually(created_event, "a Normal Event about the creations")
    assert "StatefulSet/sim-engine" in event["message"]


async def test_ready_with_the_split_then_an_slo_edit_changes_only_the_config_map(
    cluster: Cluster, operator: Any
) -> None:
    obj = await ready_pool(cluster)
    status = obj["status"]
    assert status["split"]["label"] == "3P3D" and status["desiredSplit"]["label"] == "3P3D"
    assert status["readyNodes"] == 6 and status["observedGeneration"] == 1 and status["configGeneration"] == 1
    assert [n["desiredRole"] for n in status["nodes"]] == ["prefill"] * 3 + ["decode"] * 3
    assert all(n["ready"] and n["observedRole"] == n["desiredRole"] for n in status["nodes"])
    assert condition(obj, "Degraded")["status"] == "False"  # type: ignore[index]
    assert status["modelFit"]["state"] == "Learning"  # no planner state yet
    before = await versions(cluster)
    pods_before = [await annotations(cluster, f"sim-engine-{i}") for i in range(6)]

    # the planner reports which settings generation it and each router run (its own ConfigMap)
    await planner_reports(cluster, loaded={"planner": 1, "routers": {"r0": 1, "r1": 1}})
    obj = await status_where(
        cluster,
        lambda o: (o["status"].get("config") or {}).get("router") is not None,
        "the routers' generation",
    )
    assert obj["status"]["config"] == {
        "desiredGeneration": 1,
        "router": {"loadedGeneration": 1, "newestGeneration": 1, "replicas": 2},
        "planner": {"loadedGeneration": 1, "newestGeneration": 1, "replicas": 1},
    }

    generation = await edit_spec(cluster, {"slo": {"ttft": {"base": "3s"}, "tpot": "40ms"}})
    assert generation == 2
    obj = await status_where(
        cluster,
        lambda o: o["status"].get("observedGeneration") == 2 and o["status"].get("configGeneration") == 2,
        "generation 2 applied",
    )
    # until the router and planner say they run it, the status says they lag
    obj = await status_where(
        cluster, lambda o: (condition(o, "Progressing") or {}).get("reason") == "ConfigLoading", "the lag"
    )
    message = condition(obj, "Progressing")["message"]  # type: ignore[index]
    assert message == "router runs generation 1, planner runs generation 1; the ConfigMap holds 2"
    await planner_reports(cluster, loaded={"planner": 2, "routers": {"r0": 2, "r1": 1}})
    obj = await status_where(
        cluster, lambda o: o["status"]["config"]["planner"]["loadedGeneration"] == 2, "the planner caught up"
    )
    assert condition(obj, "Progressing")["message"].startswith("router runs generation 1;")  # type: ignore[index]
    await planner_reports(cluster, loaded={"planner": 2, "routers": {"r0": 2, "r1": 2}})
    obj = await status_where(
        cluster, lambda o: (condition(o, "Progressing") or {}).get("reason") != "ConfigLoading", "caught up"
    )
    assert obj["status"]["config"]["router"] == {"loadedGeneration": 2, "newestGeneration": 2, "replicas": 2}
    after = await versions(cluster)
    assert [k for k in before if before[k] != after[k]] == [("ConfigMap", "sim-config")]
    config = await cluster.api.get("ConfigMap", cluster.namespace, "sim-config")
    assert config is not None and '"ttftBase":3.0' in config["data"]["router.json"]
    assert '"tpot":0.04' in config["data"]["router.json"]  # the TPOT objective reaches the router too
    assert [await annotations(cluster, f"sim-engine-{i}") for i in range(6)] == pods_before


async def engine_settings_digest(cluster: Cluster) -> str | None:
    sts = await cluster.api.get("StatefulSet", cluster.namespace, "sim-engine")
    if sts is None:
        return None
    notes = sts["spec"]["template"]["metadata"].get("annotations") or {}
    return notes.get(ENGINE_SETTINGS_ANNOTATION)


async def _digest_other_than(cluster: Cluster, digest: str) -> str | None:
    now = await engine_settings_digest(cluster)
    return now if now is not None and now != digest else None


async def test_two_planner_switches_within_one_refresh_count_as_two_and_are_never_reverted(
    cluster: Cluster, operator: Any
) -> None:
    await ready_pool(cluster)
    # the planner switched twice (3P3D -> 4P2D -> 2P4D) between two of the operator's refreshes:
    # it patched only the role annotation, and saved its count with its state
    await cluster.api.merge_patch(
        "Pod",
        cluster.namespace,
        "sim-engine-0",
        {"metadata": {"annotations": {"agentpool.io/role": "decode"}}},
    )
    await planner_reports(
        cluster,
        switches={
            "total": 2,
            "last_at": 1_800_000_000.0,
            "last_from": "4P2D",
            "last_to": "2P4D",
            "last_reason": "decode is the bottleneck (gain 1.8 req/s)",
        },
    )
    obj = await status_where(cluster, lambda o: o["status"]["switches"]["total"] == 2, "two switches")
    assert obj["status"]["desiredSplit"]["label"] == "2P4D"
    progressing = condition(obj, "Progressing")
    assert progressing is not None and progressing["reason"] == "Switching"
    switches = obj["status"]["switches"]
    assert (switches["lastFrom"], switches["lastTo"]) == ("4P2D", "2P4D")
    assert switches["lastTime"].startswith("2027-01-15T08:00:00")
    assert "decode is the bottleneck" in switches["lastReason"]
    await cluster.engines.serve("sim-engine-0")  # the engine switched
    obj = await status_where(cluster, lambda o: o["status"]["split"]["label"] == "2P4D", "the served split")
    # a reconcile (a spec edit) leaves the planner's role alone
    await edit_spec(cluster, {"router": {"policy": "smetric"}})
    await status_where(cluster, lambda o: o["status"].get("observedGeneration") == 2, "generation 2")
    assert (await annotations(cluster, "sim-engine-0"))["agentpool.io/role"] == "decode"
    assert (await pool(cluster))["status"]["switches"]["total"] == 2
    events = await cluster.api.list_events(cluster.namespace, "sim")
    switched = [e for e in events if e.get("reason") == "PhaseSplitSwitched"]
    assert len(switched) == 1 and "the last of 2 switches" in switched[0]["message"]

    # a replaced pod (a rolling update of the engines, a pod deleted by hand) comes back without
    # annotations; it gets the role the planner had given it, not its initial one (prefill)
    gone = await cluster.api.get("Pod", cluster.namespace, "sim-engine-0")
    assert gone is not None
    await cluster.api.delete("Pod", cluster.namespace, "sim-engine-0")

    async def new_pods_role() -> str | None:
        pod = await cluster.api.get("Pod", cluster.namespace, "sim-engine-0")
        if pod is None or pod["metadata"]["uid"] == gone["metadata"]["uid"]:
            return None
        return (pod["metadata"].get("annotations") or {}).get("agentpool.io/role")

    assert await eventually(new_pods_role, "the new pod's role") == "decode"
    obj = await status_where(cluster, lambda o: o["status"]["desiredSplit"]["label"] == "2P4D", "2P4D kept")


async def test_an_unchanged_pool_is_not_written_again(cluster: Cluster) -> None:
    async with OperatorThread(OPERATOR_ARGS):
        obj = await ready_pool(cluster)
        await status_where(
            cluster, lambda o: condition(o, "Progressing")["status"] == "False" or True, "settled"
        )  # type: ignore[index]
        await asyncio.sleep(1.0)
        before = await versions(cluster)
        pods = [await cluster.api.get("Pod", cluster.namespace, f"sim-engine-{i}") for i in range(6)]
        status_version = (await pool(cluster))["metadata"]["resourceVersion"]
    assert obj["status"]["observedGeneration"] == 1
    # a new operator resumes the pool: it reconciles and refreshes the status, and writes nothing
    async with OperatorThread(OPERATOR_ARGS):
        await asyncio.sleep(4.0)
        after = await versions(cluster)
        pods_after = [await cluster.api.get("Pod", cluster.namespace, f"sim-engine-{i}") for i in range(6)]
    assert after == before
    assert [p["metadata"]["resourceVersion"] for p in pods_after] == [
        p["metadata"]["resourceVersion"] for p in pods
    ]
    final = await pool(cluster)
    assert final["status"]["observedGeneration"] == 1
    assert final["status"] == obj["status"] or final["metadata"]["resourceVersion"] == status_version


async def test_scale_down_drains_first_then_delete_cleans_up(cluster: Cluster, operator: Any) -> None:
    await ready_pool(cluster)
    digest = await engine_settings_digest(cluster)
    assert digest is not None
    await edit_spec(cluster, {"nodes": 4})
    obj = await status_where(
        cluster, lambda o: (condition(o, "Progressing") or {}).get("reason") == "Draining", "draining"
    )
    assert "sim-engine-4" in condition(obj, "Progressing")["message"]  # type: ignore[index]
    for leaving in ("sim-engine-4", "sim-engine-5"):
        assert "agentpool.io/drain" in await annotations(cluster, leaving)
    assert "agentpool.io/drain" not in await annotations(cluster, "sim-engine-3")
    config = await cluster.api.get("ConfigMap", cluster.namespace, "sim-config")
    assert config is not None and "sim-engine-4" not in config["data"]["router.json"]  # no new work
    sts = await cluster.api.get("StatefulSet", cluster.namespace, "sim-engine")
    assert sts is not None and sts["spec"]["replicas"] == 6  # not before they drained
    for leaving in ("sim-engine-4", "sim-engine-5"):
        await cluster.engines.serve(leaving, ready=False)  # the engine finished its work

    async def shrunk() -> bool:
        got = await cluster.api.get("StatefulSet", cluster.namespace, "sim-engine")
        return got is not None and got["spec"]["replicas"] == 4

    await eventually(shrunk, "the StatefulSet at 4 replicas")
    obj = await status_where(
        cluster,
        lambda o: (
            (condition(o, "Ready") or {}).get("status") == "True"
            and o["status"].get("observedGeneration") == 2
        ),
        "Ready at 4 nodes",
    )
    assert obj["status"]["readyNodes"] == 4 and obj["status"]["split"]["label"] == "3P1D"
    assert await engine_settings_digest(cluster) == digest  # a scale does not roll the engines

    # the engines read their settings at start: an edit of one (the model's context length) reaches
    # the API as a new engine pod template, which the StatefulSet controller rolls out pod by pod
    await edit_spec(cluster, {"model": {**pool_manifest(cluster)["spec"]["model"], "contextLength": 32768}})
    await eventually(lambda: _digest_other_than(cluster, digest), "a new engine pod template")

    async def engines_read_it() -> bool:
        engines = await cluster.api.get("ConfigMap", cluster.namespace, "sim-engines")
        files = [engines["data"].get(f"sim-engine-{i}.json", "") for i in range(4)] if engines else []
        return bool(files) and all('"contextLength": 32768' in f for f in files)

    await eventually(engines_read_it, "the engines' settings with the context length")

    await cluster.api.delete("AgentServingPool", cluster.namespace, "sim")

    async def gone() -> bool:
        return (
            not await versions(cluster)
            and await cluster.api.get("AgentServingPool", cluster.namespace, "sim") is None
        )

    await eventually(gone, "the pool and every child gone")


async def test_a_deeper_invalid_spec_is_degraded_without_retries(cluster: Cluster, operator: Any) -> None:
    manifest = pool_manifest(cluster)
    manifest["spec"]["engine"]["hostKvSize"] = "8Gi"  # more than its 4Gi memory limit
    await create_pool(cluster, manifest)
    obj = await status_where(
        cluster, lambda o: (condition(o, "Degraded") or {}).get("status") == "True", "Degraded"
    )
    degraded = condition(obj, "Degraded")
    assert degraded is not None and degraded["reason"] == "InvalidSpec"
    assert "smaller than spec.engine.hostKvSize (8Gi)" in degraded["message"]
    assert condition(obj, "Ready")["status"] == "False"  # type: ignore[index]
    # kopf records the handled spec after the handler's status write; wait for that last write
    obj = await status_where(
        cluster,
        lambda o: "agentpool.io/last-handled-configuration" in (o["metadata"].get("annotations") or {}),
        "kopf's record of the handled spec",
    )
    version = obj["metadata"]["resourceVersion"]
    await asyncio.sleep(2.0)
    assert (await pool(cluster))["metadata"]["resourceVersion"] == version  # no retry loop
    assert await versions(cluster) == {}
    # fixing the spec recovers
    await edit_spec(cluster, {"engine": {**manifest["spec"]["engine"], "hostKvSize": "2Gi"}})
    await children_exist(cluster)
    await status_where(
        cluster, lambda o: (condition(o, "Degraded") or {}).get("status") == "False", "healthy"
    )


async def test_the_sglang_example_reconciles_without_error(cluster: Cluster, operator: Any) -> None:
    manifest = copy.deepcopy(load_example("pool-sglang.yaml"))
    manifest["metadata"]["namespace"] = cluster.namespace
    await create_pool(cluster, manifest)

    async def engines() -> dict[str, Any] | None:
        return await cluster.api.get("StatefulSet", cluster.namespace, "qwen3-coder-engine")

    sts = await eventually(engines, "the GPU engines' StatefulSet")
    engine = sts["spec"]["template"]["spec"]["containers"][0]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert sts["spec"]["replicas"] == 9
    obj = await status_where(
        cluster, lambda o: condition(o, "Degraded") is not None, "a status", name="qwen3-coder"
    )
    assert condition(obj, "Degraded")["status"] == "False"  # type: ignore[index]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["podSelector"]["matchLabels"].items())


def generation_is(n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda o: (o.get("status") or {}).get("observedGeneration") == n


async def test_network_policies_follow_the_pool_and_an_opt_out_deletes_them(
    cluster: Cluster, operator: Any
) -> None:
    await create_pool(cluster, pool_manifest(cluster))
    await children_exist(cluster)
    ns = cluster.namespace
    engine = await cluster.api.get("NetworkPolicy", ns, "sim-engine")
    assert engine is not None
    uid = (await pool(cluster))["metadata"]["uid"]
    assert engine["metadata"]["ownerReferences"][0]["uid"] == uid

    async def engine_pod() -> dict[str, Any] | None:
        return await cluster.api.get("Pod", ns, "sim-engine-0")

    pod = await eventually(engine_pod, "an engine pod")  # made from the StatefulSet's template
    assert selects(engine["spec"], pod["metadata"]["labels"])
    (from_engines, *_) = engine["spec"]["ingress"]
    assert "ports" not in from_engines and selects(from_engines["from"][0], pod["metadata"]["labels"])

    # narrowing who may scrape rewrites both policies
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    await edit_spec(cluster, {"network": {"metricsFrom": monitoring}})

    async def narrowed() -> bool:
        for name in ("sim-engine", "sim-directory"):
            got = await cluster.api.get("NetworkPolicy", ns, name)
            if got is None or got["spec"]["ingress"][-1].get("from") != monitoring:
                return False
        return True

    await eventually(narrowed, "metricsFrom in both policies")

    # and widening again removes the narrowed rule (the compare-then-apply sees it by the applied digest)
    await edit_spec(cluster, {"network": {"metricsFrom": None}})

    async def widened() -> bool:
        for name in ("sim-engine", "sim-directory"):
            got = await cluster.api.get("NetworkPolicy", ns, name)
            if got is None or "from" in got["spec"]["ingress"][-1]:
                return False
        return True

    await eventually(widened, "metrics open to every source again")

    # opting out deletes them; everything else stays
    await edit_spec(cluster, {"network": {"policy": False}})

    async def policies_gone() -> bool:
        names = ("sim-engine", "sim-directory", "sim-redis")
        return [await cluster.api.get("NetworkPolicy", ns, n) for n in names] == [None] * 3

    await eventually(policies_gone, "the policies deleted")
    await status_where(cluster, generation_is(4), "generation 4")
    assert await cluster.api.get("StatefulSet", ns, "sim-engine") is not None

    async def deleted_event() -> list[dict[str, Any]]:
        events = await cluster.api.list_events(ns, "sim")
        return [e for e in events if e.get("reason") == "Deleted"]

    (event,) = await eventually(deleted_event, "an Event about the deletions")
    assert "NetworkPolicy/sim-engine" in event["message"]

    # a policy of that name someone else made is never deleted, not even with the pool
    mine = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "sim-directory", "namespace": ns},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}  # fmt: skip
    await cluster.api.create(mine)
    await edit_spec(cluster, {"router": {"policy": "smetric"}})
    await status_where(cluster, generation_is(5), "generation 5")
    assert await cluster.api.get("NetworkPolicy", ns, "sim-directory") is not None
    await cluster.api.delete("AgentServingPool", ns, "sim")

    async def pool_gone() -> bool:
        return await cluster.api.get("AgentServingPool", ns, "sim") is None

    await eventually(pool_gone, "the pool deleted")
    assert await cluster.api.get("NetworkPolicy", ns, "sim-directory") is not None


async def test_opting_in_again_recreates_the_policies(cluster: Cluster, operator: Any) -> None:
    manifest = pool_manifest(cluster)
    manifest["spec"]["network"] = {"policy": False}
    await create_pool(cluster, manifest)
    await status_where(cluster, generation_is(1), "generation 1")
    assert await cluster.api.get("NetworkPolicy", cluster.namespace, "sim-engine") is None
    await edit_spec(cluster, {"network": {"policy": True}})
    await children_exist(cluster)
    await cluster.api.delete("AgentServingPool", cluster.namespace, "sim")

    async def gone() -> bool:
        return not await versions(cluster)

    await eventually(gone, "the pool's children, its policies included, gone")


async def test_a_transient_api_error_is_retried_with_a_back_off(cluster: Cluster, operator: Any) -> None:
    if cluster.emulator is None:
        pytest.skip("needs KMock to fail requests on purpose")
    failed: list[float] = []

    def engine_statefulset_creates(request: Any) -> bool:
        hit = request.method == "POST" and str(request.url.path).endswith("/statefulsets")
        hit = hit and (request.data or {}).get("metadata", {}).get("name") == "sim-engine" and len(failed) < 2
        if hit:
            failed.append(time.monotonic())
        return hit

    # 503 to the engine StatefulSet's creation (the client retries once itself; then the operator)
    cluster.emulator[engine_statefulset_creates] << 503
    await create_pool(cluster, pool_manifest(cluster))
    await children_exist(cluster)
    obj = await status_where(
        cluster, lambda o: o["status"].get("observedGeneration") == 1, "generation 1 applied"
    )
    assert failed, "the failure was never injected"
    assert condition(obj, "Degraded")["status"] == "False"  # type: ignore[index]
    events = await cluster.api.list_events(cluster.namespace, "sim")
    assert any(e.get("reason") == "ReconcileFailed" and "503" in e.get("message", "") for e in events)


async def router_pod(cluster: Cluster, url: str) -> None:
    """A running router pod of pool `sim` whose IP and `http` port reach the router at `url`
    (`http://` or `https://`; no controller runs pods here: the test plays the Deployment's)."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    meta = {
        "name": "sim-router-0",
        "namespace": cluster.namespace,
        "labels": {POOL_LABEL: "sim", COMPONENT_LABEL: ROUTER},
    }
    container = {"name": "router", "image": "router", "ports": [{"name": "http", "containerPort": int(port)}]}
    await cluster.api.create(
        {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [container]}}
    )
    status = {"phase": "Running", "podIP": host}
    await cluster.api.merge_patch("Pod", cluster.namespace, "sim-router-0", {"status": status}, "status")


async def test_a_colocated_pool_shows_the_generation_its_routers_run(
    cluster: Cluster, operator: Any, tmp_path: Path
) -> None:
    """No planner runs in a colocated pool: the operator asks each router replica (`GET /ready`)."""
    manifest = pool_manifest(cluster)
    del manifest["spec"]["initialSplit"]
    manifest["spec"].update(mode="colocated", planner={"enabled": False}, router={"policy": "lmetric"})
    await create_pool(cluster, manifest)
    config = tmp_path / "router.json"
    nodes = [{"id": "sim-engine-0", "url": "http://127.0.0.1:9", "role": "both"}]
    config.write_text(json.dumps({"model": "m", "policy": "lmetric", "nodes": nodes, "generation": 1}))
    router, url = await start_router(
        config, "--insecure-allow-unauthenticated-reports", "--engine-token-file", str(engine_token_file())
    )
    try:
        await router_pod(cluster, url)
        obj = await status_where(
            cluster,
            lambda o: (
                (((o.get("status") or {}).get("config") or {}).get("router") or {}).get("replicas") == 1
            ),
            "the router replica's generation",
        )
        # the replica runs the ConfigMap's generation; no planner part is shown
        assert obj["status"]["config"] == {
            "desiredGeneration": 1,
            "router": {"loadedGeneration": 1, "newestGeneration": 1, "replicas": 1},
        }
    finally:
        await router.stop()
    # a replica that stops answering runs an unknown generation, and the status says so
    await all_engines_serve(cluster)
    obj = await status_where(
        cluster, lambda o: (condition(o, "Progressing") or {}).get("reason") == "ConfigLoading", "the lag"
    )
    assert obj["status"]["config"]["router"] == {"replicas": 1}
    assert condition(obj, "Progressing")["message"] == "router runs generation unknown; the ConfigMap holds 1"  # type: ignore[index]
