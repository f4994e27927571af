"""One simulated run of one system, and a comparison of several systems on the same workload."""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from agentpool.models import TtftSlo
from agentpool.node.timing import EquationTimes
from agentpool.sim.bounds import ClosedLoopBound, ReplayState, closed_loop_bound
from agentpool.sim.metrics import Metrics
from agentpool.sim.planners import PlannerSettings, attach
from agentpool.sim.presets import preset
from agentpool.sim.replay import ConversationSource, Replay, WorkloadPeriod, cycle
from agentpool.sim.simulator import SimConfig, Simulator
from agentpool.sim.synthetic import generator
from agentpool.sim.systems import STATIC_REFERENCE, PlannerKind, split_of, system
from agentpool.sim.trace import Conversation, cap_context, load_claude_code, load_mooncake

BUNDLED_TRACE = "claude-code-sample.jsonl.gz"
WORKLOADS = ("claude-code", "mooncake", "putnam", "osworld", "shifting")


def bundled_trace_path() -> Path:
    return Path(str(resources.files("agentpool.sim").joinpath(f"data/{BUNDLED_TRACE}")))


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything but the system: pool, node preset, workload, replay mode and timing."""

    workload: str = "claude-code"
    trace: str | None = None  # Claude Code trace path; None: the bundled sample
    conversations: int | None = None
    agents: int = 126
    arrival_per_min: float | None = None  # open loop when set
    max_agents: int = 258
    shared_prefix_tokens: int = 15000
    max_pause_s: float | None = None  # cap recorded pauses (None: as recorded)
    ramp_s: float = 0.0  # closed loop: start the agents evenly over this time instead of all at 0
    preset: str = "glm52-4xgb300"
    static_prefill_nodes: int | None = 4  # split of systems without a planner (None: sim.prefill_nodes)
    sim: SimConfig = field(default_factory=SimConfig)
    planner: PlannerSettings = field(default_factory=PlannerSettings)
    warmup_s: float = 1800.0
    duration_s: float = 3600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; known: {list(WORKLOADS)}")
        if self.duration_s <= 0 or self.warmup_s < 0 or self.agents < 0:
            raise ValueError("duration must be positive, warmup and agents non-negative")
        if self.workload == "mooncake" and self.trace is None:
            raise ValueError("the mooncake workload needs --trace (e.g. ../shared/traces/mooncake/...)")
        if self.sim.block_size <= 0 or self.sim.block_size % self.trace_block_tokens:
            raise ValueError(
                "the KV block size must be a positive multiple of the trace's "
                f"{self.trace_block_tokens} tokens, got {self.sim.block_size}"
            )

    @property
    def trace_block_tokens(self) -> int:
        """Tokens per block id of the workload's trace (Mooncake: 512, Claude Code and synthetic: 64)."""
        return 512 if self.workload == "mooncake" else 64


def _sources(sc: Scenario, conversations: Sequence[Conversation] | None) -> dict[str, ConversationSource]:
    if sc.workload == "mooncake":
        return {}
    if sc.workload == "claude-code":
        assert conversations is not None
        return {"claude-code": cycle(conversations, sc.seed)}
    if sc.workload in ("putnam", "osworld"):
        return {sc.workload: generator(sc.workload, sc.seed)}
    return {"putnam": generator("putnam", sc.seed), "osworld": generator("osworld", sc.seed + 1)}


def _periods(sc: Scenario) -> list[WorkloadPeriod]:
    if sc.workload != "shifting":
        return [WorkloadPeriod(0.0, {sc.workload: sc.agents})]
    third = sc.duration_s / 3.0
    n = sc.agents
    return [
        WorkloadPeriod(0.0, {"putnam": n}),
        WorkloadPeriod(sc.warmup_s + third, {"putnam": n // 2, "osworld": n // 4}),
        WorkloadPeriod(sc.warmup_s + 2 * third, {"osworld": n // 2}),
    ]


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the cyclic garbage collector less often, then restore its thresholds.

    A simulation allocates millions of short-lived objects (events, views, requests) and creates
    almost no reference cycles, so the default thresholds make the collector rescan the long-lived
    state (the KV index, the trace) many times for nothing: ~8-20% of a 64-node run's CPU time.
    Results do not depend on it (the simulator keeps no weak references and no finalizers)."""
    old = gc.get_threshold()
    gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def load_conversations(sc: Scenario) -> list[Conversation] | None:
    """The Claude Code conversations ``sc`` replays (:func:`load_trace_for`, without the count)."""
    return load_trace_for(sc)[0]


def load_trace_for(sc: Scenario) -> tuple[list[Conversation] | None, int]:
    """The Claude Code conversations ``sc`` replays, as its preset's model sees them, and how many
    trace requests that left out: a request longer than the model's context (or than a node's GPU
    KV) ends its agent's conversation there (:func:`~agentpool.sim.trace.cap_context`). ``None``
    for other workloads."""
    if sc.workload != "claude-code":
        return None, 0
    path = Path(sc.trace) if sc.trace else bundled_trace_path()
    return cap_context(load_claude_code(path, limit=sc.conversations), preset(sc.preset).max_request_tokens)


def run_system(
    name: str,
    sc: Scenario,
    conversations: Sequence[Conversation] | None = None,
    progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Run system ``name`` on scenario ``sc``; returns its summary, timelines and wall time."""
    cfg = system(name)
    pinned = split_of(name)
    if pinned is not None:
        sc = dataclasses.replace(sc, static_prefill_nodes=pinned)
    p = preset(sc.preset)
    if conversations is None:
        conversations = load_conversations(sc)
    metrics = Metrics(
        TtftSlo(sc.sim.slo_ttft_base_s, sc.sim.slo_ttft_per_token_s),
        sc.sim.slo_tpot_s,
        sc.warmup_s,
        sc.duration_s,
    )
    sim_cfg = sc.sim
    if cfg.planner is PlannerKind.NONE and sc.static_prefill_nodes is not None:
        if not 0 <= sc.static_prefill_nodes <= sim_cfg.nodes:
            raise ValueError(
                f"static prefill nodes {sc.static_prefill_nodes} not within 0..{sim_cfg.nodes} nodes"
            )
        sim_cfg = dataclasses.replace(sim_cfg, prefill_nodes=sc.static_prefill_nodes)
    sim = Simulator(cfg, p, sim_cfg, metrics, seed=sc.seed)
    trace_block = sc.trace_block_tokens
    replay = Replay(
        sim,
        _sources(sc, conversations),
        sc.shared_prefix_tokens // sc.sim.block_size,
        group=sc.sim.block_size // trace_block,
        max_pause_s=sc.max_pause_s,
    )
    end = sc.warmup_s + sc.duration_s
    if sc.workload == "mooncake":
        assert sc.trace is not None  # Scenario checks it
        replay.timed("mooncake", load_mooncake(sc.trace, limit=sc.conversations), end)
    elif sc.arrival_per_min is not None:
        replay.open_loop(sc.workload, sc.arrival_per_min, sc.max_agents, end, sc.seed)
    else:
        replay.closed_loop(_periods(sc), ramp_s=sc.ramp_s)
    attach(cfg.planner, sim, sc.planner)
    states: list[ReplayState] = []  # the replay at the window's start, for the run's bound
    if conversations is not None and _has_bound(sc, conversations):
        sim.call_at(sc.warmup_s, lambda now: states.append(replay.state(now)))
    if progress is not None:
        sim.every(60.0, 60.0, lambda now: progress(now / end))
    wall = time.perf_counter()
    with fewer_collections():
        sim.run(end)
    wall = time.perf_counter() - wall
    summary = metrics.summary()
    bound = scenario_bound(sc, conversations) if states else None
    if bound is not None and conversations is not None:
        summary["bound_rps"] = bound.for_run(states[0], _conversation_order(sc, conversations))
    return {
        "system": name,
        "description": cfg.description,
        "summary": summary,
        "split_timeline": [list(x) for x in metrics.split_timeline],
        "switches": metrics.switches,
        "planner_log": metrics.planner_log,
        "ttft_samples": metrics.ttfts(),
        "completed_per_minute": [metrics.per_minute.get(m, 0) for m in range(int(end // 60.0))],
        "requests_simulated": metrics.completed_total,
        "agents_started": replay.agents_started,
        "wall_s": wall,
        "sim_requests_per_wall_s": metrics.completed_total / wall if wall > 0 else 0.0,
    }


def scenario_dict(sc: Scenario) -> dict[str, Any]:
    return asdict(sc)


def scenario_bound(sc: Scenario, conversations: Sequence[Conversation] | None) -> ClosedLoopBound | None:
    """The analytic closed-loop bound of ``sc`` (:mod:`agentpool.sim.bounds`), where one applies:
    a closed loop over trace conversations (not open loop, Mooncake or synthetic periods)."""
    if conversations is None or not _has_bound(sc, conversations):
        return None
    p = preset(sc.preset)
    truth = p.roofline() if sc.sim.truth == "roofline" else EquationTimes(p.prefill_model(), p.decode_model())
    return closed_loop_bound(
        conversations,
        sc.agents,
        truth,
        p.truth.noise if sc.sim.noise is None else sc.sim.noise,
        t_acc=p.t_acc,
        shared_blocks=sc.shared_prefix_tokens // sc.sim.block_size,
        group=sc.sim.block_size // sc.trace_block_tokens,
        block=sc.sim.block_size,
        max_pause_s=sc.max_pause_s,
        order=_conversation_order(sc, conversations),
        window=(sc.warmup_s, sc.warmup_s + sc.duration_s),
        ramp_s=sc.ramp_s,
    )


def _has_bound(sc: Scenario, conversations: Sequence[Conversation] | None) -> bool:
    """A closed loop over trace conversations (not open loop, Mooncake or synthetic periods)."""
    return sc.workload == "claude-code" and sc.arrival_per_min is None and bool(conversations)


def _conversation_order(sc: Scenario, conversations: Sequence[Conversation]) -> Iterator[Conversation]:
    """The order in which the replay hands out ``conversations`` (the same seeded cycle)."""
    source = _sources(sc, conversations)["claude-code"]
    while True:
        yield source()


def reference_runs(names: Sequence[str], nodes: int) -> list[str]:
    """``names`` with ``static-reference`` swept over every split (1 .. nodes - 1 prefill nodes)."""
    out: list[str] = []
    for n in names:
        out.extend([f"{STATIC_REFERENCE}@{p}" for p in range(1, nodes)] if n == STATIC_REFERENCE else [n])
    return out


def best_reference(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sweep's runs folded into one result, the split with the highest throughput, in its
    place; the sweep's throughputs stay in its ``sweep``."""
    sweep = [r for r in results if r["system"].startswith(STATIC_REFERENCE + "@")]
    if not sweep:
        return list(results)
    best = dict(max(sweep, key=lambda r: (r["summary"]["throughput_rps"], r["system"])))
    best["sweep"] = {r["system"]: r["summary"]["throughput_rps"] for r in sweep}
    best["reference_split"] = best["system"].partition("@")[2]
    best["system"] = STATIC_REFERENCE
    out: list[dict[str, Any]] = []
    for r in results:
        if r in sweep:
            if r is sweep[0]:
                out.append(best)
        else:
            out.append(r)
    return out
