"""Real routers (their HTTP server on 127.0.0.1:0, in-process directory) over a minimal colocated engine, for
the tests of what flows between engines, routers and the planner."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from process_helpers import ENGINE_TOKEN

from agentpool.kv import Directory
from agentpool.router.auth import EngineToken, ReportAuth
from agentpool.router.config import RouterConfig
from agentpool.router.directory_view import InProcessDirectoryView
from agentpool.router.server import RouterServer
from agentpool.router.server import serve as serve_router
from agentpool.router.service import RouterService
from agentpool.wire.engine import GenerateRequest


@dataclass
class Served:
    runner: web.AppRunner
    url: str

    async def stop(self) -> None:
        await self.runner.cleanup()


async def serve(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> Served:
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return Served(runner, f"http://{host}:{port}")


class Engine:
    """Serves ``phase=both`` requests at once: ``started``, ``tokens`` tokens, ``done``."""

    def __init__(self, tokens: int = 5) -> None:
        self.tokens = tokens
        self.received: list[GenerateRequest] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/agentpool/v1/generate", self._generate)
        return app

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        req = GenerateRequest.model_validate(await request.json())
        self.received.append(req)
        resp = web.StreamResponse(headers={"content-type": "application/x-ndjson"})
        await resp.prepare(request)
        events: list[dict[str, Any]] = [{"type": "started"}]
        events += [{"type": "token", "text": f"t{i} "} for i in range(self.tokens)]
        usage = {"prompt_tokens": len(req.prompt_token_ids), "completion_tokens": self.tokens}
        events.append({"type": "done", "finish_reason": "length", "usage": usage})
        for e in events:
            await resp.write((json.dumps(e) + "\n").encode())
        return resp


@dataclass
class Router:
    service: RouterService
    server: RouterServer
    url: str

    async def stop(self) -> None:
        await self.server.stop()


def router_config(nodes: list[tuple[str, str, str]], **kw: Any) -> RouterConfig:
    raw: dict[str, Any] = {
        "model": "test-model",
        "policy": "evolving",
        "pageSize": 16,
        "timeouts": {"connect": 1.0, "firstEvent": 5.0, "betweenEvents": 5.0, "directory": 2.0},
        "nodes": [{"id": i, "url": u, "role": r} for i, u, r in nodes],
    }
    raw.update(kw)
    return RouterConfig.model_validate(raw)


async def start_router(
    config: RouterConfig, token: str | None = None, host: str = "127.0.0.1", port: int = 0
) -> Router:
    """A router whose reports (and model pushes) need ``token``; None: open."""
    view = InProcessDirectoryView(Directory(config.page_size), time.monotonic)
    auth = ReportAuth.unauthenticated() if token is None else ReportAuth.token(token)
    service = RouterService(config, view, report_auth=auth, engine_auth=EngineToken.token(ENGINE_TOKEN))
    server = await serve_router(service, host, port, shutdown_timeout=0.1)
    return Router(service, server, f"http://{host}:{server.port}")


def chat(text: str = "hello there", max_tokens: int = 8) -> dict[str, Any]:
    return {"model": "test-model", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
