"""Start a real router (its HTTP server on 127.0.0.1:0) over stand-in engines for the integration tests."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from process_helpers import ENGINE_TOKEN

from agentpool.kv import Directory
from agentpool.router.auth import EngineToken, ReportAuth
from agentpool.router.config import ConfigFile, RouterConfig
from agentpool.router.directory_view import DirectoryView, InProcessDirectoryView
from agentpool.router.server import RouterServer, serve
from agentpool.router.service import RouterService


def router_config(nodes: list[tuple[str, str, str]], **kw: Any) -> RouterConfig:
    """``nodes``: (id, url, role) triples."""
    raw: dict[str, Any] = {
        "model": "test-model",
        "policy": "least-loaded",
        "pageSize": 16,
        "timeouts": {"connect": 1.0, "firstEvent": 5.0, "betweenEvents": 5.0, "directory": 2.0},
        "nodes": [{"id": i, "url": u, "role": r} for i, u, r in nodes],
    }
    raw.update(kw)
    return RouterConfig.model_validate(raw)


def write_config(path: Path, config: RouterConfig) -> None:
    path.write_text(json.dumps(config.model_dump(by_alias=True, mode="json")))


@dataclass
class Router:
    service: RouterService
    server: RouterServer
    url: str

    async def stop(self) -> None:
        await self.server.stop()


async def start_router(
    config: RouterConfig,
    directory: DirectoryView | None = None,
    config_file: ConfigFile | None = None,
    reload_interval_s: float = 0.05,
    report_auth: ReportAuth | None = None,
) -> Router:
    """``report_auth``: who may post load reports (default: anyone, as most tests post them bare)."""
    view = directory or InProcessDirectoryView(Directory(config.page_size), time.monotonic)
    auth = report_auth if report_auth is not None else ReportAuth.unauthenticated()
    service = RouterService(
        config,
        view,
        report_auth=auth,
        engine_auth=EngineToken.token(ENGINE_TOKEN),  # the test engines' token
        config_file=config_file,
        reload_interval_s=reload_interval_s,
    )
    server = await serve(service, "127.0.0.1", 0, shutdown_timeout=0.1)
    return Router(service, server, f"http://127.0.0.1:{server.port}")


def chat_body(
    text: str = "hello there", *, stream: bool = False, max_tokens: int = 4, **kw: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "test-model",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    body.update(kw)
    return body


async def read_sse(resp: aiohttp.ClientResponse) -> list[Any]:
    """The ``data:`` payloads of an SSE response, JSON-decoded except ``[DONE]``."""
    events: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def streamed_text(events: list[Any]) -> str:
    out = []
    for e in events:
        if isinstance(e, dict) and e.get("choices"):
            choice = e["choices"][0]
            out.append(choice.get("delta", {}).get("content") or choice.get("text") or "")
    return "".join(out)


async def wait_until(check: Callable[[], bool], within: float = 10.0, what: str = "condition") -> None:
    """Poll `check` until it holds; a slow machine takes longer, it does not fail the test."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within} s")
        await asyncio.sleep(0.01)
