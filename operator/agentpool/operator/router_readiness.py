"""Which settings generation each router replica runs, asked of the replicas themselves (I/O).

In a disaggregated pool the planner polls every router and writes what they run to its state
ConfigMap; a colocated pool runs no planner, so the operator asks each running router pod's
`GET /ready` (open, like every probe), whose body carries `configGeneration`. A replica that does not
answer within the timeout, or answers without a generation, counts as running an unknown one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentpool.operator.kube import KubeApi
from agentpool.operator.names import ROUTER, ROUTER_PORT, PoolRef

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 2.0
"""How long one router replica gets to answer (the status is refreshed again soon after)."""


class ReadyBody(BaseModel):
    """The part of the router's `/ready` answer the operator reads."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    config_generation: int | None = Field(default=None, ge=0, alias="configGeneration")


@dataclass(frozen=True, slots=True)
class RouterPod:
    name: str
    url: str
    """`http://<pod IP>:<its http port>`."""


def running_router(pod: Mapping[str, Any]) -> RouterPod | None:
    """The pod's base URL when it runs and has an IP (None for pending, ending or IP-less pods)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ip = status.get("podIP")
    if meta.get("deletionTimestamp") is not None or status.get("phase") != "Running" or not ip:
        return None
    port = ROUTER_PORT
    for container in (pod.get("spec") or {}).get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == "http" and isinstance(p.get("containerPort"), int):
                port = p["containerPort"]
    host = f"[{ip}]" if ":" in str(ip) else str(ip)
    return RouterPod(str(meta.get("name")), f"http://{host}:{port}")


async def _generation(session: aiohttp.ClientSession, router: RouterPod) -> int | None:
    try:
        async with session.get(f"{router.url}/ready") as answer:  # 503 bodies carry it too
            raw = await answer.read()
        return ReadyBody.model_validate_json(raw).config_generation
    except (aiohttp.ClientError, TimeoutError, ValidationError) as e:
        log.info("router %s did not say its settings generation: %s", router.name, e)
        return None


async def router_generations(api: KubeApi, pool: PoolRef) -> dict[str, int | None]:
    """The settings generation of every running router pod, by its URL."""
    pods = await api.list_objects("Pod", pool.namespace, pool.selector(ROUTER))
    routers = sorted((r for r in map(running_router, pods) if r is not None), key=lambda r: r.name)
    if not routers:
        return {}
    timeout = aiohttp.ClientTimeout(total=READY_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        found = await asyncio.gather(*(_generation(session, r) for r in routers))
    return {r.url: g for r, g in zip(routers, found, strict=True)}
