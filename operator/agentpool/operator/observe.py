"""Reading what the status needs from the cluster (I/O; the status itself is computed in `status`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from agentpool.api import AgentServingPoolSpec
from agentpool.operator.kube import KubeApi
from agentpool.operator.names import DIRECTORY, ENGINE, GENERATION_ANNOTATION, REDIS, ROUTER, PoolRef
from agentpool.operator.router_readiness import router_generations
from agentpool.operator.status import Observed, PodView
from agentpool.planner.state import LOADED_KEY, STATE_KEY, LoadedGenerations, PlannerState


def _available(obj: Mapping[str, Any] | None, field: str) -> bool:
    return obj is not None and int((obj.get("status") or {}).get(field) or 0) >= 1


async def engine_pods(api: KubeApi, pool: PoolRef) -> dict[str, dict[str, Any]]:
    pods = await api.list_objects("Pod", pool.namespace, pool.selector(ENGINE))
    return {str(p["metadata"]["name"]): p for p in pods}


@dataclass(frozen=True, slots=True)
class PlannerReport:
    """What the planner's state ConfigMap says: its saved state (models, switch count) and the
    settings generations the planner and the routers run."""

    state: PlannerState | None = None
    loaded: LoadedGenerations | None = None


async def planner_report(api: KubeApi, pool: PoolRef) -> PlannerReport:
    """The planner's ConfigMap, each key None when missing or unreadable (a planner writes them)."""
    cm = await api.get("ConfigMap", pool.namespace, pool.planner_state)
    data = (cm or {}).get("data") or {}
    state: PlannerState | None = None
    loaded: LoadedGenerations | None = None
    with contextlib.suppress(ValidationError):
        state = PlannerState.model_validate_json(data[STATE_KEY]) if data.get(STATE_KEY) else None
    with contextlib.suppress(ValidationError):
        loaded = LoadedGenerations.model_validate_json(data[LOADED_KEY]) if data.get(LOADED_KEY) else None
    return PlannerReport(state, loaded)


async def observe(
    api: KubeApi,
    pool: PoolRef,
    spec: AgentServingPoolSpec,
    draining: tuple[str, ...] = (),
    children_changed: bool = False,
) -> Observed:
    pods = await engine_pods(api, pool)
    router = await api.get("Deployment", pool.namespace, pool.child(ROUTER))
    directory = await api.get("Deployment", pool.namespace, pool.child(DIRECTORY))
    redis_ready = True
    if spec.redis.managed is not None:
        redis_ready = _available(
            await api.get("StatefulSet", pool.namespace, pool.child(REDIS)), "readyReplicas"
        )
    config = await api.get("ConfigMap", pool.namespace, pool.config_map)
    generation = ((config or {}).get("metadata", {}).get("annotations") or {}).get(GENERATION_ANNOTATION)
    report = await planner_report(api, pool)
    loaded = report.loaded
    if spec.mode == "colocated":  # no planner reports what the routers run: ask them
        loaded = LoadedGenerations(planner=None, routers=await router_generations(api, pool, spec))
    return Observed(
        pods={name: PodView.of(pod) for name, pod in pods.items()},
        router_ready=_available(router, "availableReplicas"),
        directory_ready=_available(directory, "availableReplicas"),
        redis_ready=redis_ready,
        config_generation=int(generation) if generation is not None and generation.isdigit() else None,
        planner_state=report.state,
        loaded=loaded,
        planner_runs=spec.mode != "colocated",
        draining=draining,
        children_changed=children_changed,
    )
