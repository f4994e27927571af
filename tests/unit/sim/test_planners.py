"""Baseline planners react to their signals; the evolving planner drives the pure planner core."""

from __future__ import annotations

import dataclasses

import pytest

from agentpool.models import OccupancySample, PrefillBatchItem, PrefillModel, RequestWorkRecord, TtftSlo, Work
from agentpool.models.refit import RefitPolicy
from agentpool.node import Iteration, Request, Role
from agentpool.router.policy import QueuedPrefill
from agentpool.sim.metrics import Metrics
from agentpool.sim.planners import ModelSource, OnlineFit, PlannerSettings, tick_for
from agentpool.sim.presets import preset
from agentpool.sim.run import Scenario, run_system
from agentpool.sim.simulator import SimConfig, Simulator
from agentpool.sim.systems import PlannerKind, system

GLM = preset("glm52-4xgb300")


def sim_of(name: str, prefill: int = 3, nodes: int = 6) -> Simulator:
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 1e6)
    return Simulator(system(name), GLM, SimConfig(nodes=nodes, prefill_nodes=prefill), metrics)


def switching_to(sim: Simulator) -> dict[str, Role]:
    return {sim.nodes[i].name: sw.to for i, sw in sim.switches.active.items()}


def tick(kind: PlannerKind, sim: Simulator) -> None:
    planned = tick_for(kind, sim, PlannerSettings(fit=ModelSource.PRESET))
    assert planned is not None
    planned[1](sim.now)


def test_dynamo_moves_a_prefill_node_to_decode_when_decode_kv_is_full() -> None:
    sim = sim_of("dynamo-like")
    tick(PlannerKind.DYNAMO, sim)
    assert switching_to(sim) == {}
    for n in sim.nodes[3:]:
        n.kv_used_tokens = int(0.95 * n.kv_capacity_tokens)
    tick(PlannerKind.DYNAMO, sim)
    assert list(switching_to(sim).values()) == [Role.DECODE]
    tick(PlannerKind.DYNAMO, sim)  # one relaunch at a time
    assert len(switching_to(sim)) == 1


def test_dynamo_moves_a_decode_node_to_prefill_when_prefill_queues_grow() -> None:
    sim = sim_of("dynamo-like")
    sim.queued[:3] = [QueuedPrefill(requests=5)] * 3
    tick(PlannerKind.DYNAMO, sim)
    assert list(switching_to(sim).values()) == [Role.PREFILL]


def test_arrow_counts_cached_prefixes_as_work() -> None:
    sim = sim_of("arrow-like")
    # three queued 100K-token requests, cached but for 512 tokens each: little real work (~0.1 s),
    # but predicted from the full length (3 x 5.6 s > the 12 s deadline) they ask for a prefill node
    for rid in range(3):
        sim.nodes[0].queue.append(Request(rid, 100_000, 10, [], [], "b", 0.0, cached_tokens=99_488))
    tick(PlannerKind.ARROW, sim)
    assert list(switching_to(sim).values()) == [Role.PREFILL]


def test_evolving_planner_switches_on_a_sustained_imbalance() -> None:
    sim = sim_of("agentpool", prefill=1, nodes=4)
    sim.now = 600.0
    # prefill-heavy work in every slice: long uncached prompts, short outputs, a busy decode side
    for i in range(600):
        sim.window.works.append(
            RequestWorkRecord(float(i), Work(t_uc=30_000.0, t_c=1000.0, t_out=50.0, t_acc=1.7))
        )
    sim.window.occupancy += [OccupancySample(float(t), 40.0) for t in range(0, 600, 5)]
    tick(PlannerKind.EVOLVING, sim)
    assert sim.metrics.planner_log[-1]["outcome"] == "switch"
    moving = switching_to(sim)
    assert moving and set(moving.values()) == {Role.PREFILL}
    assert all(sim.nodes[int(name[1:])].role is Role.DECODE for name in moving)


def test_evolving_planner_keeps_the_fewest_decode_nodes_it_is_given() -> None:
    """``PlannerSettings.min_decode`` (``spec.planner.minNodes.decode``) bounds the move above."""
    sim = sim_of("agentpool", prefill=1, nodes=4)
    sim.now = 600.0
    for i in range(600):
        sim.window.works.append(
            RequestWorkRecord(float(i), Work(t_uc=30_000.0, t_c=1000.0, t_out=50.0, t_acc=1.7))
        )
    sim.window.occupancy += [OccupancySample(float(t), 40.0) for t in range(0, 600, 5)]
    planned = tick_for(PlannerKind.EVOLVING, sim, PlannerSettings(fit=ModelSource.PRESET, min_decode=3))
    assert planned is not None
    planned[1](sim.now)
    assert sim.metrics.planner_log[-1]["outcome"] != "switch"
    assert switching_to(sim) == {}


def test_no_planner_for_static_systems() -> None:
    assert tick_for(PlannerKind.NONE, sim_of("static-cache-aware"), PlannerSettings()) is None


@pytest.mark.parametrize("name", ["agentpool", "oracle-reference"])
def test_window_planners_tolerate_an_empty_window(name: str) -> None:
    sim = sim_of(name)
    sim.now = 600.0
    kind = system(name).planner
    tick(kind, sim)
    assert switching_to(sim) == {}


def test_occupancy_counts_requests_in_flight_or_in_decode() -> None:
    from agentpool.sim.replay import Replay, WorkloadPeriod, cycle
    from agentpool.sim.run import bundled_trace_path
    from agentpool.sim.trace import load_claude_code

    convs = load_claude_code(bundled_trace_path(), limit=6)
    samples = {}
    for occupancy in ("inflight", "decode"):
        metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 1e6)
        sim = Simulator(
            system("static-cache-aware"),
            GLM,
            SimConfig(nodes=2, prefill_nodes=1, occupancy=occupancy),
            metrics,
        )
        Replay(sim, {"cc": cycle(convs)}, group=8).closed_loop([WorkloadPeriod(0.0, {"cc": 6})])
        sim.run(600.0)
        samples[occupancy] = [s.in_decode for s in sim.window.occupancy]
    # in flight includes the requests queued or running in prefill: never fewer than in decode
    assert all(a >= b for a, b in zip(samples["inflight"], samples["decode"], strict=True))
    assert sum(samples["inflight"]) > sum(samples["decode"])
    with pytest.raises(ValueError, match="occupancy"):
        SimConfig(occupancy="queued")


def _fitted_run(noise: float) -> tuple[dict[str, object], dict[str, object]]:
    settings = PlannerSettings(fit=ModelSource.ONLINE, fit_noise=noise, window_s=300.0)
    sc = Scenario(
        conversations=25,
        agents=25,
        warmup_s=300.0,
        duration_s=300.0,
        planner=settings,
        sim=SimConfig(truth="equations", noise=0.0),  # the truth is Eq. 1/2: the fit can recover it
    )
    r = run_system("agentpool", sc)
    log = r["planner_log"]
    assert isinstance(log, list)
    return log[0], r


@pytest.mark.parametrize(("noise", "tolerance"), [(0.0, 1e-6), (0.05, 0.15)])
def test_online_fit_recovers_the_preset_coefficients(noise: float, tolerance: float) -> None:
    first, r = _fitted_run(noise)
    assert first["outcome"] == "fit" and str(first["reason"]).startswith("fitted online per node")
    per_node = first["per_node"]
    assert isinstance(per_node, list) and len(per_node) == 9
    for entry in per_node:  # every node fitted; prefill nodes on their own records
        own = entry["node"] in {"n0", "n1", "n2", "n3", "n4", "n5"}
        assert entry["prefill_records"] == ("own" if own else "all nodes"), entry
        assert entry["prefill_mean"] < 0.05 + tolerance
        values = dict(part.split("=") for part in str(entry["prefill"]).split())
        # the prefill terms the trace exercises
        for name, true in (("c0", GLM.prefill.c0), ("c1", GLM.prefill.c1), ("c2", GLM.prefill.c2)):
            assert float(values[name]) == pytest.approx(true, rel=tolerance), (entry["node"], name)
    assert r["requests_simulated"] > 100
    summary = r["summary"]
    assert isinstance(summary, dict) and summary["fit_error"]["nodes"] == 9


def test_online_fit_waits_for_enough_iterations() -> None:
    sim = sim_of("agentpool")
    sim.now = 600.0
    planned = tick_for(PlannerKind.EVOLVING, sim, PlannerSettings(fit=ModelSource.ONLINE))
    assert planned is not None
    planned[1](sim.now)
    assert sim.metrics.planner_log[-1]["outcome"] == "fit"
    assert "not enough iterations" in str(sim.metrics.planner_log[-1]["reason"])
    assert sim.models[0].prefill == GLM.prefill_model()  # nothing replaced, nothing planned
    assert len(sim.metrics.planner_log) == 1


def test_online_fit_gives_every_node_the_fitted_models_and_stops_recording() -> None:
    sim = sim_of("agentpool")
    fit = OnlineFit(sim, noise=0.0, seed=0)
    assert all(n.on_iteration == fit.record for n in sim.nodes)
    p, d = GLM.prefill_model(), GLM.decode_model()
    for k in range(1, 40):  # prefill batches of growing size and prefix, decode stretches of growing B
        batch = (PrefillBatchItem(t_uc=500.0 * k, t_c=300.0 * (k % 7), t_rst=100.0 * (k % 3)),)
        t = p.iteration_time(list(batch))
        fit.record(Iteration("n0", float(k), k + t, batch, t, 0.0, 0, 0.0, 1.0, 0.0))
        # n1 is 30% slower: a node of its own, fitted on its own records
        fit.record(Iteration("n1", float(k), k + 1.3 * t, batch, 1.3 * t, 0.0, 0, 0.0, 1.0, 0.0))
        dt = d.iteration_time(k)
        fit.record(Iteration("n5", float(k), k + 3 * dt, (), 0.0, 0.0, k, dt, 3.0, 0.0))
    fitted = fit.try_fit()
    assert not isinstance(fitted, str) and fit.done
    by_node = {f.node: f for f, _ in fitted}
    assert sorted(by_node) == sorted(n.name for n in sim.nodes)
    for n in sim.nodes:  # every node, prefill and decode alike, now plans and routes with its fit
        f = by_node[n.name]
        assert sim.models[n.index].prefill == f.prefill.model and sim.models[n.index].decode == f.decode.model
        assert f.prefill_own == (n.name in ("n0", "n1")) and f.decode_own == (n.name == "n5")
    assert by_node["n0"].prefill.model.c1 == pytest.approx(GLM.prefill.c1, rel=1e-6)
    # n1's restore term is a tiny share of these records: it keeps the prior's (n1 is 30% slower than the
    # prior there), and c1 absorbs the difference, a few parts per million of it
    assert by_node["n1"].prefill.report.terms_from_prior == 1
    assert by_node["n1"].prefill.model.c3 == GLM.prefill.c3
    assert by_node["n1"].prefill.model.c1 == pytest.approx(1.3 * GLM.prefill.c1, rel=1e-4)
    # a node that never prefilled gets the fit of every node's prefill records: between the two
    pooled = by_node["n3"].prefill.model.c1
    assert GLM.prefill.c1 < pooled < 1.3 * GLM.prefill.c1
    assert by_node["n0"].decode.model == by_node["n5"].decode.model  # n5's records are all there are
    assert by_node["n5"].decode.model.d2 == pytest.approx(GLM.decode.d2, rel=1e-6)
    assert all(n.on_iteration is None for n in sim.nodes)
    assert fit.refit() == []  # without a refit policy the models stay frozen


def test_online_fit_with_a_refit_policy_refits_when_the_work_leaves_the_fitted_range() -> None:
    """The simulator's agentpool planner runs the live planner's refit (agentpool.models.refit)."""
    sim = sim_of("agentpool")
    fit = OnlineFit(sim, noise=0.0, seed=0, refit=RefitPolicy())
    p, d = GLM.prefill_model(), GLM.decode_model()
    slower = dataclasses.replace(p, c1=1.5 * p.c1)  # full chunks cost more per token than short ones

    def prefill(node: str, k: int, t_uc: float, model: PrefillModel) -> None:
        batch = (PrefillBatchItem(t_uc=t_uc, t_c=1000.0 * (k % 5)),)
        t = model.iteration_time(list(batch))
        fit.record(Iteration(node, float(k), k + t, batch, t, 0.0, 0, 0.0, 1.0, 0.0))

    for k in range(1, 40):  # a warmup of short batches
        prefill("n0", k, 50.0 * k, p)
        dt = d.iteration_time(k)
        fit.record(Iteration("n5", float(k), k + 3 * dt, (), 0.0, 0.0, k, dt, 3.0, 0.0))
    assert not isinstance(fit.try_fit(), str)
    assert all(n.on_iteration == fit.record for n in sim.nodes)  # still recording
    assert fit.refit() == []  # an empty window
    for k in range(40, 80):  # a window of full 8K chunks
        prefill("n0", k, 8000.0, slower)
    refitted = fit.refit()
    assert sorted(r.node for r, _ in refitted) == sorted(n.name for n in sim.nodes)  # n0's records for all
    chunk = [PrefillBatchItem(t_uc=8000.0, t_c=2000.0)]
    assert p.iteration_time(chunk) < 0.7 * slower.iteration_time(chunk)  # the warmup's fit: 31% short
    for n in sim.nodes:  # one Eq. 1 for both regimes: within the refit's 10% on the new one
        assert sim.models[n.index].prefill.iteration_time(chunk) == pytest.approx(
            slower.iteration_time(chunk), rel=0.10
        )
    for k in range(80, 120):  # the same work again: now in range
        prefill("n0", k, 8000.0, slower)
    assert fit.refit() == []
