"""Config, inbox, pod annotations and the near-switch rule."""

from __future__ import annotations

import math

import pytest

from agentpool.models import DecodeIterationRecord, OccupancySample, RequestWorkRecord, Work
from agentpool.planner.config import PlannerConfig
from agentpool.planner.core import Candidate, Outcome, PlannerPolicy, SplitDecision
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.kube import PodRoleState
from agentpool.planner.roles import ServedRoles


def test_config_defaults_are_the_papers_and_bad_values_are_rejected() -> None:
    cfg = PlannerConfig()
    assert (cfg.window_s, cfg.slices, cfg.warmup_s, cfg.cooldown_s) == (600, 10, 1800, 120)
    assert cfg.policy() == PlannerPolicy(cooldown_s=120, min_prefill=1, min_decode=1)
    with pytest.raises(ValueError, match="2 slices"):
        PlannerConfig(slices=1)
    with pytest.raises(ValueError, match="below min"):
        PlannerConfig(min_prefill=2, initial_prefill=1)
    with pytest.raises(ValueError, match="cooldown"):
        PlannerConfig(cooldown_s=-1)
    with pytest.raises(ValueError, match="min relative gain"):
        PlannerConfig(min_relative_gain=-0.01)


def test_inbox_keeps_only_the_newest_iteration_records_beyond_its_cap() -> None:
    inbox = PlannerInbox(keep_s=100, max_iterations=3)
    inbox.add_iterations([DecodeIterationRecord("e0", float(at), 2, 0.01) for at in range(5)])
    assert [r.at for r in inbox.iterations(0, 1e9)] == [2.0, 3.0, 4.0] and inbox.iterations_dropped == 2
    inbox.add_iterations([DecodeIterationRecord("e0", 200.0, 2, 0.01)])  # the others are too old
    assert [r.at for r in inbox.iterations(0, 1e9)] == [200.0] and inbox.iterations_dropped == 2
    with pytest.raises(ValueError):
        PlannerInbox(max_iterations=0)


def test_inbox_returns_records_by_time_and_forgets_old_ones() -> None:
    inbox = PlannerInbox(keep_s=100)
    inbox.add_requests([RequestWorkRecord(at, Work(t_uc=at + 1)) for at in (5.0, 1.0, 3.0)])
    assert [r.at for r in inbox.requests(0, 10)] == [1.0, 3.0, 5.0]
    assert [r.at for r in inbox.requests(3, 5)] == [3.0]  # [start, end)
    inbox.add_requests([RequestWorkRecord(104.0, Work(t_uc=1))])  # horizon moves to 4.0
    assert [r.at for r in inbox.requests(0, 200)] == [5.0, 104.0]
    inbox.add_occupancy([OccupancySample(1.0, 3.0)])
    assert inbox.occupancy(0, 2) == [OccupancySample(1.0, 3.0)]
    with pytest.raises(ValueError):
        PlannerInbox(keep_s=0)


def test_pod_annotations() -> None:
    # the served role comes from the routers; the pod's observed-role annotation is never read back
    notes = {"agentpool.io/role": "prefill", "agentpool.io/observed-role": "decode"}
    pod = PodRoleState.of("p", notes, "prefill")
    assert (pod.desired_role, pod.pinned, pod.draining) == ("prefill", False, False)
    moving = PodRoleState.of("p", {"agentpool.io/role": "decode"}, "prefill")
    assert moving.draining
    assert PodRoleState.of("p", {"agentpool.io/role": "decode"}, None).draining  # engine has not reported
    for value, pinned in [("true", True), ("True", True), ("yes", True), ("", True), ("false", False)]:
        assert PodRoleState.of("p", {"agentpool.io/role-pinned": value}, None).pinned is pinned
    assert not PodRoleState.of("p", None, None).pinned


def test_served_roles_keep_the_newest_report_whichever_router_carries_it() -> None:
    served = ServedRoles()
    assert served.get("e-0") is None
    served.update("e-0", "decode", 10.0)
    served.update("e-0", "prefill", 12.0)  # a router that heard the switch
    served.update("e-0", "decode", 11.0)  # a router that heard an older report: ignored
    assert served.get("e-0") == "prefill"
    served.update("e-1", "both", 1.0)
    assert (served.get("e-0"), served.get("e-1")) == ("prefill", "both")
    # the KV capacity: unknown (no limit) until a report says it, then the newest report's
    assert served.kv_capacity("e-0") == math.inf
    served.update("e-0", "prefill", 13.0, 500_000)
    served.update("e-0", "prefill", 12.5, 100)  # older: ignored
    served.update("e-0", "prefill", 14.0)  # a report without it keeps the known one
    assert served.kv_capacity("e-0") == 500_000.0 and served.kv_capacity("e-1") == math.inf


def _candidate(mean: float, se: float) -> Candidate:
    return Candidate(3, ("n3",), (), (mean,), mean, se, qualifies=mean > 2 * se)


def test_near_switch_is_a_hold_whose_best_gain_exceeds_one_standard_error() -> None:
    def decision(*cands: Candidate) -> SplitDecision:
        return SplitDecision(Outcome.HOLD, "", ("n0",), ("n1",), candidates=cands)

    assert decision(_candidate(1.5, 1.0), _candidate(-1.0, 0.1)).near_switch
    assert not decision(_candidate(0.9, 1.0)).near_switch
    assert not decision().near_switch
    assert decision(_candidate(0.9, 1.0), _candidate(1.2, 1.0)).best == _candidate(1.2, 1.0)
