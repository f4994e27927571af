"""The sglang backend's I/O parts against stand-ins: a real ZMQ publisher sending SGLang's frames,
and a real HTTP server speaking SGLang's switch and load endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio
from aiohttp import ClientSession, web

sys.path.insert(0, str(Path(__file__).parents[2] / "unit" / "engine"))
from sglang_frames import Recorder, message, removed, stored

from agentpool.engine.sglang.control import SglangControl, SglangError
from agentpool.engine.sglang.events import SglangKvMirror
from agentpool.engine.sglang.zmq_bridge import ZmqKvBridge
from agentpool.kv import Tier, block_hashes
from agentpool.node import Role

pytestmark = pytest.mark.integration


async def test_the_bridge_follows_a_zmq_publisher_and_resyncs_after_a_gap() -> None:
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    rec = Recorder()
    gaps: list[int] = []
    mirror = SglangKvMirror(4, rec)
    bridge = ZmqKvBridge(
        f"tcp://127.0.0.1:{port}", "kv", mirror, lambda: gaps.append(mirror.last_seq or 0), ctx
    )
    task = asyncio.create_task(bridge.run())
    tokens = list(range(40, 52))
    try:
        # a PUB socket drops messages until the subscription arrives: publish until the first one lands
        for _ in range(200):
            await pub.send_multipart(message(0, []))
            await asyncio.sleep(0.01)
            if bridge.received:
                break
        assert bridge.received
        await pub.send_multipart(message(1, [stored([101, 102, 103], None, tokens, 4, "GPU")]))
        await pub.send_multipart(message(2, [removed([103], "GPU")]))
        await pub.send_multipart([b"kv", b"\x00" * 8, b"garbage"])
        await pub.send_multipart(message(5, []))  # 3 and 4 were lost
        await pub.send_multipart(message(0, [], topic="other"))  # another topic: not subscribed
        for _ in range(200):
            if gaps and bridge.bad_frames:
                break
            await asyncio.sleep(0.01)
        ours = block_hashes(tokens, 4)
        assert rec.events == [("stored", ours, Tier.GPU), ("removed", ours[2:], Tier.GPU)]
        assert gaps == [5] and bridge.bad_frames == 1
        assert [b.block_hash for b in mirror.held_blocks()] == ours[:2]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        pub.close()
        ctx.term()


class SglangStandIn:
    """SGLang's control endpoints as its HTTP server answers them (the switch needs a paused server)."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.paused = False
        self.role = "prefill"
        self.refuse = refuse

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/pause_generation", self.pause)
        app.router.add_post("/continue_generation", self.resume)
        app.router.add_post("/pd_role_switch", self.switch)
        app.router.add_get("/v1/loads", self.loads)
        return app

    async def pause(self, r: web.Request) -> web.Response:
        self.calls.append(("pause", await r.json()))
        self.paused = True
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def resume(self, r: web.Request) -> web.Response:
        self.calls.append(("continue", await r.json()))
        self.paused = False
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def switch(self, r: web.Request) -> web.Response:
        body = await r.json()
        self.calls.append(("switch", body))
        if self.refuse or not self.paused:
            out = {"success": False, "message": "instance is not idle", "old_role": self.role, "new_role": ""}
            return web.json_response(out, status=400)
        old, self.role = self.role, body["new_role"]
        return web.json_response({"success": True, "message": "", "old_role": old, "new_role": self.role})

    async def loads(self, r: web.Request) -> web.Response:
        rank = {
            "dp_rank": 0,
            "num_running_reqs": 3,
            "num_waiting_reqs": 2,
            "num_waiting_uncached_tokens": 900,
        }
        rank |= {"num_used_tokens": 5000, "max_total_num_tokens": 100000, "token_usage": 0.05}
        body = {
            "timestamp": "2026-12-01T00:00:00Z",
            "version": "0.5.23",
            "loads": [rank, rank | {"dp_rank": 1}],
        }
        return web.Response(text=json.dumps(body), content_type="application/json")


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> Any:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_switch_pauses_switches_and_continues() -> None:
    sg = SglangStandIn()
    async with serve(sg.app()) as url, ClientSession() as http:
        control = SglangControl(url, http)
        times = await control.switch(Role.DECODE)
        assert sg.role == "decode" and not sg.paused
        assert [c[0] for c in sg.calls] == ["pause", "switch", "continue"]
        assert sg.calls[0][1] == {"mode": "retract"} and sg.calls[1][1] == {"new_role": "decode"}
        assert 0 <= times.pause_s <= times.total_s
        load = await control.load()
        assert (load.running, load.waiting, load.used_tokens, load.capacity_tokens) == (6, 4, 10000, 200000)
        with pytest.raises(SglangError, match="colocated"):
            await control.switch(Role.BOTH)
        assert not sg.paused


async def test_a_refused_switch_still_continues_generation() -> None:
    sg = SglangStandIn(refuse=True)
    async with serve(sg.app()) as url, ClientSession() as http:
        with pytest.raises(SglangError, match="not idle"):
            await SglangControl(url, http).switch(Role.DECODE)
        assert [c[0] for c in sg.calls] == ["pause", "switch", "continue"] and not sg.paused
        assert sg.role == "prefill"
    with pytest.raises(SglangError):  # the server is gone
        async with ClientSession() as http:
            await SglangControl(url, http, timeout_s=2).load()
