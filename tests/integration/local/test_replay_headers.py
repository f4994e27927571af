"""The replay sends branch headers as a harness would: fork to a sub-agent, end, DELETE at stop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from local_trace import write_small_trace

from agentpool.local.replay import LiveReplay, ReplaySettings
from agentpool.models import TtftSlo
from agentpool.sim.metrics import Metrics
from agentpool.sim.trace import load_claude_code

pytestmark = pytest.mark.integration


class Capture:
    """An HTTP server that answers chat completions with a 2-token SSE stream and keeps the headers.
    Requests of branches named ``hold_prefix``... are held until :attr:`release` is set, so a run
    always ends with such a conversation cut after its first request (whatever the machine's pace)."""

    def __init__(self, hold_prefix: str | None = None) -> None:
        self.headers: list[dict[str, str]] = []
        self.deleted: list[str] = []
        self.hold_prefix = hold_prefix
        self.release = asyncio.Event()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.headers.append({k.lower(): v for k, v in request.headers.items() if k.lower().startswith("x-")})
        assert body["stream"] is True and body["messages"][-1]["role"] == "user"
        branch = request.headers.get("x-agentpool-branch", "")
        if self.hold_prefix is not None and branch.startswith(self.hold_prefix):
            await self.release.wait()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for text in ("a", "b"):
            chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def delete(self, request: web.Request) -> web.Response:
        self.deleted.append(request.match_info["branch"])
        return web.json_response({"deleted": True})


@pytest.fixture
async def capture() -> AsyncIterator[tuple[Capture, str]]:
    cap = Capture(hold_prefix="c2-")  # the second conversation is cut by the end of the run
    app = web.Application()
    app.router.add_post("/v1/chat/completions", cap.chat)
    app.router.add_delete("/v1/branches/{branch}", cap.delete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield cap, f"http://127.0.0.1:{port}"
    cap.release.set()
    await runner.cleanup()


async def test_branch_headers_fork_end_and_cleanup(capture: tuple[Capture, str], tmp_path: Path) -> None:
    cap, url = capture
    convs = load_claude_code(write_small_trace(tmp_path / "t.jsonl", sessions=1))
    settings = ReplaySettings(url=url, model="m", agents=1, duration_s=2.5, time_scale=20, drain_s=0.5)
    replay = LiveReplay(settings, convs, Metrics(TtftSlo(2, 1e-4), 0.1, 0, 2.5))
    async with aiohttp.ClientSession() as session:
        await replay.run(session)
    assert all(r.outcome.ok and r.outcome.tokens == 2 for r in replay.records)
    main = [h for h in cap.headers if h["x-agentpool-branch"] == "c1-a0"]
    sub = [h for h in cap.headers if h["x-agentpool-branch"] == "c1-a1"]
    assert len(main) == 5 and len(sub) == 2  # the first conversation, whole
    assert sub[0]["x-agentpool-parent-branch"] == "c1-a0"  # the fork
    assert all("x-agentpool-parent-branch" not in h for h in (*main, sub[1]))
    assert [h.get("x-agentpool-branch-end") for h in sub] == [None, "true"]
    assert main[-1]["x-agentpool-branch-end"] == "true"
    # the conversation cut by the end of the run (held after its first request): its open branch
    # was ended with DELETE, and only it
    started = {h["x-agentpool-branch"] for h in cap.headers}
    ended = {h["x-agentpool-branch"] for h in cap.headers if h.get("x-agentpool-branch-end") == "true"}
    assert started - ended == {"c2-a0"}
    assert cap.deleted == ["c2-a0"]
    assert replay.branches_ended_after == 1


async def test_no_branch_headers(capture: tuple[Capture, str], tmp_path: Path) -> None:
    cap, url = capture
    convs = load_claude_code(write_small_trace(tmp_path / "t.jsonl", sessions=1))
    settings = ReplaySettings(
        url=url, model="m", agents=1, duration_s=1.0, time_scale=20, drain_s=5, branch_headers=False
    )
    replay = LiveReplay(settings, convs, Metrics(TtftSlo(2, 1e-4), 0.1, 0, 1.0))
    async with aiohttp.ClientSession() as session:
        await replay.run(session)
    assert cap.headers and all(h == {} for h in cap.headers)
    assert cap.deleted == []
