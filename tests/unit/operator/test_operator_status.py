"""The pool status from observations (pure), and the no-write comparison of children."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentpool.api import AgentServingPool, AgentServingPoolSpec
from agentpool.operator.apply import contains, merge_patch_between
from agentpool.operator.builders.config import role_for_pod
from agentpool.operator.router_readiness import RouterPod, running_router
from agentpool.operator.status import Observed, PodView, invalid_status, pool_status
from agentpool.planner.state import LoadedGenerations, PlannerState, SavedShape, SwitchRecord

ROOT = Path(__file__).resolve().parents[3]
SPEC = AgentServingPool.model_validate(yaml.safe_load((ROOT / "examples" / "pool-sim.yaml").read_text())).spec
NAMES = [f"sim-engine-{i}" for i in range(6)]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
INITIAL = ["prefill"] * 3 + ["decode"] * 3


def observed(roles: list[str | None], served: list[str | None], ready: list[bool], **kw: Any) -> Observed:
    pods = {
        n: PodView(n, desired_role=r, observed_role=s, ready=ok)
        for n, r, s, ok in zip(NAMES, roles, served, ready, strict=True)
    }
    base: dict[str, Any] = {"pods": pods, "router_ready": True, "directory_ready": True}
    base |= {"redis_ready": True, "config_generation": 1}
    return Observed(**{**base, **kw})


def conditions(status: Any) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


@pytest.mark.parametrize(
    ("obs", "ready", "progressing", "degraded", "split", "desired"),
    [
        (observed(INITIAL, [None] * 6, [False] * 6), ("False", "NodesStarting"), ("True", "NodesStarting"),
         ("False", "Healthy"), "0P0D", "3P3D"),
        (observed(INITIAL, INITIAL, [True] * 6), ("True", "AllNodesServing"), ("True", "Learning"),
         ("False", "Healthy"), "3P3D", "3P3D"),
        (observed(INITIAL, INITIAL, [True] * 6, router_ready=False), ("False", "ControlPlaneStarting"),
         ("True", "Learning"), ("False", "Healthy"), "3P3D", "3P3D"),
        (observed(["decode", *INITIAL[1:]], INITIAL, [True] * 6), ("True", "AllNodesServing"),
         ("True", "Switching"), ("False", "Healthy"), "3P3D", "2P4D"),
        (observed(INITIAL, INITIAL, [True] * 6, config_generation=0), ("True", "AllNodesServing"),
         ("True", "Reconciling"), ("False", "Healthy"), "3P3D", "3P3D"),
        (observed(INITIAL, INITIAL, [True] * 6, draining=("sim-engine-5",)), ("True", "AllNodesServing"),
         ("True", "Draining"), ("False", "Healthy"), "3P3D", "3P3D"),
        (observed([None] * 6, [None] * 6, [False] * 6), ("False", "NodesStarting"), ("True", "NodesStarting"),
         ("False", "Healthy"), "0P0D", "3P3D"),  # no role yet: the initial one is shown as desired
    ],
)  # fmt: skip
def test_conditions_and_splits(
    obs: Observed,
    ready: tuple[str, str],
    progressing: tuple[str, str],
    degraded: tuple[str, str],
    split: str,
    desired: str,
) -> None:
    status = pool_status(NAMES, SPEC, 1, 1, obs, None, T0)
    assert conditions(status) == {"Ready": ready, "Progressing": progressing, "Degraded": degraded}
    assert status.split is not None and status.split.label == split
    assert status.desired_split is not None and status.desired_split.label == desired


def test_a_failing_engine_is_degraded() -> None:
    obs = observed(INITIAL, INITIAL, [True] * 5 + [False])
    pods = dict(obs.pods)
    pods["sim-engine-5"] = PodView("sim-engine-5", "decode", None, False, failing="engine: CrashLoopBackOff")
    status = pool_status(NAMES, SPEC, 1, 1, dataclasses.replace(obs, pods=pods), None, T0)
    assert conditions(status)["Degraded"] == ("True", "EngineFailing")
    assert "CrashLoopBackOff" in next(c.message for c in status.conditions if c.type == "Degraded")


def planner_state(switches: SwitchRecord) -> PlannerState:
    shape = SavedShape(experts_active=0, experts_total=0, t_fwd=1.0)
    return PlannerState(shape=shape, fitted_at=0.0, models={}, switches=switches)


def test_an_unchanged_cluster_gives_the_same_status_and_switches_are_the_planners_count() -> None:
    first = pool_status(NAMES, SPEC, 1, 1, observed(INITIAL, INITIAL, [True] * 6), None, T0)
    again = pool_status(
        NAMES, SPEC, 1, 1, observed(INITIAL, INITIAL, [True] * 6), first, T0 + timedelta(hours=1)
    )
    assert again == first  # no transition, so no new timestamps: nothing to write
    assert first.switches is not None and first.switches.total == 0
    # two switches between two refreshes (3P3D -> 2P4D -> 3P3D): the split looks unchanged, the
    # planner's count says two
    at = (T0 + timedelta(minutes=90)).timestamp()
    record = SwitchRecord(total=2, last_at=at, last_from="2P4D", last_to="3P3D", last_reason="why")
    switched = pool_status(
        NAMES,
        SPEC,
        1,
        1,
        observed(INITIAL, INITIAL, [True] * 6, planner_state=planner_state(record)),
        again,
        T0 + timedelta(hours=2),
    )
    s = switched.switches
    assert s is not None
    assert (s.total, s.last_from, s.last_to, s.last_reason) == (2, "2P4D", "3P3D", "why")
    assert s.last_time == T0 + timedelta(minutes=90)
    # a moved role without a planner count is not a switch (the operator derives none)
    moved = ["decode", *INITIAL[1:]]
    later = pool_status(
        NAMES, SPEC, 1, 1, observed(moved, moved, [True] * 6), switched, T0 + timedelta(hours=3)
    )
    assert later.switches == switched.switches


@pytest.mark.parametrize(
    ("loaded", "progressing", "router", "planner"),
    [
        (None, ("True", "Learning"), None, None),  # no planner report: only the ConfigMap's is known
        (LoadedGenerations(planner=2, routers={"r0": 2, "r1": 2}), ("True", "Learning"), (2, 2, 2),
         (2, 2, 1)),
        (LoadedGenerations(planner=2, routers={"r0": 1, "r1": 2}), ("True", "ConfigLoading"), (1, 2, 2),
         (2, 2, 1)),
        (LoadedGenerations(planner=1, routers={"r0": 2}), ("True", "ConfigLoading"), (2, 2, 1), (1, 1, 1)),
        (LoadedGenerations(planner=None, routers={"r0": 2}), ("True", "ConfigLoading"), (2, 2, 1),
         (None, None, 1)),  # a planner whose file names no generation runs an unknown one
        (LoadedGenerations(planner=2, routers={}), ("True", "Learning"), (None, None, 0), (2, 2, 1)),
    ],
)  # fmt: skip
def test_the_generations_the_router_and_planner_run(
    loaded: LoadedGenerations | None,
    progressing: tuple[str, str],
    router: tuple[int | None, int | None, int] | None,
    planner: tuple[int | None, int | None, int] | None,
) -> None:
    obs = observed(INITIAL, INITIAL, [True] * 6, config_generation=2, loaded=loaded)
    status = pool_status(NAMES, SPEC, 2, 2, obs, None, T0)
    assert conditions(status)["Progressing"] == progressing
    assert status.config is not None and status.config.desired_generation == 2
    for part, want in ((status.config.router, router), (status.config.planner, planner)):
        got = None if part is None else (part.loaded_generation, part.newest_generation, part.replicas)
        assert got == want
    if progressing[1] == "ConfigLoading":
        message = next(c.message for c in status.conditions if c.type == "Progressing")
        assert message.endswith("the ConfigMap holds 2") and "runs generation" in message


def test_a_colocated_pool() -> None:
    spec = AgentServingPoolSpec.model_validate(
        {**SPEC.to_wire(), "mode": "colocated", "planner": {"enabled": False}, "initialSplit": None}
    )
    status = pool_status(NAMES, spec, 1, 1, observed(["both"] * 6, ["both"] * 6, [True] * 6), None, T0)
    assert status.split is not None and status.split.label == "6C"
    assert status.model_fit is None
    assert conditions(status)["Progressing"] == ("False", "Stable")
    # no planner shows an observed role on a colocated pool's pods: a ready engine serves `both`
    unshown = pool_status(
        NAMES, spec, 1, 1, observed(["both"] * 6, [None] * 6, [True] * 5 + [False]), None, T0
    )
    assert [n.observed_role for n in unshown.nodes] == ["both"] * 5 + [None]
    assert unshown.split is not None and unshown.split.label == "5C"
    assert conditions(unshown)["Progressing"] == ("True", "NodesStarting")
    # the routers' generations, as they answered the operator: no planner part
    asked = observed(["both"] * 6, ["both"] * 6, [True] * 6, loaded=LoadedGenerations(routers={"r0": 1}))
    known = pool_status(NAMES, spec, 1, 1, dataclasses.replace(asked, planner_runs=False), None, T0)
    assert known.config is not None and known.config.planner is None
    assert known.config.router is not None and known.config.router.loaded_generation == 1
    assert conditions(known)["Progressing"] == ("False", "Stable")
    silent = dataclasses.replace(asked, planner_runs=False, loaded=LoadedGenerations(routers={"r0": None}))
    lagging = pool_status(NAMES, spec, 1, 1, silent, None, T0)
    assert conditions(lagging)["Progressing"] == ("True", "ConfigLoading")


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        ({"metadata": {"name": "r"}, "status": {"phase": "Running", "podIP": "10.0.0.5"},
          "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8123}]}]}},
         RouterPod("r", "http://10.0.0.5:8123")),
        ({"metadata": {"name": "r"}, "status": {"phase": "Running", "podIP": "fd00::5"}},
         RouterPod("r", "http://[fd00::5]:8000")),  # no named port: the router's default
        ({"metadata": {"name": "r"}, "status": {"phase": "Pending", "podIP": "10.0.0.5"}}, None),
        ({"metadata": {"name": "r"}, "status": {"phase": "Running"}}, None),
        ({"metadata": {"name": "r", "deletionTimestamp": "2026-12-01T00:00:00Z"},
          "status": {"phase": "Running", "podIP": "10.0.0.5"}}, None),
    ],
)  # fmt: skip
def test_which_router_pods_are_asked(pod: dict[str, Any], expected: RouterPod | None) -> None:
    assert running_router(pod) == expected


def test_an_invalid_spec() -> None:
    status = invalid_status("limits too small", 3, None, T0)
    assert conditions(status) == {
        "Ready": ("False", "InvalidSpec"),
        "Progressing": ("False", "InvalidSpec"),
        "Degraded": ("True", "InvalidSpec"),
    }
    assert status.observed_generation == 3


@pytest.mark.parametrize(
    ("existing", "desired", "expected"),
    [
        ({"a": 1, "b": {"c": 2, "server": 3}}, {"b": {"c": 2}}, True),
        ({"a": 1}, {"a": 2}, False),
        ({"memory": "3Gi"}, {"memory": "3072Mi"}, True),  # the server's canonical quantity
        ({"cpu": "500m"}, {"cpu": "0.5"}, True),
        ({"cpu": "1"}, {"cpu": "2"}, False),
        ({"l": [1, 2]}, {"l": [1, 2, 3]}, False),
        ({"l": [{"x": 1, "y": 2}]}, {"l": [{"x": 1}]}, True),
        ({}, {"missing": None}, False),
        ({"name": "abc"}, {"name": "abd"}, False),
    ],
)
def test_contains(existing: Any, desired: Any, expected: bool) -> None:
    assert contains(existing, desired) is expected


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        ({"a": 1, "b": 2}, {"a": 1}, {"a": 1, "b": None}),
        # a nested field that became unknown is removed, not left stale
        ({"config": {"router": {"loaded": 1, "replicas": 1}}}, {"config": {"router": {"replicas": 1}}},
         {"config": {"router": {"loaded": None, "replicas": 1}}}),
        ({"l": [{"x": 1}]}, {"l": []}, {"l": []}),  # lists are replaced whole
        ({"a": {"b": 1}}, {"a": 3}, {"a": 3}),
    ],
)  # fmt: skip
def test_the_status_merge_patch(old: dict[str, Any], new: dict[str, Any], patch: dict[str, Any]) -> None:
    assert merge_patch_between(old, new) == patch


def test_the_retry_back_off() -> None:
    from agentpool.operator.handlers import backoff_s

    assert [backoff_s(r) for r in range(8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


def test_a_pod_without_a_role_keeps_the_one_the_status_showed_for_it() -> None:
    """The planner made it 2P4D; sim-engine-0 (initially prefill) was replaced (gone, then new and
    without annotations): the status keeps its last desired role, and so does the split."""
    switched = ["decode", *INITIAL[1:]]
    before = pool_status(NAMES, SPEC, 1, 1, observed(switched, switched, [True] * 6), None, T0)
    assert before.desired_split is not None and before.desired_split.label == "2P4D"
    gone = observed(switched, switched, [True] * 6)
    gone = dataclasses.replace(gone, pods={n: p for n, p in gone.pods.items() if n != "sim-engine-0"})
    for obs in (gone, observed([None, *switched[1:]], [None, *switched[1:]], [False] + [True] * 5)):
        after = pool_status(NAMES, SPEC, 1, 1, obs, before, T0)
        assert after.nodes[0].desired_role == "decode"
        assert after.desired_split is not None and after.desired_split.label == "2P4D"
    fresh = pool_status(NAMES, SPEC, 1, 1, gone, None, T0)  # no status yet: the initial role
    assert fresh.nodes[0].desired_role == "prefill"


@pytest.mark.parametrize(
    ("mode", "last", "expected"),
    [
        ("disaggregated", None, "prefill"),  # no status: ordinal 0's initial role
        ("disaggregated", "decode", "decode"),
        ("disaggregated", "both", "prefill"),  # a role of another mode is not taken over
        ("colocated", "both", "both"),
        ("colocated", "decode", "both"),
    ],
)
def test_role_for_pod(mode: str, last: str | None, expected: str) -> None:
    spec = SPEC if mode == "disaggregated" else colocated_spec()
    previous = None
    if last is not None:
        names = ["other", NAMES[0]]
        previous = pool_status(names, spec, 1, 1, observed_named(names, ["prefill", last]), None, T0)
    assert role_for_pod(spec, 0, NAMES[0], previous) == expected


def colocated_spec() -> AgentServingPoolSpec:
    raw = yaml.safe_load((ROOT / "examples" / "pool-sim.yaml").read_text())
    raw["spec"] |= {"mode": "colocated", "planner": {"enabled": False}}
    del raw["spec"]["initialSplit"]
    return AgentServingPool.model_validate(raw).spec


def observed_named(names: list[str], roles: list[str]) -> Observed:
    pods = {
        n: PodView(n, desired_role=r, observed_role=r, ready=True) for n, r in zip(names, roles, strict=True)
    }
    return Observed(pods=pods, router_ready=True, directory_ready=True, redis_ready=True, config_generation=1)
