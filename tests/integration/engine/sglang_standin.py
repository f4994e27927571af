"""A stand-in for ``python -m sglang.launch_server`` (SGLang needs GPUs): the engine agent launches it
with the arguments it would give SGLang, and it answers SGLang's endpoints and publishes SGLang's KV
events, frame for frame, so the agent's sglang backend runs end to end on a CPU machine.

``sglang_standin.py --record FILE [--load-s S] -- <SGLang arguments>``: writes its arguments to FILE,
answers ``/health`` with 503 for S seconds (model loading), then serves:

- ``POST /generate`` (``input_ids``, ``sampling_params.max_new_tokens``, ``stream``, ``rid``, bootstrap
  fields): words ``w0 w1 ...``, streamed as ``data: {json}`` lines with the text so far and
  ``meta_info`` (``cached_tokens`` from its prefix cache), then ``data: [DONE]``; ``stream: false``
  answers one JSON object. A prefill publishes ``BlockStored`` for its new full pages, on ``GPU``
  and, with ``--enable-hierarchical-cache`` (write-through), on ``CPU_PINNED``;
- ``GET /v1/loads``, ``POST /pause_generation``, ``/continue_generation``, ``/pd_role_switch`` (only
  while paused; clears the prefix cache and publishes ``AllBlocksCleared``, as SGLang does),
  ``/abort_request``;
- ``GET /standin/requests``: the generate payloads it got (for the tests).
SIGTERM: exits 0 after printing ``stand-in stopped``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from aiohttp import web

sys.path.insert(0, str(Path(__file__).parents[2] / "unit" / "engine"))
from sglang_frames import cleared, message, stored


def sglang_hash(parent: int | None, tokens: list[int]) -> int:
    """A 63-bit block hash of SGLang's own kind (not ours: the agent maps them by token ids)."""
    h = hashlib.sha256(f"{parent}:{tokens}".encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


class StandIn:
    def __init__(self, args: argparse.Namespace) -> None:
        self.page = args.page_size
        self.role = args.disaggregation_mode or "null"
        self.write_through = args.enable_hierarchical_cache
        kv = json.loads(args.kv_events_config)
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(kv["endpoint"])
        self.topic = kv["topic"]
        self.seq = 0
        self.ready_at = time.monotonic() + args.load_s
        self.paused = False
        self.unpaused = asyncio.Event()
        self.unpaused.set()
        self.cache: dict[tuple[int, ...], int] = {}  # page-aligned prefix -> SGLang block hash
        self.requests: list[dict[str, Any]] = []
        self.running = 0
        self.aborted: list[str] = []
        self.calls: list[str] = []

    async def publish(self, events: list[Any]) -> None:
        await self.pub.send_multipart(message(self.seq, events, topic=self.topic))
        self.seq += 1

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/v1/loads", self.loads)
        app.router.add_post("/pause_generation", self.pause)
        app.router.add_post("/continue_generation", self.resume)
        app.router.add_post("/pd_role_switch", self.switch)
        app.router.add_post("/abort_request", self.abort)
        app.router.add_get("/standin/requests", self.recorded)
        return app

    async def health(self, r: web.Request) -> web.Response:
        if time.monotonic() < self.ready_at:
            return web.Response(status=503, text="loading")
        return web.Response(text="")

    async def prefill(self, ids: list[int]) -> int:
        """Cache the prompt's full pages; publish what is new. Returns the tokens found cached."""
        cached = 0
        parent: int | None = None
        new_hashes: list[int] = []
        new_tokens: list[int] = []
        first_parent: int | None = None
        for i in range(0, len(ids) - len(ids) % self.page, self.page):
            key = tuple(ids[: i + self.page])
            if key in self.cache:
                cached = i + self.page
                parent = self.cache[key]
                continue
            h = sglang_hash(parent, ids[i : i + self.page])
            if not new_hashes:
                first_parent = parent
            self.cache[key] = h
            new_hashes.append(h)
            new_tokens.extend(ids[i : i + self.page])
            parent = h
        if new_hashes:
            events = [stored(new_hashes, first_parent, new_tokens, self.page, "GPU")]
            if self.write_through:
                events.append(stored(new_hashes, first_parent, new_tokens, self.page, "CPU_PINNED"))
            await self.publish(events)
        return cached

    async def generate(self, r: web.Request) -> web.StreamResponse:
        body = await r.json()
        self.requests.append(body)
        ids = body["input_ids"]
        n = body.get("sampling_params", {}).get("max_new_tokens", 16)
        if not ids or not isinstance(n, int) or n < 1:
            return web.json_response({"error": {"message": "bad request"}}, status=400)
        await self.unpaused.wait()
        self.running += 1
        try:
            cached = 0 if self.role == "decode" else await self.prefill(ids)
            meta = {"id": body.get("rid"), "prompt_tokens": len(ids), "cached_tokens": cached}
            if not body.get("stream"):
                fin = {"type": "length", "length": 1}
                out = {"text": "w0 ", "meta_info": meta | {"completion_tokens": 1, "finish_reason": fin}}
                return web.json_response(out)
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(r)
            text = ""
            for i in range(n):
                if body.get("rid") in self.aborted:
                    fin = {"type": "abort", "message": "aborted"}
                    chunk = {"text": text, "meta_info": meta | {"completion_tokens": i, "finish_reason": fin}}
                    await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    break
                await asyncio.sleep(0.02)
                text += f"w{i} "
                fin = {"type": "length", "length": n} if i == n - 1 else None
                chunk = {"text": text, "meta_info": meta | {"completion_tokens": i + 1, "finish_reason": fin}}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            self.running -= 1

    async def loads(self, r: web.Request) -> web.Response:
        rank = {
            "dp_rank": 0,
            "num_running_reqs": self.running,
            "num_waiting_reqs": 0,
            "num_waiting_uncached_tokens": 0,
            "num_used_tokens": 1000 * self.running,
            "max_total_num_tokens": 500000,
            "token_usage": 0.0,
        }
        body = {"timestamp": "2026-12-01T00:00:00Z", "version": "stand-in", "loads": [rank]}
        return web.json_response(body)

    async def pause(self, r: web.Request) -> web.Response:
        self.calls.append("pause")
        self.paused = True
        self.unpaused.clear()
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def resume(self, r: web.Request) -> web.Response:
        self.calls.append("continue")
        self.paused = False
        self.unpaused.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def switch(self, r: web.Request) -> web.Response:
        body = await r.json()
        self.calls.append(f"switch:{body.get('new_role')}")
        if not self.paused or body.get("new_role") not in ("prefill", "decode"):
            out = {"success": False, "message": "instance is not idle", "old_role": self.role, "new_role": ""}
            return web.json_response(out, status=400)
        old, self.role = self.role, body["new_role"]
        self.cache.clear()  # SGLang flushes its prefix cache, host tier included
        await self.publish([cleared()])
        return web.json_response({"success": True, "message": "", "old_role": old, "new_role": self.role})

    async def abort(self, r: web.Request) -> web.Response:
        self.aborted.append((await r.json()).get("rid"))
        return web.json_response({})

    async def recorded(self, r: web.Request) -> web.Response:
        return web.json_response({"requests": self.requests, "calls": self.calls, "aborted": self.aborted})


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--record", type=Path, required=True)
    p.add_argument("--load-s", type=float, default=0.3)
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--page-size", type=int, required=True)
    p.add_argument("--disaggregation-mode")
    p.add_argument("--kv-events-config", required=True)
    p.add_argument("--enable-hierarchical-cache", action="store_true")
    args, _ = p.parse_known_args()
    args.record.write_text(json.dumps(sys.argv[1:]))
    s = StandIn(args)
    runner = web.AppRunner(s.app())
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    print(f"stand-in serving on {args.host}:{args.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()
    s.pub.close()
    s.ctx.term()
    print("stand-in stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
