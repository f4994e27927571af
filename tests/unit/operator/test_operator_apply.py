"""Compare-then-apply (`agentpool.operator.apply.apply_child`) against a recording API at the
operator's own seam: which write each reconcile makes. What the API server then does with a
server-side apply (removing the fields the operator's manager no longer sets) is Kubernetes'."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

from agentpool.operator.apply import APPLIED_ANNOTATION, Outcome, apply_child, with_applied_digest
from agentpool.operator.kube import KubeApi


class RecordingApi:
    """Holds one object per name; `apply` replaces it as a server-side apply by a sole manager would
    (fields the server added, here `status`, are kept)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: list[str] = []

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(name))

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.writes.append("create")
        self.objects[obj["metadata"]["name"]] = {**copy.deepcopy(obj), "status": {"replicas": 1}}
        return obj

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.writes.append("apply")
        status = self.objects[obj["metadata"]["name"]].get("status")
        self.objects[obj["metadata"]["name"]] = {**copy.deepcopy(obj), "status": status}
        return obj


def deployment(node_selector: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "pool-router", "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {"replicas": 2, "template": {"spec": {"nodeSelector": node_selector}}},
    }


async def reconcile(api: RecordingApi, desired: dict[str, Any]) -> Outcome:
    return await apply_child(cast(KubeApi, api), desired)


@pytest.mark.parametrize(
    ("first", "second", "outcome"),
    [
        (deployment({"gpu": "h200"}), deployment({"gpu": "h200"}), Outcome.UNCHANGED),
        (deployment({"gpu": "h200"}), deployment({"gpu": "gb300"}), Outcome.UPDATED),
        (deployment({"gpu": "h200"}), deployment({"gpu": "h200", "zone": "a"}), Outcome.UPDATED),
        # a key dropped from a map: the existing object still contains every desired value
        (deployment({"gpu": "h200", "zone": "a"}), deployment({"gpu": "h200"}), Outcome.UPDATED),
        (deployment({}, {"team": "a"}), deployment({}), Outcome.UPDATED),
        (deployment({}, {"team": "a"}), deployment({}, {"team": "a"}), Outcome.UNCHANGED),
    ],
)
async def test_a_second_reconcile_writes_only_what_changed(
    first: dict[str, Any], second: dict[str, Any], outcome: Outcome
) -> None:
    api = RecordingApi()
    assert await reconcile(api, first) is Outcome.CREATED
    assert await reconcile(api, second) is outcome
    assert api.writes == ["create"] + (["apply"] if outcome is Outcome.UPDATED else [])
    held = api.objects["pool-router"]
    assert held["spec"] == second["spec"] and held["status"] == {"replicas": 1}


async def test_a_child_edited_by_someone_else_is_applied_again() -> None:
    api = RecordingApi()
    await reconcile(api, deployment({"gpu": "h200"}))
    api.objects["pool-router"]["spec"]["replicas"] = 5
    assert await reconcile(api, deployment({"gpu": "h200"})) is Outcome.UPDATED
    assert api.objects["pool-router"]["spec"]["replicas"] == 2


async def test_a_child_from_before_the_digest_is_applied_once() -> None:
    api = RecordingApi()
    api.objects["pool-router"] = {**deployment({"gpu": "h200"}), "status": {"replicas": 1}}
    assert await reconcile(api, deployment({"gpu": "h200"})) is Outcome.UPDATED
    assert await reconcile(api, deployment({"gpu": "h200"})) is Outcome.UNCHANGED


def test_the_digest_ignores_key_order_and_its_own_old_value() -> None:
    a = deployment({"gpu": "h200", "zone": "a"}, {"x": "1", "y": "2"})
    b = deployment({"zone": "a", "gpu": "h200"}, {"y": "2", "x": "1", APPLIED_ANNOTATION: "stale"})
    assert with_applied_digest(a) == with_applied_digest(b)
    assert "annotations" not in deployment({})["metadata"]  # the input is not changed
    marked = with_applied_digest(deployment({}))
    assert set(marked["metadata"]["annotations"]) == {APPLIED_ANNOTATION}
