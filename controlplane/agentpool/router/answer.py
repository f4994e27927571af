"""The flow's answer to the client: whole (one JSON body) or streamed as SSE (the stream starts at the
first text; a failure before it is answered as a plain error, one after it ends the stream with an
error event), with the request's metrics and the branch's end once it is answered.

:func:`answer` serves the chat and completion routes of :mod:`agentpool.router.server`;
:func:`flow_error` gives a :class:`~agentpool.router.flow_types.FlowError` its HTTP status and
OpenAI's error type and code.
"""

from __future__ import annotations

import contextlib
import logging
import time

import orjson

from agentpool.errors import http_status
from agentpool.router.directory_view import DirectoryError
from agentpool.router.flow_types import (
    BadRequest,
    Finish,
    FlowError,
    NoCapacity,
    Output,
    Overloaded,
    Prepared,
)
from agentpool.router.http_server import Request, Response, Stream
from agentpool.router.openai_api import (
    TokenFrames,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    error_body,
    sse,
    usage_chunk,
)
from agentpool.router.service import RouterService

log = logging.getLogger(__name__)

SSE_HEADERS = {"cache-control": "no-cache"}


def flow_response(e: FlowError, type_: str, code: str, headers: dict[str, str] | None = None) -> Response:
    """``e`` in OpenAI's shape with its kind's status."""
    body = orjson.dumps(error_body(str(e), type_, code, None))
    return Response(http_status(e), body, headers=headers or {})


def flow_error(e: FlowError, retry_after: int) -> Response:
    """The status is the kind's (:func:`agentpool.errors.http_status`); OpenAI's type and code name it."""
    if isinstance(e, Overloaded):
        return flow_response(e, "rate_limit_error", "overloaded", {"Retry-After": str(retry_after)})
    if isinstance(e, NoCapacity):
        return flow_response(e, "server_error", "no_capacity", {"Retry-After": str(retry_after)})
    if isinstance(e, BadRequest):
        return flow_response(e, "invalid_request_error", e.code)
    return flow_response(e, "server_error", "engine_failed")


class _Collected(Output):
    """A non-streamed answer's text, as the flow gives it."""

    __slots__ = ("first_at", "parts")

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.first_at: float | None = None

    async def chunk(self, text: str) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
        self.parts.append(text)


class _Sse(Output):
    """A streamed answer: its SSE stream starts at the first text (a failure before it is answered
    as a plain error), each text one frame."""

    __slots__ = ("chat", "count", "created", "first_at", "frames", "model", "request", "resp", "rid")

    def __init__(self, request: Request, prep: Prepared, model: str) -> None:
        super().__init__()
        self.request, self.rid, self.model = request, prep.request_id, model
        self.chat = prep.endpoint == "chat"
        self.created = int(time.time())
        self.frames = TokenFrames(self.chat, self.rid, model, self.created)
        self.resp: Stream | None = None
        self.count = 0
        self.first_at: float | None = None

    async def begin(self) -> Stream:
        if self.first_at is None:
            self.first_at = time.monotonic()
        resp = self.resp = self.request.stream(b"text/event-stream", SSE_HEADERS)
        if self.chat:
            role = {"role": "assistant", "content": ""}
            await resp.write(sse(chat_chunk(self.rid, self.model, self.created, role, None)))
        return resp

    async def chunk(self, text: str) -> None:
        resp = self.resp
        if resp is None:
            resp = await self.begin()
        self.count += 1
        await resp.write(self.frames.token(text))

    async def finish(self, item: Finish, include_usage: bool) -> None:
        resp = self.resp
        if resp is None:
            resp = await self.begin()
        rid, model, created = self.rid, self.model, self.created
        if self.chat:
            await resp.write(sse(chat_chunk(rid, model, created, {}, item.finish_reason)))
        else:
            await resp.write(sse(completion_chunk(rid, model, created, "", item.finish_reason)))
        if include_usage:
            obj = "chat.completion.chunk" if self.chat else "text_completion"
            await resp.write(sse(usage_chunk(rid, model, created, obj, item.usage)))
        await resp.write(sse("[DONE]"))

    async def fail(self, e: FlowError) -> None:
        """The stream ends with an error event: the client has had text already."""
        assert self.resp is not None
        log.warning("request %s failed mid-stream: %s", self.rid, e)
        await self.resp.write(sse(error_body(f"generation failed: {e}", "server_error", "engine_failed")))
        await self.resp.write(sse("[DONE]"))


async def answer(
    request: Request,
    service: RouterService,
    prep: Prepared,
    stream: bool,
    include_usage: bool,
    model: str,
    end_branch: bool,
) -> Response | Stream:
    """The flow's answer: whole, or streamed as SSE (one coroutine: the flow puts its text to an
    :class:`~agentpool.router.flow_types.Output`)."""
    t0 = time.monotonic()
    out: _Collected | _Sse = _Sse(request, prep, model) if stream else _Collected()
    tokens = 0
    code = "200"
    try:
        try:
            finish = await service.dispatcher.run(prep, out)
        except FlowError as e:
            if isinstance(out, _Sse) and out.resp is not None:
                tokens = out.count
                await out.fail(e)
                out.resp.end()
                return out.resp
            error = flow_error(e, service.config.retry_after_s)
            code = str(error.status)
            return error
        if out.first_at is None:
            out.first_at = time.monotonic()
        if isinstance(out, _Collected):
            tokens = finish.usage.completion_tokens or len(out.parts)
            make = chat_response if prep.endpoint == "chat" else completion_response
            body = make(prep.request_id, model, "".join(out.parts), finish.finish_reason, finish.usage)
            return Response(200, orjson.dumps(body))
        tokens = out.count
        await out.finish(finish, include_usage)
        resp = out.resp
        assert resp is not None
        resp.end()
        return resp
    except ConnectionResetError:  # the client went away mid-stream: the flow stopped generating
        if not isinstance(out, _Sse) or out.resp is None:
            raise
        code = "499"
        log.info("client of %s disconnected mid-stream", prep.request_id)
        tokens = out.count
        return out.resp
    finally:
        service.dispatcher.work_log.finished(prep.request_id, tokens)
        done = time.monotonic()
        policy = service.routing.policy.name
        stats = service.metrics
        stats.child(stats.requests, prep.endpoint, code).inc()
        first_at = out.first_at
        if first_at is not None:
            stats.child(stats.ttft, policy).observe(first_at - t0)
            stats.child(stats.e2e, policy).observe(done - t0)
            if tokens > 1:
                stats.child(stats.tpot, policy).observe((done - first_at) / (tokens - 1))
        if end_branch and prep.branch is not None:
            with contextlib.suppress(DirectoryError, TimeoutError):
                await service.end_branch(prep.branch)
