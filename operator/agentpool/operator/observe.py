"""Reading what the status needs from the cluster (I/O; the status itself is computed in `status`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from agentpool.api import AgentServingPoolSpec
from agentpool.operator.kube import KubeApi
from agentpool.operator.names import DIRECTORY, ENGINE, GENERATION_ANNOTATION, REDIS, ROUTER, PoolRef
from agentpool.operator.status import Observed, PodView
from agentpool.planner.state import STATE_KEY, PlannerState

SWITCH_EVENT_REASON = "PhaseSplitChanged"


def _available(obj: Mapping[str, Any] | None, field: str) -> bool:
    return obj is not None and int((obj.get("status") or {}).get(field) or 0) >= 1


async def engine_pods(api: KubeApi, pool: PoolRef) -> dict[str, dict[str, Any]]:
    pods = await api.list_objects("Pod", pool.namespace, pool.selector(ENGINE))
    return {str(p["metadata"]["name"]): p for p in pods}


async def planner_state(api: KubeApi, pool: PoolRef) -> PlannerState | None:
    cm = await api.get("ConfigMap", pool.namespace, pool.planner_state)
    text = ((cm or {}).get("data") or {}).get(STATE_KEY)
    if not text:
        return None
    try:
        return PlannerState.model_validate_json(text)
    except ValidationError:
        return None


async def last_switch_reason(api: KubeApi, pool: PoolRef) -> str | None:
    """The message of the planner's latest `PhaseSplitChanged` Event about the pool."""
    found = await api.list_events(pool.namespace, pool.name)
    ours = [
        e
        for e in found
        if e.get("reason") == SWITCH_EVENT_REASON
        and (e.get("involvedObject") or {}).get("uid") in (None, pool.uid)
    ]
    if not ours:
        return None
    latest = max(ours, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return str(latest.get("message") or "")[:1024] or None


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
    return Observed(
        pods={name: PodView.of(pod) for name, pod in pods.items()},
        router_ready=_available(router, "availableReplicas"),
        directory_ready=_available(directory, "availableReplicas"),
        redis_ready=redis_ready,
        config_generation=int(generation) if generation is not None and generation.isdigit() else None,
        planner_state=await planner_state(api, pool),
        last_switch_reason=await last_switch_reason(api, pool),
        draining=draining,
        children_changed=children_changed,
    )
