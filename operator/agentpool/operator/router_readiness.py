"""Which settings generation each router replica runs, asked of the replicas themselves (I/O).

In a disaggregated pool the planner polls every router and writes what they run to its state
ConfigMap; a colocated pool runs no planner, so the operator asks each running router pod's
`GET /ready` (open, like every probe), whose body carries `configGeneration`. A replica that does not
answer within the timeout, or answers without a generation, counts as running an unknown one.

With `spec.auth.routerTls` the replicas serve HTTPS: the operator trusts the `ca.crt` of the
router's Secret (the only key it reads there) and checks each replica's certificate against the
router Service's name, since no certificate names a pod IP. A Secret it cannot read leaves every
replica's generation unknown (logged).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentpool.api import AgentServingPoolSpec
from agentpool.operator.builders.tls import CA_KEY, router_scheme
from agentpool.operator.kube import KubeApi, KubeError
from agentpool.operator.names import ROUTER, ROUTER_PORT, PoolRef
from agentpool.wire.urls import base_url

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
    """`<scheme>://<pod IP>:<its http port>`."""


def running_router(pod: Mapping[str, Any], scheme: str = "http") -> RouterPod | None:
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
    return RouterPod(str(meta.get("name")), base_url(scheme, str(ip), port))


@dataclass(frozen=True, slots=True)
class RouterTls:
    """How the operator checks the replicas' certificates."""

    context: ssl.SSLContext
    server_name: str


class RouterCaError(Exception):
    """The router's CA could not be read from its Secret."""


async def router_tls(api: KubeApi, pool: PoolRef, spec: AgentServingPoolSpec) -> RouterTls | None:
    """The CA of `spec.auth.routerTls`'s Secret and the name to check (None without it)."""
    tls = spec.auth.router_tls
    if tls is None:
        return None
    try:
        secret = await api.get("Secret", pool.namespace, tls.secret_name)
    except KubeError as e:
        raise RouterCaError(f"Secret {tls.secret_name} not read: {e}") from e
    encoded = ((secret or {}).get("data") or {}).get(CA_KEY)
    if not isinstance(encoded, str):
        raise RouterCaError(f"Secret {tls.secret_name} has no {CA_KEY}")
    try:
        pem = base64.b64decode(encoded, validate=True).decode("ascii")
        context = ssl.create_default_context(cadata=pem)
    except (binascii.Error, UnicodeDecodeError, ssl.SSLError, ValueError) as e:
        raise RouterCaError(f"{CA_KEY} of Secret {tls.secret_name} is not a PEM certificate: {e}") from e
    return RouterTls(context, pool.service_host(ROUTER))


async def _generation(
    session: aiohttp.ClientSession, router: RouterPod, server_name: str | None
) -> int | None:
    try:
        # 503 bodies carry it too
        async with session.get(f"{router.url}/ready", server_hostname=server_name) as answer:
            raw = await answer.read()
        return ReadyBody.model_validate_json(raw).config_generation
    except (aiohttp.ClientError, TimeoutError, ValidationError) as e:
        log.info("router %s did not say its settings generation: %s", router.name, e)
        return None


async def router_generations(
    api: KubeApi, pool: PoolRef, spec: AgentServingPoolSpec
) -> dict[str, int | None]:
    """The settings generation of every running router pod, by its URL."""
    pods = await api.list_objects("Pod", pool.namespace, pool.selector(ROUTER))
    scheme = router_scheme(spec)
    found = (running_router(p, scheme) for p in pods)
    routers = sorted((r for r in found if r is not None), key=lambda r: r.name)
    if not routers:
        return {}
    try:
        tls = await router_tls(api, pool, spec)
    except RouterCaError as e:
        log.warning("router replicas not asked for their settings generation: %s", e)
        return dict.fromkeys((r.url for r in routers), None)
    timeout = aiohttp.ClientTimeout(total=READY_TIMEOUT_S)
    connector = aiohttp.TCPConnector(ssl=True if tls is None else tls.context)
    server_name = None if tls is None else tls.server_name
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        answers = await asyncio.gather(*(_generation(session, r, server_name) for r in routers))
    return {r.url: g for r, g in zip(routers, answers, strict=True)}
