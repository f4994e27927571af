"""Split planners the simulator runs: agentpool's (the pure planner core) and the baselines'.

- ``evolving``: :func:`agentpool.planner.core.plan` every window (Eq. 5, Eq. 6 gain test, cooldown
  counted from when the last switch completed and the slices within it left out, no switch while a
  node drains), on the window's slices of average work and decode occupancy, with
  each prefill node's ``t_bar`` and ``f_n`` remeasured from its iterations. Where its coefficients
  come from is ``PlannerSettings.fit``: ``online`` (default) fits Eq. 1 and Eq. 2 by the same NNLS
  as the live planner (:func:`agentpool.models.fitting.fit_prefill` / ``fit_decode``) on the
  iterations the nodes ran in the first window, as the ground truth timed them (noise included;
  ``fit_noise`` adds more), and from then on the planner and the router use the fitted models;
  until then they use the preset's Eq. 1/2 coefficients (the paper's fit) as a prior. After the
  fit, every window first runs the live planner's refit check (:mod:`agentpool.models.refit`): a
  node whose window iterations leave the range its models were fitted on, and which they
  mispredict, is refitted (logged as a ``refit`` entry of the planner log; ``PlannerSettings.refit``
  False keeps the fit frozen, as the paper does). ``preset`` keeps that prior throughout.
  Neither is the truth: the simulated nodes run on the preset's roofline model
  (:mod:`agentpool.node.roofline`), and the planner log reports the fitted models' error against
  it (:mod:`agentpool.sim.fiterror`), per node. As the live planner does, each node is fitted on
  its own records (:class:`OnlineFit`); the simulated pool starts disaggregated, so a phase a node
  never ran is fitted on every node's records of that phase. A window whose records
  cannot be fitted is logged and the next window tries again with more records.

  What ``q̄`` counts (``SimConfig.occupancy``). Read literally ("requests in decode"), ``q̄`` makes
  ``sum mu_D`` the *observed* decode throughput, which can never exceed the prefill capacity in a
  closed loop: when prefill saturates, requests wait in prefill queues, decode occupancy falls, and
  Eq. 5 still reports decode as the bottleneck, so the planner never adds prefill nodes (measured:
  stuck at 1P8D with 12 s mean TTFT in the OSWorld period of the shifting run). The default counts
  the requests in flight (routed, not finished): the decode demand if prefill kept up. With it the
  planner converges to 4P5D on CC with 126 agents, as the paper reports; ``"decode"`` keeps the
  literal reading.
- ``dynamo``: Dynamo's load-based planner on a fixed pool (:mod:`agentpool.sim.dynamo`): interval
  means of the prefill queue and the decode KV load against Dynamo's scale-down and scale-up
  thresholds, scale-downs first, a full budget (only a node freed by a scale-down moves, into the
  other phase), one relaunch at a time, a grace period after adding decode.
- ``arrow``: Arrow-like, TTFT-driven: predicts each prefill node's TTFT from the *full* input
  length of its queued requests (cached prefixes counted as work) and reacts at once: a predicted
  TTFT above the deadline moves a decode node to prefill; a TTFT far below it while decode
  iterations approach the TPOT limit moves one back. This is Arrow as evolving-infra §3 reimplements
  it (on the symmetric engines, in-place switches that strand the node's KV, TTFT from full input
  lengths, reacting to bursts). Where it differs from Arrow's own paper (arXiv 2505.11916; only its
  abstract was available to check against): the checks run every ``arrow_interval_s`` (30 s), not
  on every request arrival; the node that moves is the one with the fewest running decodes or the
  shortest queue, with no wait for it to go idle beyond the drain; requests are routed to the
  shortest prefill queue in requests (``least-loaded``), not to the least predicted TTFT; and
  Arrow's stateless instances, which may finish their running decodes while already taking
  prefills, are modelled as a drain before the switch.
- ``oracle``: the split with the best Eq. 5 throughput for each window's measured work, applied at
  once with free switches (the ``oracle-reference`` system, with an unlimited shared cache). A
  reference, not a bound: it uses the past window's work and Eq. 5's proxy; the bound is
  :mod:`agentpool.sim.bounds`, the hindsight reference the ``static-reference`` sweep.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from agentpool.models import (
    DecodeIterationRecord,
    IterationRecord,
    MoeShape,
    PrefillBatchItem,
    PrefillIterationRecord,
    WorkSlice,
    mean_work,
    measure_prefill_window,
    slice_window,
    with_window_stats,
)
from agentpool.models.fitting import NodeFit, fit_nodes
from agentpool.models.refit import NodeRecords, NodeRefit, RefitPolicy, refit_nodes
from agentpool.models.synthetic import noisy
from agentpool.node import Iteration, IterationHook, Node, NodeStatus, Role
from agentpool.planner.core import (
    LastSwitch,
    Outcome,
    PlannerInput,
    PlannerNode,
    PlannerPolicy,
    plan,
    split_throughput,
)
from agentpool.sim.dynamo import DynamoLoadPlanner, DynamoSettings
from agentpool.sim.fiterror import FitError, fit_error
from agentpool.sim.simulator import Simulator
from agentpool.sim.systems import PlannerKind

Tick = Callable[[float], None]


class ModelSource(enum.StrEnum):
    PRESET = "preset"  # the planner and the router keep the preset's Eq. 1/2 coefficients
    ONLINE = "online"  # fitted from the first window's iteration times


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    fit: ModelSource = ModelSource.ONLINE
    fit_noise: float = 0.0  # extra relative noise on recorded times (the truth has its own)
    fit_seed: int = 0
    refit: bool = True  # refit a node's models when a window's work leaves their fitted range
    refit_policy: RefitPolicy = field(default_factory=RefitPolicy)
    window_s: float = 600.0
    slices: int = 10
    cooldown_s: float = 120.0
    min_relative_gain: float = 0.03  # PlannerPolicy.min_relative_gain (0: the paper's test alone)
    min_prefill: int = 1  # the fewest nodes the evolving planner leaves in each phase (PlannerPolicy)
    min_decode: int = 1
    # Dynamo's load planner defaults (agentpool.sim.dynamo)
    dynamo: DynamoSettings = field(default_factory=DynamoSettings)
    arrow_interval_s: float = 30.0
    arrow_low: float = 0.2
    arrow_tpot_fraction: float = 0.9


def tick_for(kind: PlannerKind, sim: Simulator, settings: PlannerSettings) -> tuple[float, Tick] | None:
    """``kind``'s decision function on ``sim`` and how often it runs (None for ``none``)."""
    if kind is PlannerKind.NONE:
        return None
    if kind is PlannerKind.EVOLVING:
        return settings.window_s, _evolving(sim, settings)
    if kind is PlannerKind.ORACLE:
        return settings.window_s, _oracle(sim, settings)
    if kind is PlannerKind.DYNAMO:
        return settings.dynamo.interval_s, _dynamo(sim, settings)
    return settings.arrow_interval_s, _arrow(sim, settings)


def attach(kind: PlannerKind, sim: Simulator, settings: PlannerSettings) -> None:
    """Schedule ``kind``'s periodic decisions on ``sim`` (nothing for ``none``)."""
    planned = tick_for(kind, sim, settings)
    if planned is not None:
        interval, tick = planned
        sim.every(interval, interval, tick)


def _remeasure(sim: Simulator) -> None:
    """Each node's ``t_bar`` and ``f_n`` from its prefill iterations since the last window."""
    for node in sim.nodes:
        batches = sim.window.iterations.pop(node.index, [])
        sim.set_model(node.index, with_window_stats(sim.models[node.index], measure_prefill_window(batches)))


def _window_slices(sim: Simulator, start: float, end: float, m: int) -> tuple[WorkSlice, ...]:
    w = sim.window
    w.works = [r for r in w.works if r.at >= start]
    w.occupancy = [s for s in w.occupancy if s.at >= start]
    return slice_window(w.works, w.occupancy, start, end, m).slices


def _apply(sim: Simulator, to_prefill: tuple[str, ...], to_decode: tuple[str, ...]) -> None:
    by_name = {n.name: n.index for n in sim.nodes}
    for name in to_prefill:
        sim.begin_switch(by_name[name], Role.PREFILL)
    for name in to_decode:
        sim.begin_switch(by_name[name], Role.DECODE)


def _planner_nodes(sim: Simulator) -> tuple[PlannerNode, ...]:
    return tuple(
        PlannerNode(
            n.name,
            sim.models[n.index],
            n.role,
            draining=sim.switching and n.status is not NodeStatus.SERVING,
            kv_capacity_tokens=float(n.kv_capacity_tokens),  # decode capacity needs KV room
        )
        for n in sim.nodes
    )


def _last_switch(sim: Simulator) -> LastSwitch | None:
    """The last switch: when it was decided and, once no node switches, when its last node was done."""
    applied = sim.last_switch_at
    if applied is None:
        return None
    if sim.switching:
        return LastSwitch(applied)
    done = [float(s["done_at"]) for s in sim.metrics.switches if float(s["decided_at"]) >= applied]
    return LastSwitch(applied, max(done, default=applied))


class OnlineFit:
    """Collects each node's iterations as noisy records, then fits every node's models on its own
    records, by the live planner's NNLS (:func:`~agentpool.models.fitting.fit_prefill` and
    ``fit_decode``, which :func:`~agentpool.models.fitting.fit_nodes` runs per node).

    The live planner warms up colocated, so each node has records of both phases; the simulated
    pool starts disaggregated, so a node has records of the phase it serves only. A phase with
    fewer than :attr:`MIN_RECORDS` records of the node's own is fitted on the records of all nodes
    (the node never ran it; the planner needs its rate should it move there), and the node's entry
    in the log says so. The fit runs once both phases have :attr:`MIN_RECORDS` records in all.

    With a ``refit`` policy (the default of :class:`PlannerSettings`) it goes on recording, and
    :meth:`refit` checks each window's records against the range each node's models were fitted
    on and refits where the work left it (:func:`agentpool.models.refit.refit_nodes`, which the
    live planner runs too); without one the models stay frozen, as the paper's do."""

    MIN_RECORDS = 20  # per phase, like a warmup that saw enough batches

    def __init__(self, sim: Simulator, noise: float, seed: int, refit: RefitPolicy | None = None) -> None:
        if not 0.0 <= noise < 1.0:
            raise ValueError(f"fit noise must be in [0, 1), got {noise}")
        self.sim = sim
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.prefill: dict[str, list[PrefillIterationRecord]] = {}
        self.decode: dict[str, list[DecodeIterationRecord]] = {}
        self.done = False
        self.refit_policy = refit
        self.fitted: dict[str, NodeRecords] = {}  # what each node's models were fitted on (for refit)
        self._others = {node.index: node.on_iteration for node in sim.nodes}  # hooks set before: kept
        for node in sim.nodes:
            node.on_iteration = self._hook(node.on_iteration)

    def _hook(self, other: IterationHook | None) -> IterationHook:
        if other is None:
            return self.record

        def both(it: Iteration) -> None:
            self.record(it)
            other(it)

        return both

    def record(self, it: Iteration) -> None:
        if it.batch and it.running == 0:  # a pure prefill iteration (mixed ones fit neither model)
            seconds = noisy(it.prefill_s, self.noise, self.rng)
            rec = PrefillIterationRecord(it.node, it.start, it.batch, seconds)
            self.prefill.setdefault(it.node, []).append(rec)
        elif not it.batch and it.iterations >= 1.0:  # a decode stretch: one record of its iteration time
            seconds = noisy(it.decode_s, self.noise, self.rng)
            self.decode.setdefault(it.node, []).append(
                DecodeIterationRecord(it.node, it.start, it.running, seconds)
            )

    def try_fit(self) -> list[tuple[NodeFit, FitError]] | str:
        """Fit every node and give it its models (each node's fit, with its error against the truth),
        or say why not yet."""
        n_p = sum(map(len, self.prefill.values()))
        n_d = sum(map(len, self.decode.values()))
        if n_p < self.MIN_RECORDS or n_d < self.MIN_RECORDS:
            return f"not enough iterations to fit yet: {n_p} prefill, {n_d} decode"
        d = self.sim.preset.decode
        shape = MoeShape(d.experts_active, d.experts_total, d.t_fwd)
        models = self.sim.models
        records: list[IterationRecord] = [r for rs in self.prefill.values() for r in rs]
        records += [r for rs in self.decode.values() for r in rs]
        fits = fit_nodes(  # the live planner's fit; the prior: what the planner and router used until now
            records,
            shape,
            nodes=[node.name for node in self.sim.nodes],
            min_own=self.MIN_RECORDS,
            priors={node.name: models[node.index] for node in self.sim.nodes},
        )
        out: list[tuple[NodeFit, FitError]] = []
        for node in self.sim.nodes:
            f = fits[node.name]
            err = fit_error(self.sim.truth, f.prefill.model, f.decode.model, self.sim.preset.gpu_kv_tokens)
            out.append((f, err))
            self.sim.set_model(
                node.index, replace(models[node.index], prefill=f.prefill.model, decode=f.decode.model)
            )
            if self.refit_policy is not None:
                self.fitted[node.name] = NodeRecords(f.prefill_records, f.decode_records)
        if self.refit_policy is None:
            for node in self.sim.nodes:
                node.on_iteration = self._others[node.index]
        self.prefill, self.decode = {}, {}  # from now on: the records of the current window
        self.done = True
        return out

    def refit(self) -> list[tuple[NodeRefit, FitError]]:
        """Check the window's records (since the last call) against each node's fitted range and
        give every node whose models were refitted its new ones; the refitted nodes, with their
        new models' error against the truth. Nothing without a refit policy or before the fit."""
        policy = self.refit_policy
        if policy is None or not self.done:
            return []
        window: list[IterationRecord] = [r for rs in self.prefill.values() for r in rs]
        window += [r for rs in self.decode.values() for r in rs]
        self.prefill, self.decode = {}, {}
        by_name = {n.name: n.index for n in self.sim.nodes}
        models = self.sim.models
        refits = refit_nodes(self.fitted, window, {n: models[i] for n, i in by_name.items()}, policy)
        out: list[tuple[NodeRefit, FitError]] = []
        for name, r in refits.items():
            if not r.changed:
                continue
            i = by_name[name]
            model = r.model(models[i])
            self.sim.set_model(i, model)
            self.fitted[name] = r.records()
            err = fit_error(self.sim.truth, model.prefill, model.decode, self.sim.preset.gpu_kv_tokens)
            out.append((r, err))
        return out


def _fit_log(
    sim: Simulator, at: float, fitted_errors: list[tuple[NodeFit, FitError]] | str
) -> dict[str, Any]:
    if isinstance(fitted_errors, str):
        return {"at": at, "outcome": "fit", "reason": fitted_errors}
    fitted = [f for f, _ in fitted_errors]
    errs = [e for _, e in fitted_errors]

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    summary = {
        "prefill_mean": mean([e.prefill_mean for e in errs]),  # means over nodes of each node's error
        "prefill_max": max(e.prefill_max for e in errs),  # the worst point of the worst node
        "prefill_batch_mean": mean([e.batch_mean for e in errs]),
        "decode_mean": mean([e.decode_mean for e in errs]),
        "decode_max": max(e.decode_max for e in errs),
        "prefill_mean_worst_node": max(e.prefill_mean for e in errs),
        "decode_mean_worst_node": max(e.decode_mean for e in errs),
        "nodes": float(len(fitted)),
        "nodes_prefill_own": float(sum(f.prefill_own for f in fitted)),
        "nodes_decode_own": float(sum(f.decode_own for f in fitted)),
    }
    sim.metrics.fit_error = summary
    held_p = [f.prefill.report.mape_held_out for f in fitted if f.prefill_own]
    held_d = [f.decode.report.mape_held_out for f in fitted if f.decode_own]
    return {
        "at": at,
        "outcome": "fit",
        "error_vs_truth": (
            f"per node, mean over {len(fitted)} nodes (worst node): prefill "
            f"{100 * summary['prefill_mean']:.1f}% ({100 * summary['prefill_mean_worst_node']:.1f}%), "
            f"batches {100 * summary['prefill_batch_mean']:.1f}%, decode {100 * summary['decode_mean']:.1f}% "
            f"({100 * summary['decode_mean_worst_node']:.1f}%); worst point: prefill "
            f"{100 * summary['prefill_max']:.1f}%, decode {100 * summary['decode_max']:.1f}%"
        ),
        "reason": (
            f"fitted online per node: prefill on own records on {len(held_p)} nodes (held-out MAPE "
            f"{_pct_range(held_p)}), decode on own records on {len(held_d)} nodes (held-out MAPE "
            f"{_pct_range(held_d)}); the others' phase fitted on every node's records of it"
        ),
        "per_node": [
            {
                "node": f.node,
                "prefill": f"c0={f.prefill.model.c0:.4g} c1={f.prefill.model.c1:.4g} "
                f"c2={f.prefill.model.c2:.4g} c3={f.prefill.model.c3:.4g}",
                "decode": f"d0={f.decode.model.d0:.4g} d1={f.decode.model.d1:.4g} d2={f.decode.model.d2:.4g}",
                "prefill_records": "own" if f.prefill_own else "all nodes",
                "decode_records": "own" if f.decode_own else "all nodes",
                **e.as_dict(),
            }
            for f, e in fitted_errors
        ],
    }


def _refit_log(at: float, refits: list[tuple[NodeRefit, FitError]]) -> dict[str, Any]:
    return {
        "at": at,
        "outcome": "refit",
        "reason": f"the window's work left the fitted range of {len(refits)} nodes: refitted",
        "per_node": [
            {
                "node": r.node,
                "why": r.describe(),
                "prefill_error_vs_truth": e.prefill_mean,
                "decode_error_vs_truth": e.decode_mean,
            }
            for r, e in refits
        ],
    }


def _pct_range(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{100 * min(xs):.1f}-{100 * max(xs):.1f}%"


def _evolving(sim: Simulator, s: PlannerSettings) -> Tick:
    policy = PlannerPolicy(
        cooldown_s=s.cooldown_s,
        min_prefill=s.min_prefill,
        min_decode=s.min_decode,
        min_relative_gain=s.min_relative_gain,
    )
    refit = s.refit_policy if s.refit else None
    fit = OnlineFit(sim, s.fit_noise, s.fit_seed, refit) if s.fit is ModelSource.ONLINE else None

    def tick(now: float) -> None:
        if fit is not None and not fit.done:
            sim.metrics.planner_log.append(_fit_log(sim, now, fit.try_fit()))
            if not fit.done:
                sim.window.iterations.clear()
                return  # the live planner does not plan before its models are fitted either
        elif fit is not None:
            refits = fit.refit()
            if refits:
                sim.metrics.planner_log.append(_refit_log(now, refits))
        _remeasure(sim)
        slices = _window_slices(sim, now - s.window_s, now, s.slices)
        decision = plan(PlannerInput(_planner_nodes(sim), slices, now, _last_switch(sim)), policy)
        sim.metrics.planner_log.append(
            {"at": now, "outcome": decision.outcome.value, "reason": decision.reason}
        )
        if decision.outcome is Outcome.SWITCH:
            _apply(sim, decision.to_prefill, decision.to_decode)

    return tick


def _oracle(sim: Simulator, s: PlannerSettings) -> Tick:
    def tick(now: float) -> None:
        _remeasure(sim)
        slices = _window_slices(sim, now - s.window_s, now, s.slices)
        if not slices or sim.switching:
            return
        whole = WorkSlice(
            mean_work([x.work for x in slices]), sum(x.decode_occupancy for x in slices) / len(slices)
        )
        order = sorted(sim.nodes, key=lambda n: (n.role is not Role.PREFILL, n.name))
        best_p, best = -1, -1.0
        for p in range(1, len(order)):
            theta = split_throughput(
                [sim.models[n.index] for n in order[:p]], [sim.models[n.index] for n in order[p:]], whole
            )
            if theta > best:
                best_p, best = p, theta
        prefill_now = [n for n in order if n.role is Role.PREFILL]
        to_p = tuple(n.name for n in order[:best_p] if n.role is not Role.PREFILL)
        to_d = tuple(n.name for n in order[best_p:] if n.role is Role.PREFILL)
        if best_p != len(prefill_now):
            _apply(sim, to_p, to_d)

    return tick


def _settled_phases(sim: Simulator) -> tuple[list[Node], list[Node]] | None:
    """The prefill and decode nodes, or None while a switch runs or a phase has no node."""
    if sim.switching:
        return None
    prefill = [n for n in sim.nodes if n.role is Role.PREFILL]
    decode = [n for n in sim.nodes if n.role is Role.DECODE]
    return (prefill, decode) if prefill and decode else None


def _dynamo(sim: Simulator, s: PlannerSettings) -> Tick:
    planner = DynamoLoadPlanner(sim, s.dynamo)
    sim.every(planner.s.pull_s, planner.s.pull_s, planner.sample)
    return planner.tick


def _arrow(sim: Simulator, s: PlannerSettings) -> Tick:
    def tick(now: float) -> None:
        del now
        phases = _settled_phases(sim)
        if phases is None:
            return
        prefill, decode = phases
        worst, lengths = 0.0, list[int]()
        for n in prefill:
            # Arrow's misestimate: each queued request prefills its full input (Eq. 1, nothing cached)
            p = n.prefill_model
            t = sum(p.iteration_time([PrefillBatchItem(t_uc=float(r.input_tokens))]) for r in n.queue)
            worst = max(worst, t)
            lengths.extend(r.input_tokens for r in n.queue)
        typical = sum(lengths) / len(lengths) if lengths else 0.0
        iteration = sum(n.decode_iter_s for n in decode) / len(decode)
        decode_slow = (
            iteration * sim.preset.t_acc > 0
            and iteration / sim.preset.t_acc > s.arrow_tpot_fraction * sim.cfg.slo_tpot_s
        )
        deadline = sim.metrics.slo.deadline(typical)
        if worst > deadline and len(decode) > 1:
            sim.begin_switch(min(decode, key=lambda n: (len(n.running), n.name)).index, Role.PREFILL)
        elif worst < s.arrow_low * deadline and len(prefill) > 1 and decode_slow:
            sim.begin_switch(min(prefill, key=lambda n: (len(n.queue), n.name)).index, Role.DECODE)

    return tick
