"""The analytic bound is a bound: no simulated system exceeds it; the references are named so."""

from __future__ import annotations

from functools import cache

import pytest

from agentpool.sim.bounds import ideal_replay_count, min_duration, min_responses
from agentpool.sim.presets import preset
from agentpool.sim.run import (
    Scenario,
    best_reference,
    load_conversations,
    reference_runs,
    run_system,
    scenario_bound,
)
from agentpool.sim.simulator import SimConfig
from agentpool.sim.systems import SYSTEMS
from agentpool.sim.trace import Conversation

GLM = preset("glm52-4xgb300")


@cache
def _convs() -> tuple[Conversation, ...]:
    convs = load_conversations(Scenario(conversations=16))
    assert convs is not None
    return tuple(convs)


def _scenario(**kw: object) -> Scenario:
    base: dict[str, object] = {
        "conversations": 16,
        "agents": 16,
        "max_pause_s": 20.0,
        "warmup_s": 60.0,
        "duration_s": 360.0,
        "static_prefill_nodes": 2,
        "sim": SimConfig(nodes=4, prefill_nodes=2),
    }
    base.update(kw)
    return Scenario(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("seed", "ramp_s"), [(0, 0.0), (1, 0.0), (0, 120.0)])
def test_no_system_exceeds_the_bound(seed: int, ramp_s: float) -> None:
    sc = _scenario(seed=seed, ramp_s=ramp_s)
    bound = scenario_bound(sc, _convs())
    assert bound is not None and bound.ideal_window_rps is not None
    names = reference_runs(["agentpool", "static-cache-aware", "dynamo-like", "static-reference"], 4)
    results = best_reference([run_system(n, sc, _convs()) for n in names])
    assert [r["system"] for r in results][-1] == "static-reference"
    for r in results:
        assert 0 < r["summary"]["throughput_rps"] <= bound.throughput_rps, r["system"]


def test_minimal_responses_are_below_every_simulated_response() -> None:
    conv = _convs()[0]
    rmin = min_responses(conv, GLM.roofline(), GLM.t_acc, 15000 // 512, 8, 512)
    sc = _scenario(agents=1, conversations=1, warmup_s=0.0, duration_s=3000.0, seed=0)
    r = run_system("static-reference@2", sc, (conv,))
    e2e = r["summary"]["e2e_s"]
    assert r["summary"]["requests"] > 0
    assert min(rmin) * 0.88 <= e2e["p50"]
    assert sum(rmin) / len(rmin) * 0.88 <= e2e["mean"]


def test_the_ideal_replay_counts_each_request_once_and_respects_pauses() -> None:
    conv = _convs()[0]
    rs = [0.5] * len(conv.requests)
    d = min_duration(conv, rs, max_pause_s=10.0)
    assert d >= 0.5 * len(conv.roots)
    order = iter([conv, conv])
    done = ideal_replay_count(order, {id(conv): rs}, 1, 10.0, 0.0, d + 1e-6)
    assert done == len(conv.requests)  # the second pass starts at d and finishes nothing by then


def test_non_bounds_are_called_references() -> None:
    assert "oracle" not in SYSTEMS and "oracle-reference" in SYSTEMS
    for name, cfg in SYSTEMS.items():
        if "reference" in name:
            assert "reference" in cfg.description
    assert scenario_bound(_scenario(arrival_per_min=5.0), _convs()) is None


def test_a_ramp_starts_the_ideal_replays_agents_later() -> None:
    conv = _convs()[0]
    rs = [0.5] * len(conv.requests)
    d = min_duration(conv, rs, max_pause_s=10.0)

    def count(agents: int, end_s: float, ramp_s: float) -> int:
        return ideal_replay_count(
            iter([conv] * 10 * agents), {id(conv): rs}, agents, 10.0, 0.0, end_s, ramp_s
        )

    assert count(4, d + 1e-6, 0.0) == 4 * len(conv.requests)  # all four start at 0
    # over a ramp of 4d agent k starts at k*d: by d + eps only agent 0 has finished its conversation
    assert count(4, d + 1e-6, 4 * d) == len(conv.requests)
    # by 4d: agent k (started at k*d) has run 4 - k conversations back to back, 10 in all
    assert count(4, 4 * d + 1e-6, 4 * d) == 10 * len(conv.requests)
