"""End-to-end properties of the simulator: Eq. 1-4 exactness, oracle, determinism, switches, replay."""

from __future__ import annotations

import dataclasses
import gc
import itertools
import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from agentpool.models import NodeModel, PrefillBatchItem, TtftSlo, Work
from agentpool.node import NodeStatus, Request, Role
from agentpool.router.policy import NodeState, PolicyContext, RequestView, RouteDecision
from agentpool.sim.metrics import Metrics
from agentpool.sim.presets import preset
from agentpool.sim.replay import Replay, WorkloadPeriod, cycle
from agentpool.sim.run import Scenario, fewer_collections, load_conversations, run_system
from agentpool.sim.simulator import Issue, SimConfig, Simulator
from agentpool.sim.systems import system
from agentpool.sim.trace import Conversation, TraceRequest

GLM = preset("glm52-4xgb300")


def one_request(inp: int, out: int) -> Conversation:
    r = TraceRequest(0, 1, inp, out, np.arange(1, inp // 64 + 1), np.zeros(0, dtype=np.int64), -1, 0.0)
    return Conversation.build("single", [r], 64)


def single_run(system_name: str, nodes: int, prefill_nodes: int, inp: int, out: int) -> tuple[float, float]:
    """(TTFT, E2E) of the first request of a one-agent closed loop on an otherwise empty pool."""
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    cfg = SimConfig(nodes=nodes, prefill_nodes=prefill_nodes, block_size=64, truth="equations", noise=0.0)
    sim = Simulator(system(system_name), GLM, cfg, metrics)
    replay = Replay(sim, {"w": cycle([one_request(inp, out)])})
    replay.closed_loop([WorkloadPeriod(0.0, {"w": 1})])
    sim.run(1000.0)
    first = metrics.rows[0]
    return first[5], first[7]


def test_single_request_on_a_colocated_node_matches_eq_1_to_4() -> None:
    inp, out = 5000, 1 + 17  # 17 decode tokens at t_acc 1.7 = 10 iterations
    ttft, e2e = single_run("least-loaded", 1, 0, inp, out)
    prefill = GLM.prefill_model()
    decode = GLM.decode_model()
    assert ttft == pytest.approx(prefill.iteration_time([PrefillBatchItem(t_uc=inp)]), rel=1e-12)  # Eq. 1
    # Eq. 3 with the node's own t_bar (one request per iteration) and nothing restored
    model = NodeModel(prefill, decode, t_bar=float(inp), f_restore=0.0)
    assert ttft == pytest.approx(model.prefill_request_time(Work(t_uc=inp)), rel=1e-12)
    # Eq. 2 and Eq. 4 at B = 1
    assert e2e - ttft == pytest.approx(10 * decode.iteration_time(1), rel=1e-9)
    assert e2e - ttft == pytest.approx(
        decode.request_time(Work(t_uc=inp, t_out=out - 1, t_acc=GLM.t_acc), batch=1), rel=1e-9
    )


def test_single_request_disaggregated_adds_the_kv_handover() -> None:
    inp, out = 5000, 1 + 17
    ttft, e2e = single_run("static-cache-aware", 2, 1, inp, out)
    prefill, decode = GLM.prefill_model(), GLM.decode_model()
    assert ttft == pytest.approx(prefill.iteration_time([PrefillBatchItem(t_uc=inp)]), rel=1e-12)
    assert e2e - ttft == pytest.approx(GLM.handover_s(inp) + 10 * decode.iteration_time(1), rel=1e-9)


SMALL = Scenario(conversations=25, agents=25, warmup_s=120.0, duration_s=900.0)


@cache
def small(name: str, seed: int = 0) -> dict[str, object]:
    sc = dataclasses.replace(SMALL, seed=seed)
    return run_system(name, sc, _conversations())


@cache
def _conversations() -> tuple[Conversation, ...]:
    convs = load_conversations(SMALL)
    assert convs is not None
    return tuple(convs)


def summary(name: str) -> dict[str, float]:
    s = small(name)["summary"]
    assert isinstance(s, dict)
    return s


def test_oracle_loses_no_kv_reuse_and_baselines_do() -> None:
    oracle = summary("oracle-reference")
    assert oracle["requests"] > 200
    assert oracle["ideal_hit_rate"] > 0.8
    assert oracle["lost_kv_reuse"] == pytest.approx(0.0, abs=1e-12)
    assert oracle["hit_rate"] == pytest.approx(oracle["ideal_hit_rate"], abs=1e-12)
    # arrow-like strands KV at switches and routes without looking at the cache: it must lose reuse
    assert summary("arrow-like")["lost_kv_reuse"] > 0.01


def test_same_seed_gives_identical_results() -> None:
    a = small("agentpool")
    b = run_system("agentpool", SMALL, _conversations())
    for key in ("summary", "split_timeline", "switches", "ttft_samples", "requests_simulated"):
        assert a[key] == b[key], key


def test_seed_changes_synthetic_workloads_but_not_their_replays() -> None:
    sc = Scenario(
        workload="putnam", agents=10, warmup_s=0.0, duration_s=300.0, sim=SimConfig(prefill_nodes=3)
    )
    a = run_system("static-cache-aware", sc)
    b = run_system("static-cache-aware", sc)
    c = run_system("static-cache-aware", dataclasses.replace(sc, seed=1))
    assert a["summary"] == b["summary"]
    assert a["summary"] != c["summary"]
    # each step extends the agent's context: nearly every prompt token was computed before
    assert a["summary"]["ideal_hit_rate"] > 0.8


def _loaded_sim(system_name: str) -> Simulator:
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    sim = Simulator(system(system_name), GLM, SimConfig(nodes=4, prefill_nodes=2), metrics)
    replay = Replay(sim, {"cc": cycle(list(_conversations()))}, group=8)
    replay.closed_loop([WorkloadPeriod(0.0, {"cc": 8})])
    sim.run(300.0)
    return sim


@pytest.mark.parametrize(
    ("system_name", "keeps_kv", "downtime"),
    [("agentpool", True, GLM.switch_in_place_s), ("dynamo-like", False, GLM.relaunch_s)],
)
def test_switch_modes(system_name: str, keeps_kv: bool, downtime: float) -> None:
    def switched(until: float) -> Simulator:
        sim = _loaded_sim(system_name)
        assert sim.nodes[0].role is Role.PREFILL
        assert sim.directory.index.node_block_count("n0") > 0
        sim.begin_switch(0, Role.DECODE)
        sim.run(until)
        return sim

    sim = switched(300.0 + downtime + 60.0)
    assert sim.nodes[0].role is Role.DECODE and sim.nodes[0].status is NodeStatus.SERVING
    sw = next(s for s in sim.metrics.switches if s["node"] == "n0")
    assert sw["downtime_s"] == pytest.approx(downtime)
    # the same (deterministic) run, stopped just after the node drained: is its KV still there?
    at_drain = switched(float(sw["drained_at"]) + 1e-6)
    assert at_drain.nodes[0].status is NodeStatus.DOWN
    assert (at_drain.directory.index.node_block_count("n0") > 0) is keeps_kv


def test_requests_of_one_agent_name_a_block_by_one_int_object() -> None:
    """The replay hands every request of an instance the same int object for a block (the KV
    tables then match it by identity): a later turn's prompt starts with the very objects of the
    earlier turn's prompt and output."""
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    sim = Simulator(system("agentpool"), GLM, SimConfig(nodes=3, prefill_nodes=1), metrics)
    issued: list[Issue] = []
    issue_at = sim.issue_at
    sim.issue_at = lambda at, issue: (issued.append(issue), issue_at(at, issue))[1]  # type: ignore[method-assign]
    replay = Replay(sim, {"cc": cycle(list(_conversations())[:3])}, group=8)
    replay.closed_loop([WorkloadPeriod(0.0, {"cc": 2})])
    sim.run(600.0)
    by_branch: dict[str, list[Request]] = {}
    for issue in issued:
        by_branch.setdefault(issue.req.branch, []).append(issue.req)
    shared = 0
    for reqs in by_branch.values():
        for a, b in itertools.pairwise(reqs):
            n = min(len(a.blocks), len(b.blocks))
            if n and a.blocks[:n] == b.blocks[:n]:
                assert all(x is y for x, y in zip(a.blocks[:n], b.blocks[:n], strict=True))
                shared += n
    assert shared > 0  # the sample's agents do continue their prompts


def test_closed_loop_keeps_the_concurrency_and_open_loop_admits_at_most_max_agents() -> None:
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    sim = Simulator(system("static-cache-aware"), GLM, SimConfig(nodes=3, prefill_nodes=1), metrics)
    replay = Replay(sim, {"cc": cycle(list(_conversations())[:5])}, group=8)
    replay.closed_loop([WorkloadPeriod(0.0, {"cc": 4})])
    sim.run(2000.0)
    assert replay.active["cc"] == 4
    assert replay.agents_finished >= 1  # finished conversations were replaced
    assert replay.agents_started == 4 + replay.agents_finished

    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    sim = Simulator(system("static-cache-aware"), GLM, SimConfig(nodes=3, prefill_nodes=1), metrics)
    replay = Replay(sim, {"cc": cycle(list(_conversations()))}, group=8)
    replay.open_loop("cc", agents_per_min=6.0, max_agents=3, until_s=600.0, seed=0)
    sim.run(600.0)
    assert sum(replay.active.values()) <= 3
    assert replay.agents_started == 3 + replay.agents_finished


def test_colocated_node_waits_for_kv_room_before_decoding() -> None:
    small_kv = GLM.model_copy(update={"gpu_kv_tokens": 8000})  # room for one 5000+18-token request
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    sim = Simulator(
        system("least-loaded"), small_kv, SimConfig(nodes=1, prefill_nodes=0, block_size=64), metrics
    )
    done: list[tuple[float, float, float]] = []
    record = metrics.done

    def spy(req: Request) -> None:
        done.append((req.first_token_at, req.decode_start, req.done_at))
        record(req)

    metrics.done = spy  # type: ignore[method-assign]
    replay = Replay(sim, {"w": cycle([one_request(5000, 18)])})
    replay.closed_loop([WorkloadPeriod(0.0, {"w": 2})])
    sim.run(5.0)
    (f1, d1, e1), (f2, d2, _) = done[:2]
    assert d1 == f1  # the first decodes as soon as its prefill ends
    assert f2 < e1 and d2 == pytest.approx(e1)  # the second waits for the first to free its KV


def test_a_request_no_node_can_hold_is_refused_not_left_waiting() -> None:
    """A prompt larger than a node's GPU KV would wait for room forever and stall its node (the Claude
    Code trace reaches 880K tokens, the H200 preset holds 700K): the simulator refuses to send it."""
    small_kv = GLM.model_copy(update={"gpu_kv_tokens": 8000})
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    sim = Simulator(
        system("least-loaded"), small_kv, SimConfig(nodes=1, prefill_nodes=0, block_size=64), metrics
    )
    replay = Replay(sim, {"w": cycle([one_request(7990, 18)])})  # 8,008 tokens of KV
    with pytest.raises(ValueError, match="more than a node holds"):
        replay.closed_loop([WorkloadPeriod(0.0, {"w": 1})])
        sim.run(5.0)


def test_colocated_views_count_the_kv_of_prefilled_requests_waiting_for_room() -> None:
    small_kv = GLM.model_copy(update={"gpu_kv_tokens": 8000})  # room for one 5000+18-token request
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    sim = Simulator(system("smetric"), small_kv, SimConfig(nodes=1, prefill_nodes=0, block_size=64), metrics)
    seen: list[tuple[float, int]] = []
    choose = sim.policy.choose

    def spy(request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext) -> RouteDecision:
        seen.extend((sim.now, n.decode_waiting_tokens) for n in candidates)
        return choose(request, candidates, ctx)

    sim.policy.choose = spy  # type: ignore[method-assign]
    replay = Replay(sim, {"w": cycle([one_request(5000, 18)])})
    replay.closed_loop([WorkloadPeriod(0.0, {"w": 3})])
    sim.run(5.0)
    # the third agent's first request is routed after the second is prefilled and waiting
    assert (0.0, 0) in seen and any(w == 5018 for _, w in seen)
    assert metrics.completed_total >= 3


def test_mooncake_requests_arrive_at_their_times_and_share_prefixes(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0, "input_length": 2048, "output_length": 5, "hash_ids": [1, 2, 3, 4]},
        {"timestamp": 10_000, "input_length": 2600, "output_length": 5, "hash_ids": [1, 2, 3, 4, 5]},
        {"timestamp": 20_000, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8]},
    ]
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    sc = Scenario(
        workload="mooncake",
        trace=str(p),
        warmup_s=0.0,
        duration_s=60.0,
        shared_prefix_tokens=0,
        sim=SimConfig(nodes=2, prefill_nodes=1),
        static_prefill_nodes=None,
    )
    r = run_system("static-cache-aware", sc)
    s = r["summary"]
    assert s["requests"] == 3
    # the second request reuses the first's four 512-token blocks; the others reuse nothing
    assert s["hit_rate"] == pytest.approx(4 * 512 / (2048 + 2600 + 1100))


def test_closed_loop_ramp_starts_agents_evenly() -> None:
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    sim = Simulator(system("static-cache-aware"), GLM, SimConfig(nodes=3, prefill_nodes=1), metrics)
    replay = Replay(sim, {"cc": cycle(list(_conversations()))}, group=8)
    replay.closed_loop([WorkloadPeriod(0.0, {"cc": 4})], ramp_s=100.0)
    sim.run(50.0)  # agents start at 0, 25, 50, 75 s
    assert replay.agents_started == 2
    sim.run(80.0)
    assert replay.agents_started == 4


def test_session_id_system_sticks_sessions_and_keeps_more_reuse_than_least_loaded() -> None:
    # the router sees the branch id only for this colocated system (no branch-count eviction)
    assert system("session-id").router_sees_branch and not system("least-loaded").router_sees_branch
    sticky, spread = summary("session-id"), summary("least-loaded")
    assert sticky["requests"] > 0 and spread["fetched_tokens_per_request"] > 1_000
    # every follow-up finds its session's KV on its own node: (almost) nothing read from peers
    assert sticky["fetched_tokens_per_request"] < 0.01 * spread["fetched_tokens_per_request"]
    # ... at the price of balance, which is what SMetric's migration addresses
    assert sticky["prefill_imbalance"] > spread["prefill_imbalance"]


def test_fewer_collections_restores_the_gc_thresholds_even_on_error() -> None:
    before = gc.get_threshold()
    with fewer_collections():
        assert gc.get_threshold() != before
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before


def test_prefilled_requests_wait_for_decode_room_and_smaller_ones_overtake() -> None:
    # one decode node with room for 8000 KV tokens; A decodes long, B and C finish prefill together
    small_kv = GLM.model_copy(update={"gpu_kv_tokens": 8000})
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    cfg = SimConfig(nodes=2, prefill_nodes=1, block_size=64)
    sim = Simulator(
        dataclasses.replace(system("static-cache-aware"), decode_binding=None), small_kv, cfg, metrics
    )
    times = _three_requests(sim)
    (_, _, a_done), (b_first, b_start, _), (c_first, c_start, _) = times[5000], times[5500], times[1500]
    assert b_first == c_first < a_done  # B and C are prefilled while A decodes (6000 of 8000 used)
    assert c_start == pytest.approx(c_first + small_kv.handover_s(1500))  # C fits next to A: binds at once
    assert b_start == pytest.approx(a_done + small_kv.handover_s(5500))  # B waits for A's KV, in order


def _three_requests(sim: Simulator) -> dict[int, tuple[float, float, float]]:
    """A (5000 in, 1000 out), B (5500, 18), C (1500, 18) issued at 0; input tokens -> (first token,
    decode start, done)."""
    times: dict[int, tuple[float, float, float]] = {}

    def done(r: Request, _now: float) -> None:
        times[r.input_tokens] = (r.first_token_at, r.decode_start, r.done_at)

    for n, (inp, out) in enumerate([(5000, 1000), (5500, 18), (1500, 18)]):  # A, B, C
        blocks = [b + 1000 * n for b in one_request(inp, out).block_keys(0, n + 1, 0)[0]]
        sim.issue_at(0.0, Issue(Request(n + 1, inp, out, blocks, [], f"b{n}", 0.0), 1, inp, True, done))
    sim.run(1000.0)
    return times


def test_sglang_dispatch_binding_holds_a_request_before_prefill_until_decode_room_frees() -> None:
    # the same three requests under SGLang PD: A and C reserve decode KV when dispatched (7000 of
    # 8000); B finds no room and waits before the prefill queue until A's KV is released
    small_kv = GLM.model_copy(update={"gpu_kv_tokens": 8000})
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    sim = Simulator(
        system("static-cache-aware"), small_kv, SimConfig(nodes=2, prefill_nodes=1, block_size=64), metrics
    )
    times = _three_requests(sim)
    (_, _, a_done), (b_first, _, _), (c_first, _, _) = times[5000], times[5500], times[1500]
    assert c_first < a_done < b_first  # B's prefill waited for A to finish decoding


@pytest.mark.parametrize("binding", ["prefill-end", "prefill-start", "dispatch"])
def test_decode_binding_time(binding: str) -> None:
    # 1 prefill + 2 decode nodes; A's prefill takes the first iteration, B's the second
    metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
    cfg = SimConfig(nodes=3, prefill_nodes=1, block_size=64, decode_binding=binding)
    sim = Simulator(dataclasses.replace(system("static-cache-aware"), decode_binding=None), GLM, cfg, metrics)
    reqs = []
    for n, inp in enumerate([8192, 4000]):
        blocks = [b + 1000 * n for b in one_request(inp, 50).block_keys(0, n + 1, 0)[0]]
        reqs.append(Request(n + 1, inp, 50, blocks, [], f"b{n}", 0.0))
        sim.issue_at(0.0, Issue(reqs[-1], 1, inp, True, lambda _r, _now: None))
    a, b = reqs
    sim.run(0.01)  # A's prefill runs, B waits in the prefill queue
    assert a.prefill_start == 0.0 and a.first_token_at < 0 and b.prefill_start < 0
    assert (a.decode_node >= 0) is (binding != "prefill-end")
    assert (b.decode_node >= 0) is (binding == "dispatch")  # B reserved while it queues for prefill
    bound = {"prefill-end": 0, "prefill-start": 1, "dispatch": 2}[binding]
    assert sum(n.bound_waiting for n in sim.nodes) == bound
    sim.run(1000.0)
    for r in reqs:  # the hand-over starts at the first token either way
        assert r.decode_start == pytest.approx(r.first_token_at + GLM.handover_s(r.input_tokens))
    assert a.decode_node != b.decode_node  # A's binding counts as running when B binds
    assert all(n.bound_waiting == 0 for n in sim.nodes)


def test_unknown_decode_binding_is_rejected() -> None:
    with pytest.raises(ValueError, match="decode_binding"):
        SimConfig(decode_binding="arrival")


@pytest.mark.parametrize("system_name", ["dynamo-like", "agentpool"])  # relaunch, in place
def test_a_decode_node_drains_only_after_the_kv_on_its_way_has_arrived(system_name: str) -> None:
    """A switch decided while a prefilled request's KV travels to the decode node waits for it: the
    request decodes there, and only then does the node go down (a relaunch would otherwise reset the
    node's KV accounting under the arriving request)."""

    def make() -> tuple[Simulator, Request]:
        metrics = Metrics(TtftSlo(2.0, 1e-4), 0.1, 0.0, 10_000.0)
        sim = Simulator(system(system_name), GLM, SimConfig(nodes=2, prefill_nodes=1, block_size=64), metrics)
        req = Request(1, 4000, 50, one_request(4000, 50).block_keys(0, 1, 0)[0], [], "b", 0.0)
        sim.issue_at(0.0, Issue(req, 1, 4000, True, lambda _r, _now: None))
        return sim, req

    dry, dry_req = make()
    dry.run(100.0)
    handover = GLM.handover_s(4000)
    sim, req = make()
    sim.run(dry_req.first_token_at + handover / 2)  # prefilled, KV on its way to n1
    assert req.first_token_at == dry_req.first_token_at and req.decode_start < 0
    assert sim.nodes[1].joining == 1
    sim.begin_switch(1, Role.PREFILL)
    assert sim.nodes[1].status is NodeStatus.DRAINING
    sim.run(2000.0)
    assert req.decode_start == pytest.approx(req.first_token_at + handover)
    assert req.decode_node == 1 and req.done_at > 0
    (switch,) = sim.metrics.switches
    assert switch["drained_at"] >= req.done_at
    assert sim.nodes[1].kv_used_tokens == 0 and sim.nodes[1].joining == 0
    assert sim.nodes[1].role is Role.PREFILL
