"""The HTTP edge of the engine's error tree: an :class:`EngineError` -> the status of its kind
(:func:`agentpool.errors.http_status`) with a JSON message."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from agentpool.engine.errors import EngineError
from agentpool.errors import http_status

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_body(kind: str, message: str) -> str:
    return json.dumps({"error": {"type": kind, "message": message}})


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except EngineError as e:
        return web.Response(
            status=http_status(e), text=error_body(type(e).__name__, str(e)), content_type="application/json"
        )
