"""Who may use an engine: one bearer token per pool, for its HTTP API and its lease channel.

Generations, KV leases and the lease channel's port are for the pool's routers and its peer engines
only: anyone who reached them could run generations or pin a node's host pool. Every such call needs
``Authorization: Bearer <token>`` (compared in constant time); the lease channel takes the same value
in its first frame (``lease_channel.py``). The token comes from a file (``tokenFile``, a mounted
Kubernetes Secret); an engine started with neither a token file nor ``insecureAllowUnauthenticated``
refuses to start. The probes and read-only views stay open: ``/health``, ``/ready``, ``/metrics``
and ``/agentpool/v1/state`` (the role served, for the local pool's planner and people).

A refused call is answered 401 through the error tree (:class:`Unauthenticated`) and counted in
``agentpool_engine_unauthenticated_total{channel}``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from agentpool.engine.config import ConfigError, EngineConfig
from agentpool.engine.errors import Unauthenticated
from agentpool.secret_file import BearerAuth
from agentpool.secret_file.local_tokens import LocalToken, token_file_or_local

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset(("/health", "/ready", "/metrics", "/agentpool/v1/state"))
"""Paths anyone may read: probes, metrics and the read-only state view."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class EngineAuth(BearerAuth):
    """The engine token: what callers must send, and what this engine sends to its peers."""

    what: ClassVar[str] = "engine token"
    error: ClassVar[type[ValueError]] = ConfigError


def engine_auth(cfg: EngineConfig) -> EngineAuth:
    """The config's choice: the token in ``tokenFile`` (unset: the per-user ``engine`` token file), or
    open with a warning (``insecureAllowUnauthenticated``). Reads a file: call before serving or in a
    thread."""
    if not cfg.insecure_allow_unauthenticated:
        return EngineAuth.token_file(token_file_or_local(cfg.token_file, LocalToken.ENGINE, "tokenFile"))
    log.warning(
        "this engine's API and lease channel are NOT authenticated (insecureAllowUnauthenticated): "
        "anyone who reaches it can run generations and pin its host KV pool"
    )
    return EngineAuth.unauthenticated()


def auth_middleware(auth: BearerAuth, refused: Callable[[], None]) -> Middleware:
    """Refuses (401) every path but :data:`OPEN_PATHS` without the token; ``refused`` counts each.
    Put it inside ``http_errors.error_middleware``, which turns :class:`Unauthenticated` into the 401."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS and not auth.allows(request.headers.get("Authorization")):
            refused()
            raise Unauthenticated("missing or wrong engine token (Authorization: Bearer <token>)")
        return await handler(request)

    return check
