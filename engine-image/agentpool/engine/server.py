"""The engine's HTTP API: the router's engine protocol, probes, metrics, and the peers' KV leases.

- ``POST /agentpool/v1/generate``: a ``GenerateRequest``; answers 200 with NDJSON events (``started``,
  ``token``, ``prefilled``, ``requeue``, ``done``, ``error``). Malformed input -> 400, a body over
  ``maxBodyBytes`` -> 413, each with a JSON message; never a 5xx for bad input.
- ``GET /health`` (the process serves), ``GET /ready`` (503 while switching roles or before start),
  ``GET /metrics`` (``agentpool_engine_*``), ``GET /agentpool/v1/state`` (role, desired role,
  queue, pool, switch history: for people and tests).
- ``POST/GET/DELETE /agentpool/v1/kv/lease[/{id}]``: host-pool leases for peers (``kv_peers``).

Every path but ``/health``, ``/ready``, ``/metrics`` and ``/agentpool/v1/state`` needs the pool's
engine token (``auth.py``): 401 without it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from agentpool.engine.auth import auth_middleware
from agentpool.engine.errors import BadRequestError
from agentpool.engine.http_errors import error_middleware
from agentpool.wire.engine import GenerateRequest

if TYPE_CHECKING:
    from agentpool.engine.app import EngineApp

GENERATE_PATH = "/agentpool/v1/generate"
APP_KEY: web.AppKey[EngineApp] = web.AppKey("engine")


def _line(event: dict[str, object]) -> bytes:
    return orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE)


async def generate(request: web.Request) -> web.StreamResponse:
    engine = request.app[APP_KEY]
    backend = engine.backend
    raw = await request.read()
    try:
        g = GenerateRequest.model_validate_json(raw)
    except ValidationError as e:
        engine.metrics.bad_requests.labels("invalid").inc()
        errors = e.errors(include_url=False, include_context=False, include_input=False)
        raise BadRequestError(f"invalid generate request: {errors}") from None
    try:
        job = backend.admit(g)
    except BadRequestError:
        engine.metrics.bad_requests.labels("invalid").inc()
        raise
    engine.dispatch_seqs.saw(g.router_id, g.dispatch_seq)
    resp = web.StreamResponse(headers={"content-type": "application/x-ndjson"})
    await resp.prepare(request)
    if job is None:
        reason = backend.not_ready_reason() or (
            "draining" if backend.draining else f"not serving {g.phase} as {backend.role.value}"
        )
        engine.metrics.requeued.labels("not-admitted").inc()
        await resp.write(_line({"type": "requeue", "reason": reason}))
        return resp
    try:
        async for ev in job.stream():
            await resp.write(_line(ev))
    except ConnectionError:  # the router hung up
        job.cancel()
    except asyncio.CancelledError:
        job.cancel()
        raise
    return resp


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def ready(request: web.Request) -> web.Response:
    engine = request.app[APP_KEY]
    reason = engine.not_ready_reason()
    if reason:
        return web.json_response({"ready": False, "reason": reason}, status=503)
    return web.json_response({"ready": True})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[APP_KEY].metrics.registry)
    return web.Response(body=body, headers={"content-type": CONTENT_TYPE_LATEST})


async def state(request: web.Request) -> web.Response:
    return web.json_response(request.app[APP_KEY].state())


def build_app(engine: EngineApp) -> web.Application:
    refused = engine.metrics.unauthenticated.labels("http").inc
    app = web.Application(
        middlewares=[error_middleware, auth_middleware(engine.auth, refused)],
        client_max_size=engine.cfg.max_body_bytes,
    )
    app[APP_KEY] = engine
    app.router.add_post(GENERATE_PATH, generate)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/agentpool/v1/state", state)
    engine.exporter.add_routes(app)
    return app
