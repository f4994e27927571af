"""The planner's I/O shell (Algorithm E.3 line 1 and the outer loop): warmup, fit, windows, apply.

0. Restart: when a saved state (:mod:`agentpool.planner.state`) has models of the pods, the
   planner resumes from the pods' current roles and skips 1-2; the saved fitted records are
   what its refits check windows against.
1. Warmup: every unpinned engine pod is set to ``both`` (colocated) and serves both phases for
   ``warmup_s``; the engines' iteration records are fitted per node (NNLS) and frozen (and saved):
   :mod:`agentpool.planner.node_fits`.
2. Disaggregation starts from the initial split: ``initial_prefill`` prefill nodes (pinned pods
   keep their role; the others in name order), the rest decode.
3. Every window: slices of average work and decode occupancy from the router's records, each
   node's ``t_bar``/``f_n`` remeasured from its prefill iterations, the pure core
   (:func:`agentpool.planner.core.plan`) decides, and a switch is applied by patching the pods'
   ``agentpool.io/role`` annotations. Every evaluation updates the metrics; one that changes or
   nearly changes the split also records a Kubernetes Event.
   Before it decides, a node whose window records leave the range its models were fitted on, and
   which they mispredict, is refitted on the fitted records plus the window's
   (:func:`agentpool.planner.node_fits.apply_refits`; ``PlannerConfig.refit``, on by default, and
   its thresholds, read at every window), and
   the routers get the new models with the window's.

The configuration is read again at every window, so changes apply without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

from kubernetes.client.exceptions import ApiException

from agentpool.errors import UnavailableError
from agentpool.kv import Role
from agentpool.models import (
    IterationRecord,
    MoeShape,
    NodeModel,
    measure_prefill_window,
    slice_window,
    with_window_stats,
)
from agentpool.models.fitting import NodeFit
from agentpool.models.refit import NodeRecords, RefitPolicy, refit_nodes
from agentpool.planner.config import PlannerConfig
from agentpool.planner.core import LastSwitch, Outcome, PlannerInput, PlannerNode, initial_roles, plan
from agentpool.planner.evaluation import Evaluation, event_message
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.metrics import PlannerMetrics
from agentpool.planner.node_fits import apply_refits, fit_warmup, prefill_batches_by_node
from agentpool.planner.roles import ObjectRef, PodRoleState, RoleBoard, split_label
from agentpool.planner.saved_records import saved_records
from agentpool.planner.state import PlannerState, StateStore, SwitchRecord
from agentpool.planner.switch_follow import PendingSwitch, PhaseSink, announce

log = logging.getLogger(__name__)

COLOCATED = "both"
MIN_WARMUP_RETRY_S = 10.0  # a warmup repeated after a failed fit lasts at least this long
SWITCH_POLL_S = 2.0  # how often the roles are read while a switch is in flight


class PlannerError(UnavailableError):
    """The planner cannot proceed now: the pool's state contradicts its configuration (no warmup
    records, pins it cannot honour); the loop tries again."""


class KvCapacities(Protocol):
    """The KV tokens each engine's GPU memory holds, from its load reports (``inf``: unknown).
    :class:`agentpool.planner.roles.ServedRoles` is one."""

    def kv_capacity(self, node: str) -> float: ...


class ModelSink(Protocol):
    """Gets every node's current model (fit + this window's ``t_bar``/``f_n``): the routers."""

    async def publish(self, models: Mapping[str, NodeModel], fitted_at: float) -> None: ...


class PlannerController:
    def __init__(
        self,
        pods: RoleBoard,
        inbox: PlannerInbox,
        config: Callable[[], PlannerConfig],
        pool: ObjectRef,
        metrics: PlannerMetrics,
        shape: MoeShape,
        clock: Callable[[], float] = time.time,
        on_evaluation: Callable[[Evaluation], None] | None = None,
        state: StateStore | None = None,
        directory: PhaseSink | None = None,
        models_out: ModelSink | None = None,
        switch_poll_s: float = SWITCH_POLL_S,
        kv_capacity: KvCapacities | None = None,
    ):
        """``on_evaluation`` receives every window's evaluation (e.g. to put it in the pool's status);
        ``state`` keeps the models and the last switch time across restarts; ``directory`` is told
        when an engine serves its new phase; ``models_out`` gets the models after the fit and after
        every window; ``kv_capacity`` says how many KV tokens each engine holds (from its load
        reports), so decode capacity is bounded by KV room (None: not bounded)."""
        self._pods = pods
        self._kv_capacity = kv_capacity
        self._inbox = inbox
        self._config = config
        self._pool = pool
        self._metrics = metrics
        self._shape = shape
        self._clock = clock
        self._on_evaluation = on_evaluation
        self._models: dict[str, NodeModel] = {}
        self._last_switch: LastSwitch | None = None
        self._pending: PendingSwitch | None = None
        self._fitted_at = 0.0
        self._state = state
        self.directory = directory
        self.models_out = models_out
        self._switch_poll_s = switch_poll_s
        # (engine, phase) told to the directory, in order (the last 1000)
        self.announced: deque[tuple[str, Role]] = deque(maxlen=1000)
        self.fits_failed = 0
        self.fits: dict[str, NodeFit] = {}
        # what each node's models were fitted on (saved thinned with the state, restored on resume)
        self.fitted_records: dict[str, NodeRecords] = {}
        self.refits = 0  # windows that refitted a node
        self.last: Evaluation | None = None
        self.switches = SwitchRecord()  # every switch counted (saved with the state)

    async def run(self, stop: asyncio.Event) -> None:
        """Resume or warm up and fit, start from the split, then evaluate every window until ``stop``.

        With a saved state (``state``) whose models cover some of the pods, a restart resumes from
        the pods' current roles: no warmup, no re-colocation, and the cooldown continues from the
        saved last switch. A warmup that fits nothing (no iteration records) is repeated. A window
        that fails (the Kubernetes API, the planner's checks, a configuration that does not
        validate) is logged and skipped; the next window runs.
        """
        cfg = self._config()
        if max(cfg.warmup_s, cfg.window_s) > self._inbox.keep_s:
            raise PlannerError(
                f"the inbox keeps {self._inbox.keep_s:.0f} s of records, less than warmup or window"
            )
        if not await self.resume():
            if not await self._warm_up(stop):
                return
            await self.start_disaggregation()
            await self.save_state()
        await self.publish_models()
        window_s = cfg.window_s
        while not stop.is_set():
            try:
                window_s = self._config().window_s
            except (PlannerError, ValueError) as exc:
                log.error("planner configuration unreadable, keeping %.0f s windows: %s", window_s, exc)
            start = self._clock()
            if await self._wait_observing(stop, window_s):
                return
            end = self._clock()
            try:
                await self.evaluate_window(start, end)
            except ApiException as exc:  # the API server failed this window; the next one retries
                log.error(
                    "planner window %.0f failed at the Kubernetes API: %s %s", start, exc.status, exc.reason
                )
            except (PlannerError, ValueError) as exc:
                log.error("planner window %.0f-%.0f skipped: %s", start, end, exc)

    async def _warm_up(self, stop: asyncio.Event) -> bool:
        """Colocate, wait ``warmup_s``, fit; again until a fit succeeds. False when stopped."""
        while True:
            await self.begin_warmup()
            start = self._clock()
            wait_s = self._config().warmup_s
            if self.fits_failed:
                wait_s = max(wait_s, MIN_WARMUP_RETRY_S)
            if await _wait(stop, wait_s):
                return False
            warmup_records = self._inbox.iterations(start, self._clock())  # a copy, taken on the loop
            nodes = sorted({p.name for p in await self._pods.pods()} | {r.node for r in warmup_records})
            try:
                await asyncio.to_thread(self.fit_records, warmup_records, nodes)
            except (PlannerError, ValueError) as exc:
                self.fits_failed += 1
                log.error("warmup %d fitted nothing, warming up again: %s", self.fits_failed, exc)
                continue
            return True

    async def resume(self) -> bool:
        """Take the saved models and last switch time if they fit the pool; True when resumed."""
        if self._state is None:
            return False
        saved = await self._state.load()
        if saved is None:
            return False
        if not saved.matches(self._shape):
            log.warning("saved planner state is for another MoE shape (%s): warming up", saved.shape)
            return False
        models = saved.node_models()
        pods = await self._pods.pods()
        known = [p for p in pods if p.name in models]
        if not known:
            log.warning("saved planner state has models of none of the pods: warming up")
            return False
        self._models = models
        self.fitted_records = saved.node_records()
        self._fitted_at = saved.fitted_at
        self.switches = saved.switches
        if saved.last_switch_at is not None:
            self._last_switch = LastSwitch(
                saved.last_switch_at,
                None
                if saved.last_switch_settled_at is None
                else max(saved.last_switch_settled_at, saved.last_switch_at),
            )
        unfitted = sorted(p.name for p in pods if p.name not in models)
        if unfitted:
            log.warning("pods without a saved model stay out of planning: %s", ", ".join(unfitted))
        if not any(p.desired_role in (Role.PREFILL, Role.DECODE) for p in known):
            await self.start_disaggregation()  # stopped between the fit and the initial split
            pods = await self._pods.pods()
        prefill = sum(p.desired_role == Role.PREFILL for p in pods)
        decode = sum(p.desired_role == Role.DECODE for p in pods)
        last = "none" if saved.last_switch_at is None else f"{self._clock() - saved.last_switch_at:.0f} s ago"
        await self._pods.record_event(
            self._pool,
            "PlannerResumed",
            f"resumed at {prefill}P{decode}D with the saved models of {len(known)} pods; last switch {last}",
        )
        log.info("planner resumed from its saved state: %dP%dD, last switch %s", prefill, decode, last)
        return True

    async def save_state(self) -> None:
        """Save the models, their fitted records (thinned in a worker thread) and the last switch
        time (no-op without a state store)."""
        if self._state is None or not self._models:
            return
        sw = self._last_switch
        applied, settled = (None, None) if sw is None else (sw.applied_at, sw.settled_at)
        records = await asyncio.to_thread(saved_records, dict(self.fitted_records))
        state = PlannerState.of(
            self._shape, self._models, self._fitted_at, applied, settled, self.switches, records
        )
        await self._state.save(state)

    async def publish_models(self) -> None:
        """Send every fitted node's current model to the routers (no-op without a sink)."""
        if self.models_out is not None and self._models:
            await self.models_out.publish(dict(self._models), self._fitted_at)

    async def begin_warmup(self) -> None:
        """Set every unpinned pod to serve both phases (colocated) for the warmup."""
        for pod in await self._pods.pods():
            if not pod.pinned and pod.desired_role != COLOCATED:
                await self._pods.set_role(pod.name, COLOCATED)

    def fit(self, start: float, end: float) -> dict[str, NodeFit]:
        """Fit and freeze each node's models from the iteration records of ``[start, end)``."""
        return self.fit_records(self._inbox.iterations(start, end))

    def fit_records(
        self, records: list[IterationRecord], nodes: list[str] | None = None
    ) -> dict[str, NodeFit]:
        """Fit and freeze the models of ``nodes`` (default: every node with records) from ``records``
        (CPU only: safe in a worker thread). A node with too few records of a phase of its own gets
        the fit of the whole pool's records of it (:func:`agentpool.models.fitting.fit_nodes`)."""
        # the prior: the models in use until now (saved state, an earlier fit); at a first warmup the
        # pool's configured coefficients (spec.model.iterationModel) for every node, if any
        prior = self._config().prior_model
        default = None if prior is None else prior.node_model(self._shape)
        warmup = fit_warmup(records, self._shape, nodes, priors=dict(self._models), default_prior=default)
        if not warmup.fits:
            raise PlannerError("no iteration records from the warmup: nothing to fit")
        self.fits = warmup.fits
        self._fitted_at = self._clock()
        self._models = warmup.models
        self.fitted_records = warmup.records
        return warmup.fits

    async def start_disaggregation(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Apply the initial split; returns (prefill pods, decode pods)."""
        cfg = self._config()
        pods = await self._pods.pods()
        bad = sorted(p.name for p in pods if p.pinned and p.desired_role not in (Role.PREFILL, Role.DECODE))
        if bad:
            raise PlannerError(f"pinned pods must be pinned to prefill or decode to disaggregate: {bad}")
        pinned = {p.name: Role(str(p.desired_role)) for p in pods if p.pinned}
        try:
            roles = initial_roles([p.name for p in pods], pinned, cfg.initial_prefill, cfg.policy())
        except ValueError as exc:
            raise PlannerError(str(exc)) from exc
        moves = {
            p.name: roles[p.name].value for p in pods if not p.pinned and p.desired_role != roles[p.name]
        }
        # Followed like a switch (the directory learns each engine's new phase), but not one of the
        # planner's: no cooldown after it (the first window has no earlier split to compare).
        self._pending = PendingSwitch(self._clock(), moves)
        for name, role in moves.items():
            await self._pods.set_role(name, role)
        prefill = tuple(sorted(n for n, r in roles.items() if r is Role.PREFILL))
        decode = tuple(sorted(n for n, r in roles.items() if r is Role.DECODE))
        await self._pods.record_event(
            self._pool, "PlannerStarted", f"disaggregation starts at {len(prefill)}P{len(decode)}D"
        )
        return prefill, decode

    async def evaluate_window(self, start: float, end: float) -> Evaluation | None:
        """Evaluate ``[start, end)``; apply and report the decision. None when the planner is disabled."""
        cfg = self._config()
        pods = await self._pods.pods()  # listed even when disabled: it keeps the served roles shown
        if not cfg.enabled:
            log.info("planner disabled: window %.0f-%.0f not evaluated", start, end)
            return None
        if self._pending is not None:
            await self._observe(pods, end)
        if cfg.refit and self.fitted_records:
            await self.refit_window(start, end, cfg.refit_policy())
        nodes, excluded = self._planner_nodes(pods, start, end)
        sliced = slice_window(
            self._inbox.requests(start, end),
            self._inbox.occupancy(start, end),
            start,
            end,
            cfg.slices,
            cfg.occupancy,
        )
        decision = plan(
            PlannerInput(nodes=nodes, slices=sliced.slices, now=end, last_switch=self._last_switch),
            cfg.policy(),
        )
        if decision.outcome is Outcome.SWITCH:
            # Set first: if a patch fails half-way, the cooldown still holds and the next window
            # sees the patched pods draining before it evaluates again.
            self._last_switch = LastSwitch(end)
            moves = {n: Role.PREFILL.value for n in decision.to_prefill}
            moves |= {n: Role.DECODE.value for n in decision.to_decode}
            before = {p.name: p.desired_role for p in pods}
            self.switches = SwitchRecord(
                total=self.switches.total + 1,
                last_at=end,
                last_from=split_label(before.values()),
                last_to=split_label({**before, **moves}.values()),
                last_reason=event_message(decision, excluded)[:1024],
            )
            # engines of an earlier switch the directory has not heard of yet are still announced
            unannounced = {} if self._pending is None else self._pending.unannounced
            self._pending = PendingSwitch(end, moves, unannounced)
            for name, role in moves.items():
                await self._pods.set_role(name, role)
            await self.save_state()
        self._metrics.observe(decision)
        if decision.outcome is Outcome.SWITCH or decision.near_switch:
            reason = "PhaseSplitChanged" if decision.outcome is Outcome.SWITCH else "PhaseSplitNearlyChanged"
            await self._pods.record_event(self._pool, reason, event_message(decision, excluded))
        left_out = decision.excluded_slices
        log.info(
            "planner window %.0f-%.0f: %s: %s%s",
            start,
            end,
            decision.outcome.value,
            decision.reason,
            f" ({left_out} slices within the cooldown left out)" if left_out else "",
        )
        self.last = Evaluation(decision=decision, excluded=tuple(excluded))
        if self._on_evaluation is not None:
            self._on_evaluation(self.last)
        await self.publish_models()  # this window's t_bar and f_n
        return self.last

    async def refit_window(self, start: float, end: float, policy: RefitPolicy) -> list[str]:
        """Refit every node whose records of ``[start, end)`` left the range of its fit and which
        its models mispredict there, as ``policy`` says (CPU in a worker thread); the refitted
        nodes. The routers get the new models with the window's at the end of the evaluation."""
        window = self._inbox.iterations(start, end)
        refits = await asyncio.to_thread(refit_nodes, self.fitted_records, window, dict(self._models), policy)
        changed = apply_refits(refits, self._models, self.fitted_records, self.fits)
        for name in changed:
            log.info("planner window %.0f-%.0f: refitted %s: %s", start, end, name, refits[name].describe())
        if changed:
            self.refits += 1
            self._fitted_at = self._clock()
            await self.save_state()
        return changed

    @property
    def last_switch(self) -> LastSwitch | None:
        return self._last_switch

    @property
    def pending_switch(self) -> PendingSwitch | None:
        return self._pending

    async def observe_switch(self, at: float | None = None) -> bool:
        """Read the roles and settle the switch in flight as far as it went; True when none is left.

        Each engine that serves its new role is announced to the directory (``SwitchPhase``);
        when the last one does, the switch completed at ``at`` (default: now) and the cooldown
        starts. An engine whose desired role is no longer the one the switch asked for (a patch
        that failed, a user's change) is not waited for.
        """
        if self._pending is None:
            return True
        await self._observe(await self._pods.pods(), self._clock() if at is None else at)
        return self._pending is None

    async def _observe(self, pods: list[PodRoleState], at: float) -> None:
        pending = self._pending
        if pending is None:
            return
        pending.settle(pods)
        await announce(pending, self.directory, self.announced)
        if pending.done:
            self._pending = None
            settled = max(at, pending.applied_at)
            if self._last_switch is not None and self._last_switch.applied_at == pending.applied_at:
                self._last_switch = LastSwitch(pending.applied_at, settled)
                log.info("switch of %.0f completed at %.0f: cooldown starts", pending.applied_at, settled)
                await self.save_state()

    async def _wait_observing(self, stop: asyncio.Event, seconds: float) -> bool:
        """Sleep ``seconds`` or until ``stop`` (True), following a switch in flight meanwhile."""
        deadline = self._clock() + seconds
        while True:
            left = deadline - self._clock()
            if left <= 0:
                return stop.is_set()
            if self._pending is None:
                return await _wait(stop, left)
            if await _wait(stop, min(left, self._switch_poll_s)):
                return True
            try:
                await self.observe_switch()
            except ApiException as exc:
                log.warning("roles not read while a switch is in flight: %s %s", exc.status, exc.reason)

    def _planner_nodes(
        self, pods: list[PodRoleState], start: float, end: float
    ) -> tuple[tuple[PlannerNode, ...], list[str]]:
        batches = prefill_batches_by_node(self._inbox.iterations(start, end))
        nodes: list[PlannerNode] = []
        excluded: list[str] = []
        for pod in pods:
            model = self._models.get(pod.name)
            if model is None or pod.desired_role not in (Role.PREFILL, Role.DECODE):
                why = "no fitted model" if model is None else f"role {pod.desired_role!r}"
                excluded.append(f"{pod.name} ({why})")
                continue
            model = with_window_stats(model, measure_prefill_window(batches.get(pod.name, [])))
            self._models[pod.name] = model
            nodes.append(
                PlannerNode(
                    name=pod.name,
                    model=model,
                    role=Role(pod.desired_role),
                    draining=pod.draining,
                    pinned=pod.pinned,
                    kv_capacity_tokens=(
                        math.inf if self._kv_capacity is None else self._kv_capacity.kv_capacity(pod.name)
                    ),
                )
            )
        if excluded:
            log.warning("pods left out of planning: %s", ", ".join(excluded))
        return tuple(nodes), excluded


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop``; True when stopped."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True
