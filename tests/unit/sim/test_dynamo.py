"""The dynamo-like planner follows Dynamo's load planner: interval means, one change at a time,
a grace period after adding decode, the queue-trend check, nothing while workers change."""

from __future__ import annotations

from agentpool.models import TtftSlo
from agentpool.node import Role
from agentpool.sim.dynamo import DynamoLoadPlanner, DynamoSettings
from agentpool.sim.metrics import Metrics
from agentpool.sim.presets import preset
from agentpool.sim.simulator import SimConfig, Simulator
from agentpool.sim.systems import system


def make() -> tuple[Simulator, DynamoLoadPlanner]:
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 1e6)
    sim = Simulator(
        system("dynamo-like"), preset("glm52-4xgb300"), SimConfig(nodes=6, prefill_nodes=3), metrics
    )
    return sim, DynamoLoadPlanner(sim, DynamoSettings())


def moves(sim: Simulator) -> list[Role]:
    return [sw.to for sw in sim._switches.values()]


def set_kv(sim: Simulator, fraction: float) -> None:
    for n in sim.nodes[3:]:
        n.kv_used_tokens = int(fraction * n.kv_capacity_tokens)


def test_the_interval_mean_decides_not_the_last_sample() -> None:
    sim, p = make()
    set_kv(sim, 0.95)
    p.sample(0.0)
    set_kv(sim, 0.5)
    for t in range(1, 4):
        p.sample(float(t))
    p.tick(30.0)  # mean (0.95 + 3 * 0.5) / 4 < 0.9: no change
    assert moves(sim) == []
    for t in range(31, 35):
        set_kv(sim, 0.95)
        p.sample(float(t))
    p.tick(60.0)
    assert moves(sim) == [Role.DECODE]


def test_nothing_is_sampled_or_decided_while_a_worker_changes() -> None:
    sim, p = make()
    set_kv(sim, 0.95)
    p.tick(30.0)
    assert moves(sim) == [Role.DECODE]
    p.sample(31.0)
    assert p.kv == []
    p.tick(60.0)
    assert len(moves(sim)) == 1


def test_no_decode_scale_down_in_the_grace_period_after_adding_decode() -> None:
    sim, p = make()
    set_kv(sim, 0.95)
    p.tick(30.0)
    sim._switches.clear()  # the relaunch is over
    set_kv(sim, 0.0)
    for q in sim.queued[:3]:
        q.requests = 5
    for k in range(3):  # three intervals of grace: the queue cannot take a decode node
        p.tick(60.0 + 30 * k)
        assert moves(sim) == []
    p.tick(150.0)
    assert moves(sim) == [Role.PREFILL]


def test_a_queue_falling_fast_does_not_take_a_decode_node() -> None:
    sim, p = make()
    for q in sim.queued[:3]:
        q.requests = 10
    p.last_queue = 40.0  # from 40 to 10 per node in one interval: under 0.5 within three more
    p.tick(30.0)
    assert moves(sim) == []
    p.tick(60.0)  # steady at 10: scale up prefill
    assert moves(sim) == [Role.PREFILL]


def test_baselines_route_with_the_sglang_gateway_policy() -> None:
    assert system("dynamo-like").policy == "cache-aware"
    assert system("static-cache-aware").policy == "cache-aware"
    assert system("dynamo-like+pool").policy == "cache-aware"
