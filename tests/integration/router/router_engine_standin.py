"""A small real HTTP engine that speaks the router's engine protocol, for router tests.

It stands in for the sim engine backend until that lands: a real aiohttp server on 127.0.0.1:0 that
runs one prefill at a time (so requests queue), streams tokens, hands KV over to a decode stand-in
(the decode side pulls ``GET /agentpool/v1/kv/{transfer_id}`` from the prefill side over HTTP),
gives queued requests back with ``requeue`` while draining, and can be killed mid-queue.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from agentpool.wire.engine import GenerateRequest


@dataclass
class StandIn:
    node_id: str
    prefill_s: float = 0.0
    token_s: float = 0.0
    tokens: int = 4
    fail_after_tokens: int | None = None
    draining: bool = False
    # requests whose body contains this text are refused for their content (HTTP 400, or an
    # ``error`` event with status 400 when ``reject_in_stream``), as a real engine refuses bad input
    reject_marker: str | None = None
    reject_in_stream: bool = False
    # prompts longer than this are refused as the sim engine refuses them (400 ``ContextLengthError``)
    context_length: int | None = None
    # the first token's text in ``prefilled`` ("": the decode node streams every token, as on SGLang)
    first_text: str = "first "
    # the most requests at once that have arrived and not yet started to decode (or been handed off)
    waiting: int = 0
    max_waiting: int = 0
    received: list[GenerateRequest] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    transfers: dict[str, int] = field(default_factory=dict)
    url: str = ""
    _runner: web.AppRunner | None = None
    _busy: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    _session: aiohttp.ClientSession | None = None

    async def start(self) -> StandIn:
        app = web.Application()
        app.router.add_post("/agentpool/v1/generate", self._generate)
        app.router.add_get("/agentpool/v1/kv/{transfer}", self._kv)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._session = aiohttp.ClientSession()
        return self

    async def kill(self) -> None:
        """Stop serving at once: open connections are dropped, queued requests get no answer."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _kv(self, request: web.Request) -> web.Response:
        transfer = request.match_info["transfer"]
        if transfer not in self.transfers:
            return web.json_response({"error": "unknown transfer"}, status=404)
        return web.json_response({"transfer_id": transfer, "tokens": self.transfers.pop(transfer)})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        req = GenerateRequest.model_validate(await request.json())
        self.received.append(req)
        rejected = self.reject_marker is not None and self.reject_marker in json.dumps(req.body)
        too_long_here = self.reject_marker is not None and "TOO-LONG" in json.dumps(req.body)
        over_context = self.context_length is not None and len(req.prompt_token_ids) > self.context_length
        if over_context or (too_long_here and "TOO-LONG-IN-STREAM" not in json.dumps(req.body)):
            # as the sim engine refuses a request over its context (its error type names it)
            too_long = {"type": "ContextLengthError", "message": "more than this engine's context length"}
            return web.json_response({"error": too_long}, status=400)
        if rejected and not self.reject_in_stream:
            return web.json_response({"error": "bad request content"}, status=400)
        resp = web.StreamResponse(headers={"content-type": "application/x-ndjson"})
        await resp.prepare(request)

        async def send(event: dict[str, Any]) -> None:
            await resp.write((json.dumps(event) + "\n").encode())

        if too_long_here:  # as the sglang backend passes on SGLang's own refusal, mid-stream
            message = "SGLang: The input is longer than the model's context length"
            await send({"type": "error", "message": message, "status": 400, "reason": "ContextLengthError"})
            return resp
        if rejected:
            await send({"type": "error", "message": "bad request content", "status": 400})
            return resp
        if req.phase != "decode":
            self.waiting += 1
            self.max_waiting = max(self.max_waiting, self.waiting)
            try:
                return await self._prefill(req, resp, send)
            finally:
                self.waiting -= 1
        await self._decode(req, send)
        return resp

    async def _prefill(self, req: GenerateRequest, resp: web.StreamResponse, send: Any) -> web.StreamResponse:

        async with self._busy:
            if self.draining:
                self.requeued.append(req.request_id)
                await send({"type": "requeue", "reason": f"{self.node_id} is draining"})
                return resp
            await send({"type": "started"})
            await asyncio.sleep(self.prefill_s)
        self.waiting -= 1
        try:
            if req.phase == "prefill":
                transfer = f"{self.node_id}-{req.request_id}"
                self.transfers[transfer] = len(req.prompt_token_ids)
                await send({"type": "prefilled", "transfer_id": transfer, "text": self.first_text})
                self.completed.append(req.request_id)
            else:
                await self._tokens(req, send, 0)
        finally:
            self.waiting += 1  # the caller takes it off again
        return resp

    async def _decode(self, req: GenerateRequest, send: Any) -> None:
        assert req.kv_source is not None and self._session is not None
        async with self._session.get(f"{req.kv_source.url}/agentpool/v1/kv/{req.kv_source.transfer_id}") as r:
            if r.status != 200:
                await send({"type": "error", "message": f"kv transfer failed: {r.status}"})
                return
        await self._tokens(req, send, 1)

    async def _tokens(self, req: GenerateRequest, send: Any, start: int) -> None:
        limit = req.body.get("max_tokens") or req.body.get("max_completion_tokens") or self.tokens
        n = min(int(limit), self.tokens)
        for i in range(start, n):
            if self.fail_after_tokens is not None and i >= self.fail_after_tokens:
                await asyncio.sleep(0.05)  # let the tokens already written reach the router
                raise ConnectionResetError("stand-in fails mid-stream")
            try:
                await send({"type": "token", "text": f"tok{i} "})
            except ConnectionResetError:  # the router hung up
                self.aborted.append(req.request_id)
                return
            if self.token_s:
                await asyncio.sleep(self.token_s)
        usage = {
            "prompt_tokens": len(req.prompt_token_ids),
            "completion_tokens": n,
            "prompt_tokens_details": {"cached_tokens": req.cached_tokens},  # OpenAI's field, passed through
        }
        await send({"type": "done", "finish_reason": "length" if n == limit else "stop", "usage": usage})
        self.completed.append(req.request_id)
