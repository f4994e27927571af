"""The dynamo-like planner follows Dynamo's load planner: interval means of the prefill queue and
the decode KV load, scale-downs before scale-ups, a full budget (only a freed node can move), a
grace period after adding decode, nothing while workers change; and the SGLang PD baselines
reserve decode KV at dispatch, which is what Dynamo's KV signal sees."""

from __future__ import annotations

import pytest

from agentpool.models import TtftSlo
from agentpool.node import Request, Role
from agentpool.router.policy import QueuedPrefill
from agentpool.sim.dynamo import DynamoLoadPlanner, DynamoSettings, DynamoSignals, decide
from agentpool.sim.metrics import Metrics
from agentpool.sim.presets import preset
from agentpool.sim.simulator import Issue, SimConfig, Simulator
from agentpool.sim.systems import system

S = DynamoSettings()


def sig(queue: float, kv: float, first: float | None = None, last: float | None = None) -> DynamoSignals:
    return DynamoSignals(queue, kv, queue if first is None else first, queue if last is None else last)


@pytest.mark.parametrize(
    ("signals", "prefill", "decode", "grace", "expected"),
    [
        # prefill idle (queue < 0.2), decode KV high: the freed prefill node becomes decode
        (sig(0.1, 0.95), 6, 3, 0, Role.DECODE),
        # prefill idle, decode KV moderate: Dynamo still scales prefill down; on the fixed pool the
        # freed node is relaunched as decode
        (sig(0.1, 0.7), 6, 3, 0, Role.DECODE),
        # decode KV low, prefill queued: the freed decode node becomes prefill
        (sig(3.0, 0.3), 4, 5, 0, Role.PREFILL),
        # ... but not within the grace period after a decode node was added
        (sig(3.0, 0.3), 4, 5, 2, None),
        # both phases want more (long queue, KV above 0.9): the budget is full, nothing frees a node
        (sig(3.0, 0.95), 4, 5, 0, None),
        # both phases idle: two nodes would swap phases, no change
        (sig(0.1, 0.3), 4, 5, 0, None),
        # within thresholds
        (sig(0.3, 0.7), 4, 5, 0, None),
        # the last node of a phase never leaves it
        (sig(0.1, 0.95), 1, 8, 0, None),
        (sig(3.0, 0.3), 8, 1, 0, None),
    ],
)
def test_decide(signals: DynamoSignals, prefill: int, decode: int, grace: int, expected: Role | None) -> None:
    assert decide(signals, prefill, decode, grace, S).to is expected


def test_the_reason_names_the_signals_and_the_rules_that_fired() -> None:
    d = decide(sig(3.0, 0.95), 4, 5, 0, S)
    assert d.reason == "prefill queue 3.00, decode KV load 0.95: prefill up, decode up"
    falling = decide(sig(1.0, 0.7, first=20.0, last=1.0), 4, 5, 0, S)  # trend: under 0.5 soon
    assert "prefill up" not in falling.reason


def test_thresholds_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="thresholds"):
        DynamoSettings(kv_scale_down=0.95)


def make(agents_nodes: tuple[int, int] = (6, 3)) -> tuple[Simulator, DynamoLoadPlanner]:
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 1e6)
    nodes, prefill = agents_nodes
    sim = Simulator(
        system("dynamo-like"), preset("glm52-4xgb300"), SimConfig(nodes=nodes, prefill_nodes=prefill), metrics
    )
    return sim, DynamoLoadPlanner(sim, DynamoSettings())


def moves(sim: Simulator) -> list[Role]:
    return [sw.to for sw in sim.switches.active.values()]


def set_kv(sim: Simulator, fraction: float) -> None:
    for n in sim.nodes[3:]:
        n.kv_used_tokens = int(fraction * n.kv_capacity_tokens)


def set_queue(sim: Simulator, per_node: int) -> None:
    sim.queued[:3] = [QueuedPrefill(requests=per_node)] * 3


def test_the_interval_mean_decides_not_the_last_sample() -> None:
    sim, p = make()
    set_kv(sim, 0.3)
    set_queue(sim, 1)
    p.sample(0.0)
    set_queue(sim, 0)
    for t in range(1, 4):
        p.sample(float(t))
    p.tick(30.0)  # queue mean 3/4 >= 0.2: prefill is not idle; KV 0.3 < 0.5: decode down
    assert moves(sim) == [Role.PREFILL]
    sim.switches.active.clear()
    for t in range(31, 35):
        p.sample(float(t))
    set_kv(sim, 0.7)
    p.tick(60.0)  # queue mean 0: prefill down; KV mean 0.3 (the samples, not the last state)
    assert moves(sim) == []


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
    p.tick(30.0)  # idle prefill: a prefill node goes to decode
    sim.switches.active.clear()  # the relaunch is over
    set_kv(sim, 0.0)
    set_queue(sim, 5)
    for k in range(3):  # three intervals of grace
        p.tick(60.0 + 30 * k)
        assert moves(sim) == []
    p.tick(150.0)
    assert moves(sim) == [Role.PREFILL]


def test_requests_waiting_for_decode_room_count_in_the_kv_load() -> None:
    sim, p = make()
    set_kv(sim, 0.5)
    waiting = [Request(i, 1000, 10, [], [], "b", 0.0) for i in range(30)]
    sim._admission.extend(Issue(r, 1, 1000, False, lambda _r, _t: None) for r in waiting)
    p.sample(0.0)
    assert p.kv == [pytest.approx(0.5 + 0.02 * 30 / 3, abs=1e-6)]


def test_dispatch_binding_reserves_decode_kv_before_the_prefill_queue() -> None:
    """A dispatched request holds decode KV while it queues for prefill; one that finds no decode
    room waits before the prefill queue (not counted there) until room frees."""
    sim, _ = make((2, 1))
    dnode = sim.nodes[1]
    done: list[int] = []
    big = Request(0, 1_200_000, 50, list(range(1, 2345)), [], "a", 0.0)
    second = Request(1, 1_000_000, 50, list(range(5000, 6954)), [], "b", 0.0)
    for r in (big, second):
        sim.issue_at(0.0, Issue(r, 1, r.input_tokens, True, lambda req, t: done.append(req.rid)))
    sim.run(0.001)
    assert big.decode_node == 1 and dnode.kv_used_tokens == big.kv_tokens  # reserved before prefill
    assert sim.admission_waiting == 1 and second.decode_node < 0  # no room: not queued for prefill
    assert sim.queued[0].requests + len(sim.nodes[0].batch) <= 1
    sim.run(3600.0)
    assert sorted(done) == [0, 1]  # room freed when the first finished; the second then ran


def test_baselines_route_with_the_sglang_gateway_policy_and_reserve_at_dispatch() -> None:
    for name in ("dynamo-like", "static-cache-aware", "dynamo-like+pool"):
        assert system(name).policy == "cache-aware"
        assert system(name).decode_binding == "dispatch"
    assert system("agentpool").decode_binding is None  # the comparison's (prefill start)
    assert system("dynamo-like-late-reserve").decode_binding == "prefill-start"
