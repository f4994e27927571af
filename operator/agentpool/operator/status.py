"""The pool's status from what the operator observed (pure: no client, no clock; `now` is given).

Conditions keep their `lastTransitionTime` while their status stays, so an unchanged cluster gives
an identical status and the operator writes nothing.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agentpool.api import (
    AgentServingPoolSpec,
    AgentServingPoolStatus,
    Condition,
    ConfigStatus,
    LoadedConfig,
    ModelFitStatus,
    NodeStatus,
    Reason,
    SplitStatus,
    SwitchStatus,
)
from agentpool.api.status import DecodeFit, PrefillFit
from agentpool.kv import Role
from agentpool.operator.builders.config import role_for_pod
from agentpool.operator.names import DRAIN_ANNOTATION, OBSERVED_ROLE_ANNOTATION, ROLE_ANNOTATION
from agentpool.planner.roles import split_label
from agentpool.planner.state import LoadedGenerations, PlannerState

ROLES = tuple(Role)  # the role strings in the pods' annotations
FAILING_WAIT_REASONS = frozenset(
    {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError", "InvalidImageName"}
)


@dataclass(frozen=True, slots=True)
class PodView:
    """What the status needs from one engine pod."""

    name: str
    desired_role: str | None
    observed_role: str | None
    ready: bool
    draining: bool = False
    failing: str | None = None
    """Why its container cannot run (e.g. `CrashLoopBackOff`), if it cannot."""

    @staticmethod
    def of(pod: Mapping[str, Any]) -> PodView:
        meta = pod.get("metadata") or {}
        notes = meta.get("annotations") or {}
        status = pod.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        failing = None
        for container in status.get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in FAILING_WAIT_REASONS:
                failing = f"{container.get('name')}: {waiting['reason']}"
        role, observed = notes.get(ROLE_ANNOTATION), notes.get(OBSERVED_ROLE_ANNOTATION)
        return PodView(
            name=str(meta.get("name")),
            desired_role=role if role in ROLES else None,
            observed_role=observed if observed in ROLES else None,
            ready=ready and meta.get("deletionTimestamp") is None,
            draining=notes.get(DRAIN_ANNOTATION) == "true",
            failing=failing,
        )


@dataclass(frozen=True, slots=True)
class Observed:
    """The cluster as the operator saw it for one pool."""

    pods: Mapping[str, PodView]
    """Engine pods by name."""
    router_ready: bool
    directory_ready: bool
    redis_ready: bool
    config_generation: int | None
    planner_state: PlannerState | None = None
    loaded: LoadedGenerations | None = None
    """The settings generations the planner and routers run, as the planner reports them (in a
    colocated pool, as the routers answer the operator)."""
    planner_runs: bool = True
    """The pool runs a planner (not in a colocated pool)."""
    draining: tuple[str, ...] = ()
    """Engines a scale-down waits for."""
    children_changed: bool = False
    """The last reconcile wrote to some child."""


def split_status(roles: Sequence[str], colocated_pool: bool) -> SplitStatus:
    counts = Counter(roles)
    return SplitStatus(
        prefill=counts["prefill"],
        decode=counts["decode"],
        colocated=counts["both"],
        label=split_label(roles, colocated_pool),
    )


def _loaded(generations: Sequence[int | None]) -> LoadedConfig:
    known = [g for g in generations if g is not None]
    return LoadedConfig(
        loaded_generation=min(known) if known else None,
        newest_generation=max(known) if known else None,
        replicas=len(generations),
    )


def config_status(
    config_generation: int | None, loaded: LoadedGenerations | None, planner_runs: bool = True
) -> ConfigStatus:
    """The generation the ConfigMap holds and, where they are known, the ones the routers and the
    planner run (a colocated pool runs no planner: `planner` stays unset there)."""
    if loaded is None:
        return ConfigStatus(desired_generation=config_generation)
    return ConfigStatus(
        desired_generation=config_generation,
        router=_loaded(list(loaded.routers.values())),
        planner=_loaded([loaded.planner]) if planner_runs else None,
    )


def config_lag(config: ConfigStatus) -> str | None:
    """Which part still runs older settings than the ConfigMap's (None: none that reported)."""
    want = config.desired_generation
    if want is None:
        return None
    behind = [
        f"{what} runs generation {'unknown' if part.loaded_generation is None else part.loaded_generation}"
        for what, part in (("router", config.router), ("planner", config.planner))
        if part is not None
        and part.replicas
        and (part.loaded_generation is None or part.loaded_generation < want)
    ]
    return f"{', '.join(behind)}; the ConfigMap holds {want}" if behind else None


def model_fit(spec: AgentServingPoolSpec, state: PlannerState | None) -> ModelFitStatus | None:
    if spec.mode != "disaggregated" or not spec.planner.enabled:
        return None
    if state is None or not state.models:
        return ModelFitStatus(state="Learning")
    models = list(state.models.values())

    def median(attr: str) -> float:
        return float(statistics.median(getattr(m, attr) for m in models))

    return ModelFitStatus(
        state="Fitted",
        fitted_at=datetime.fromtimestamp(state.fitted_at, UTC),
        prefill=PrefillFit(c0=median("c0"), c1=median("c1"), c2=median("c2"), c3=median("c3")),
        decode=DecodeFit(d0=median("d0"), d1=median("d1"), d2=median("d2")),
    )


def _condition(
    kind: str,
    true: bool,
    reason: Reason,
    message: str,
    generation: int,
    previous: AgentServingPoolStatus | None,
    now: datetime,
) -> Condition:
    status = "True" if true else "False"
    before = next((c for c in (previous.conditions if previous else []) if c.type == kind), None)
    since = before.last_transition_time if before is not None and before.status == status else now
    return Condition.model_validate(
        {
            "type": kind,
            "status": status,
            "reason": reason.value,
            "message": message,
            "lastTransitionTime": since,
            "observedGeneration": generation,
        }
    )


def _switches(previous: AgentServingPoolStatus | None, state: PlannerState | None) -> SwitchStatus:
    """The planner's own count (saved with every switch); without a planner state, what the status
    said before (a colocated pool, or a planner that has not saved yet)."""
    if state is None:
        return previous.switches if previous is not None and previous.switches is not None else SwitchStatus()
    record = state.switches
    return SwitchStatus(
        total=record.total,
        last_time=None if record.last_at is None else datetime.fromtimestamp(record.last_at, UTC),
        last_from=record.last_from,
        last_to=record.last_to,
        last_reason=record.last_reason,
    )


def pool_status(
    names: Sequence[str],
    spec: AgentServingPoolSpec,
    generation: int,
    observed_generation: int | None,
    observed: Observed,
    previous: AgentServingPoolStatus | None,
    now: datetime,
) -> AgentServingPoolStatus:
    """Status of a pool whose spec is valid; `names` are its engine pods, in ordinal order."""
    nodes: list[NodeStatus] = []
    colocated = spec.mode == "colocated"
    for ordinal, name in enumerate(names):
        pod = observed.pods.get(name)
        # a pod without a role (gone, or new and not yet given one) keeps the one it had
        desired = (
            pod.desired_role
            if pod is not None and pod.desired_role
            else role_for_pod(spec, ordinal, name, previous)
        )
        shown = pod.observed_role if pod is not None else None
        if colocated and shown is None and pod is not None and pod.ready:
            # No planner runs (it is what shows `agentpool.io/observed-role`, from the routers), and
            # nothing switches roles: a ready engine serves the role it started with.
            shown = desired
        nodes.append(
            NodeStatus.model_validate(
                {
                    "name": name,
                    "desiredRole": desired,
                    "observedRole": shown,
                    "ready": pod.ready if pod is not None else False,
                }
            )
        )
    desired_split = split_status([n.desired_role for n in nodes], colocated)
    served = split_status([n.observed_role for n in nodes if n.ready and n.observed_role], colocated)
    ready_nodes = sum(n.ready for n in nodes)
    switching = [n.name for n in nodes if n.ready and n.observed_role != n.desired_role]
    failing = sorted(f"{p.name} ({p.failing})" for p in observed.pods.values() if p.failing)
    control_plane = observed.router_ready and observed.directory_ready and observed.redis_ready
    fit = model_fit(spec, observed.planner_state)
    config = config_status(observed.config_generation, observed.loaded, observed.planner_runs)
    lagging = config_lag(config)

    if ready_nodes < len(nodes):
        ready = (False, Reason.NODES_STARTING, f"{ready_nodes} of {len(nodes)} engines ready")
    elif not control_plane:
        missing = [
            what
            for what, ok in (
                ("router", observed.router_ready),
                ("directory", observed.directory_ready),
                ("redis", observed.redis_ready),
            )
            if not ok
        ]
        ready = (False, Reason.CONTROL_PLANE_STARTING, f"not available yet: {', '.join(missing)}")
    else:
        ready = (True, Reason.ALL_NODES_SERVING, f"{ready_nodes} engines serving {served.label}")

    if observed.draining:
        progressing = (True, Reason.DRAINING, f"draining before removal: {', '.join(observed.draining)}")
    elif observed.children_changed or observed.config_generation != generation:
        progressing = (True, Reason.RECONCILING, f"applying generation {generation}")
    elif ready_nodes < len(nodes):
        progressing = (True, Reason.NODES_STARTING, f"{ready_nodes} of {len(nodes)} engines ready")
    elif lagging is not None:
        progressing = (True, Reason.CONFIG_LOADING, lagging)
    elif switching:
        progressing = (True, Reason.SWITCHING, f"switching role: {', '.join(switching)}")
    elif fit is not None and fit.state == "Learning":
        progressing = (True, Reason.LEARNING, "the planner's warmup: fitting the iteration models")
    else:
        progressing = (False, Reason.STABLE, f"serving {served.label}")

    if failing:
        degraded = (True, Reason.ENGINE_FAILING, "; ".join(failing))
    else:
        degraded = (False, Reason.HEALTHY, "")

    return AgentServingPoolStatus(
        observed_generation=observed_generation,
        conditions=[
            _condition("Ready", *ready, generation, previous, now),
            _condition("Progressing", *progressing, generation, previous, now),
            _condition("Degraded", *degraded, generation, previous, now),
        ],
        config_generation=observed.config_generation,
        config=config,
        split=served,
        desired_split=desired_split,
        ready_nodes=ready_nodes,
        nodes=nodes,
        switches=_switches(previous, observed.planner_state),
        model_fit=fit,
    )


def invalid_status(
    message: str, generation: int, previous: AgentServingPoolStatus | None, now: datetime
) -> AgentServingPoolStatus:
    """A spec that cannot be served: Degraded with the reason, nothing else claimed."""
    keep = previous if previous is not None else AgentServingPoolStatus()
    return keep.model_copy(
        update={
            "observed_generation": generation,
            "conditions": [
                _condition("Ready", False, Reason.INVALID_SPEC, message, generation, previous, now),
                _condition(
                    "Progressing",
                    False,
                    Reason.INVALID_SPEC,
                    "waiting for a corrected spec",
                    generation,
                    previous,
                    now,
                ),
                _condition("Degraded", True, Reason.INVALID_SPEC, message, generation, previous, now),
            ],
        }
    )
