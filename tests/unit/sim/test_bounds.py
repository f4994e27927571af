"""The analytic bound is a bound: no simulated system exceeds it; the references are named so."""

from __future__ import annotations

import math
import random
from functools import cache

import numpy as np
import pytest

from agentpool.models import PrefillBatchItem
from agentpool.sim.bounds import (
    ActiveConversation,
    ClosedLoopBound,
    ReplayState,
    ideal_replay_count,
    min_duration,
    min_responses,
)
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
from agentpool.sim.trace import Conversation, TraceRequest

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
        summary = r["summary"]
        assert 0 < summary["throughput_rps"] <= summary["bound_rps"], r["system"]


@pytest.mark.parametrize("seed", range(12))
def test_slower_requests_never_beat_the_window_bound(seed: int) -> None:
    """The window bound's argument, checked on the ideal replay itself: the same conversations and
    order with every response made slower by a random factor (a "run") complete no more requests
    in the window than the ideal replay by its end less the run's own before the window. The
    ideal replay's own window count plus one request per agent (the figure used before) is not a
    bound: the slower run can start the window further behind and catch up inside it."""
    rng = random.Random(seed)
    convs = _convs()[:6]
    agents = rng.choice([1, 2, 3, 5])
    ideal = {id(c): [rng.uniform(0.2, 3.0) for _ in c.requests] for c in convs}
    slow = {
        k: [r * (1.0 + rng.expovariate(1.0) * rng.choice([0.0, 0.5, 4.0])) for r in v]
        for k, v in ideal.items()
    }
    order = [convs[rng.randrange(len(convs))] for _ in range(200)]
    start, end, ramp = rng.uniform(5.0, 60.0), rng.uniform(80.0, 200.0), rng.choice([0.0, 30.0])
    before_ideal, in_ideal = ideal_replay_count(iter(order), ideal, agents, 10.0, start, end, ramp)
    before_run, in_run = ideal_replay_count(iter(order), slow, agents, 10.0, start, end, ramp)
    assert before_run <= before_ideal
    assert in_run <= before_ideal + in_ideal - before_run


def test_minimal_responses_are_below_every_simulated_response() -> None:
    conv = _convs()[0]
    rmin = min_responses(conv, GLM.roofline(), GLM.t_acc, 15000 // 512, 8, 512)
    sc = _scenario(agents=1, conversations=1, warmup_s=0.0, duration_s=3000.0, seed=0)
    r = run_system("static-reference@2", sc, (conv,))
    e2e = r["summary"]["e2e_s"]
    assert r["summary"]["requests"] > 0
    assert min(rmin) * 0.88 <= e2e["p50"]
    assert sum(rmin) / len(rmin) * 0.88 <= e2e["mean"]


def test_minimal_responses_cache_the_prefix_another_request_or_the_shared_prefix_holds() -> None:
    """``R_min`` as the module defines it, written out plainly: a request's cached prefix is its
    prompt's longest run of blocks from the start that the shared prefix or another request of the
    conversation (prompt or output) holds."""
    truth, shared, group, block = GLM.roofline(), 15000 // 512, 8, 512
    for conv in _convs():
        keys = [conv.block_keys(i, 1, shared, group) for i in range(len(conv.requests))]
        expected = []
        for i, r in enumerate(conv.requests):
            others = {k for j, (p, q) in enumerate(keys) if j != i for k in (*p, *q)}
            cached = 0
            for k in keys[i][0]:
                if not (1 <= k <= shared or k in others):
                    break
                cached += 1
            uncached = max(1, r.input_tokens - min(cached * block, r.input_tokens - 1))
            prefill = truth.prefill_s([PrefillBatchItem(float(uncached), float(r.input_tokens - uncached))])
            steps = math.ceil(max(0, r.output_tokens - 1) / GLM.t_acc - 1e-9)
            expected.append(prefill + (steps * truth.decode_s(1, float(r.input_tokens)) if steps else 0.0))
        assert min_responses(conv, truth, GLM.t_acc, shared, group, block) == expected, conv.name


def test_the_ideal_replay_counts_each_request_once_and_respects_pauses() -> None:
    conv = _convs()[0]
    rs = [0.5] * len(conv.requests)
    d = min_duration(conv, rs, max_pause_s=10.0)
    assert d >= 0.5 * len(conv.roots)
    order = iter([conv, conv])
    before, done = ideal_replay_count(order, {id(conv): rs}, 1, 10.0, 0.0, d + 1e-6)
    assert (before, done) == (
        0,
        len(conv.requests),
    )  # the second pass starts at d and finishes nothing by then


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
        before, inside = ideal_replay_count(
            iter([conv] * 10 * agents), {id(conv): rs}, agents, 10.0, 0.0, end_s, ramp_s
        )
        assert before == 0
        return inside

    assert count(4, d + 1e-6, 0.0) == 4 * len(conv.requests)  # all four start at 0
    # over a ramp of 4d agent k starts at k*d: by d + eps only agent 0 has finished its conversation
    assert count(4, d + 1e-6, 4 * d) == len(conv.requests)
    # by 4d: agent k (started at k*d) has run 4 - k conversations back to back, 10 in all
    assert count(4, 4 * d + 1e-6, 4 * d) == 10 * len(conv.requests)


def test_a_run_behind_before_the_window_can_beat_the_ideal_window_count_but_not_its_bound() -> None:
    """Ten chained requests, then a 100 s pause: the ideal replay (1 s each) finishes the ten before
    the window and nothing in it; a run whose first request took 5 s finishes four of them in the
    window, more than the ideal count plus one request per agent (the figure used before, which
    D.2's seed 1 exceeded), and exactly its own bound: the ideal continuation of its state."""
    empty = np.zeros(0, dtype=np.int64)
    reqs = [TraceRequest(0, i, 100, 2, empty, empty, i - 1, 100.0 if i == 10 else 0.0) for i in range(12)]
    conv = Conversation.build("paused", reqs, 512)
    ideal = [1.0] * 12
    start, end = 10.5, 60.0
    before_ideal, in_ideal = ideal_replay_count(iter([conv] * 3), {id(conv): ideal}, 1, None, start, end)
    before_run, in_run = ideal_replay_count(
        iter([conv] * 3), {id(conv): [5.0] + [1.0] * 11}, 1, None, start, end
    )
    assert (before_ideal, in_ideal) == (10, 0)
    assert (before_run, in_run) == (6, 4)
    assert in_run > in_ideal + 1
    # the run at 10.5 s: requests 0-5 done at 5..10 s, request 6 issued at 10 s
    state = ReplayState(start, 1, (ActiveConversation(conv, {i: 5.0 + i for i in range(6)}, {6: 10.0}),))
    bound = ClosedLoopBound(1.0, 1, 12, 112.0, 1.0, (start, end), 0.0, None, 0.0, {id(conv): ideal})
    assert bound.for_run(state, iter([conv] * 3)) * (end - start) == pytest.approx(4)
    # one request further behind (request 5 still running), one more request is left for the window
    later = ReplayState(start, 1, (ActiveConversation(conv, {i: 5.0 + i for i in range(5)}, {5: 9.0}),))
    assert bound.for_run(later, iter([conv] * 3)) * (end - start) == pytest.approx(5)


def test_the_continuation_of_a_run_ahead_starts_its_next_conversations_earlier() -> None:
    """Two agents, one conversation of three chained 1 s requests each: an agent whose conversation
    is done at the window's start takes the next one from the order there, one still running takes
    it when it is done; each finished request before the window's end counts."""
    empty = np.zeros(0, dtype=np.int64)
    conv = Conversation.build(
        "chain", [TraceRequest(0, i, 100, 2, empty, empty, i - 1, 0.0) for i in range(3)], 512
    )
    rs = {id(conv): [1.0, 1.0, 1.0]}
    bound = ClosedLoopBound(1.0, 2, 3, 3.0, 1.0, (10.0, 13.5), 0.0, None, 0.0, rs)
    # agent A runs request 2 since 9.8 s (ends 10.8), B's request 1 was issued at 10 s (ends 11, 12)
    state = ReplayState(
        10.0,
        5,
        (
            ActiveConversation(conv, {0: 8.0, 1: 9.8}, {2: 9.8}),
            ActiveConversation(conv, {0: 9.9}, {1: 10.0}),
        ),
    )
    # A: 10.8, then a new conversation: 11.8, 12.8 (13.8 too late); B: 11, 12, then a new one: 13
    assert bound.for_run(state, iter([conv] * 20)) * 3.5 == pytest.approx(6)
