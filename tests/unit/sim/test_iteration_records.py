"""The node's optional iteration hook: records reproduce Eq. 1 / Eq. 2 and change no result."""

from __future__ import annotations

import math
from functools import cache

import pytest
from sim_node_builders import DENSE, PREFILL, node

from agentpool.models import PrefillBatchItem, TtftSlo
from agentpool.node import Iteration, Node, Request, Role
from agentpool.sim.metrics import Metrics
from agentpool.sim.planners import PlannerSettings, attach
from agentpool.sim.presets import preset
from agentpool.sim.replay import Replay, WorkloadPeriod, cycle
from agentpool.sim.run import Scenario, load_conversations
from agentpool.sim.simulator import SimConfig, Simulator
from agentpool.sim.systems import system
from agentpool.sim.trace import Conversation

GLM = preset("glm52-4xgb300")


def req(rid: int, inp: int, out: int, cached: int = 0, restore: int = 0) -> Request:
    r = Request(rid, inp, out, [], [], f"b{rid}", 0.0)
    r.cached_tokens = cached
    r.restore_tokens = restore
    return r


def drain(n: Node, now: float = 0.0) -> None:
    n.kick(now)
    while (t := n.wake_time()) < math.inf:
        n.advance(t)


def test_chunked_prefill_records_are_eq_1_of_their_batches() -> None:
    records: list[Iteration] = []
    n = node(Role.PREFILL, chunk=8192, on_iteration=records.append)
    n.enqueue(req(1, inp=12000, out=1, cached=2000, restore=1000), 0.0)
    n.enqueue(req(2, inp=3000, out=1), 0.0)
    drain(n)
    # chunk 1: 8192 of request 1; chunk 2: its last 1808 tokens and 3000 of request 2
    assert [r.batch for r in records] == [
        (PrefillBatchItem(t_uc=8192, t_c=2000, t_rst=1000),),
        (PrefillBatchItem(t_uc=1808, t_c=10192), PrefillBatchItem(t_uc=3000)),
    ]
    for r in records:
        assert r.prefill_s == PREFILL.iteration_time(r.batch)
        assert r.end - r.start == pytest.approx(r.prefill_s, rel=1e-12)
        assert (r.running, r.decode_s, r.sync_fetch_s, r.iterations) == (0, 0.0, 0.0, 1.0)
    assert records[1].start == records[0].end


def test_decode_stretches_are_eq_2_at_their_batch_size() -> None:
    records: list[Iteration] = []
    n = node(Role.DECODE, t_acc=1.0, on_iteration=records.append)
    a, b = req(1, inp=1000, out=1 + 10), req(2, inp=500, out=1 + 4)
    n.join_decode(a, 0.0)
    n.advance(0.05)  # a wake mid-stretch splits the stretch; nothing changes
    n.join_decode(b, 0.1)
    drain(n, 0.1)
    assert [r.running for r in records] == [1, 1, 2, 1]
    for r in records:
        assert r.batch == ()
        assert r.decode_s == DENSE.iteration_time(r.running)
        assert r.iterations == pytest.approx((r.end - r.start) / r.decode_s, rel=1e-12)
    # every request's decode iterations are accounted for: sum over stretches of B x iterations
    assert sum(r.running * r.iterations for r in records) == pytest.approx(10 + 4, rel=1e-9)
    assert records[0].context_tokens == 1001  # prompt + first token at the start
    assert records[2].context_tokens == pytest.approx(
        1000 + 1 + 0.1 / DENSE.iteration_time(1) + 500 + 1, rel=1e-12
    )


def test_mixed_iterations_add_eq_1_and_eq_2() -> None:
    records: list[Iteration] = []
    n = node(Role.BOTH, on_iteration=records.append)
    n.join_decode(req(1, inp=1000, out=1 + 100), 0.0)
    n.enqueue(req(2, inp=4000, out=1), 0.0)
    n.kick(0.0)
    mixed = records[-1]
    assert mixed.batch == (PrefillBatchItem(t_uc=4000),)
    assert mixed.running == 1
    assert mixed.decode_s == DENSE.iteration_time(1)
    assert mixed.end - mixed.start == pytest.approx(mixed.prefill_s + mixed.decode_s, rel=1e-12)


@cache
def _conversations() -> tuple[Conversation, ...]:
    convs = load_conversations(Scenario(conversations=12))
    assert convs is not None
    return tuple(convs)


def simulate(name: str, hook: list[Iteration] | None, truth: str = "equations") -> Metrics:
    """12 Claude Code agents for 600 s on 4 nodes (2 prefill), as ``run_system`` wires it."""
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 600.0)
    cfg = system(name)
    sim = Simulator(
        cfg,
        GLM,
        SimConfig(nodes=4, prefill_nodes=2, truth=truth, noise=0.0),
        metrics,
        on_iteration=None if hook is None else hook.append,
    )
    replay = Replay(sim, {"cc": cycle(_conversations())}, 15000 // 512, group=8)
    replay.closed_loop([WorkloadPeriod(0.0, {"cc": 12})])
    attach(cfg.planner, sim, PlannerSettings(window_s=120.0, cooldown_s=60.0))
    sim.run(600.0)
    return metrics


@pytest.mark.parametrize("name", ["agentpool", "dynamo-like+pool", "least-loaded"])
def test_simulated_records_reproduce_eq_1_and_eq_2_and_change_nothing(name: str) -> None:
    records: list[Iteration] = []
    hooked = simulate(name, records)
    assert hooked.rows == simulate(name, None).rows
    prefill, decode = GLM.prefill_model(), GLM.decode_model()
    batches = [r for r in records if r.batch]
    stretches = [r for r in records if not r.batch]
    assert batches and stretches
    for r in batches:
        assert r.prefill_s == prefill.iteration_time(r.batch)  # Eq. 1, exactly
        assert r.decode_s == (decode.iteration_time(r.running) if r.running else 0.0)
        assert r.end - r.start == pytest.approx(r.prefill_s + r.sync_fetch_s + r.decode_s, rel=1e-12)
    for r in stretches:
        assert r.running >= 1
        assert r.decode_s == decode.iteration_time(r.running)  # Eq. 2, exactly
        assert r.iterations * r.decode_s == pytest.approx(r.end - r.start, rel=1e-12)
        assert r.context_tokens >= r.running
    if name == "dynamo-like+pool":  # synchronous fetches: the batch waits for the load
        assert any(r.sync_fetch_s > 0 for r in batches)
    if name == "least-loaded":  # colocated: mixed iterations
        assert any(r.running > 0 for r in batches)


def test_simulated_records_carry_the_roofline_truth_with_context() -> None:
    records: list[Iteration] = []
    simulate("agentpool", records, truth="roofline")
    truth = GLM.roofline()
    batches = [r for r in records if r.batch]
    stretches = [r for r in records if not r.batch]
    assert batches and stretches
    for r in batches:
        assert r.prefill_s == truth.prefill_s(r.batch)
    for r in stretches:
        assert r.decode_s == pytest.approx(truth.decode_s(r.running, r.context_tokens), rel=1e-9)
    # the running requests' context grows the iteration time at equal batch sizes
    by_batch: dict[int, list[Iteration]] = {}
    for r in stretches:
        by_batch.setdefault(r.running, []).append(r)
    grows = [
        max(rs, key=lambda r: r.context_tokens).decode_s > min(rs, key=lambda r: r.context_tokens).decode_s
        for rs in by_batch.values()
        if max(r.context_tokens for r in rs) > min(r.context_tokens for r in rs)
    ]
    assert grows and all(grows)
