"""A lean HTTP/1.1 server for the router: asyncio protocols with httptools' request parser (llhttp).

It replaced aiohttp's server, whose per-request machinery (request and response objects,
middlewares, the router, the access-log plumbing) alone cost about 140 us of CPU per request at
concurrency 1, more than the whole of sglang-router (bench/results/router_cpu.md). Parsing is
httptools' (the maintained llhttp binding); this module frames, limits and routes.

- A request is read whole before its handler runs: its body at most ``max_body_bytes`` (413 and the
  connection closed: from ``Content-Length`` before the body arrives, or as a chunked body grows),
  and all of it within ``body_timeout_s`` of its first byte (408 and closed: a slow or partial
  request is not waited for). A connection that closes mid-request is dropped: nobody to answer.
- Malformed requests get 400, an over-long URL 414, too many or too large headers 431, each with
  the connection closed. ``Expect: 100-continue`` is answered.
- Keep-alive: HTTP/1.1 by default, HTTP/1.0 when asked; a connection idle for ``keepalive_s`` is
  closed. Pipelined requests are answered in order (reading pauses while many wait).
- Responses are whole (:class:`Response`, ``Content-Length``) or streamed (:meth:`Request.stream`:
  chunked, with backpressure; a write after the client left raises :class:`ConnectionResetError`).
- A handler that raises gets its client a 500 JSON error and the connection closed; the exception
  is logged with its traceback (:func:`_log_failure`).
- HTTPS with an ``ssl.SSLContext``; when that context verifies client certificates (a client CA),
  :attr:`Request.client_certified` says whether this connection's client presented a valid one.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import cast

import httptools
import orjson

from agentpool.router.openai_api import error_body

log = logging.getLogger(__name__)

MAX_URL_BYTES = 8190
MAX_HEADER_BYTES = 8190  # one header, name and value
MAX_HEADERS = 100
MAX_PIPELINED = 8  # complete requests waiting on one connection before reading pauses
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_METHODS = {m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS")}


@dataclass(slots=True)
class Response:
    status: int
    body: bytes
    content_type: bytes = b"application/json"
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False  # close the connection after it (the rest of the request cannot be trusted)


def json_response(payload: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(status, orjson.dumps(payload), headers=headers or {})


def error_response(
    status: int, message: str, type_: str = "invalid_request_error", code: str | None = None
) -> Response:
    return Response(status, orjson.dumps(error_body(message, type_, code)))


class Request:
    """One request, read whole; ``params``: what a prefix route matched after its prefix."""

    __slots__ = ("_conn", "_stream", "body", "headers", "keep_alive", "method", "params", "path", "query")

    def __init__(
        self,
        conn: _Connection | None,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        keep_alive: bool,
    ) -> None:
        self._conn = conn
        self._stream: Stream | None = None
        self.method, self.path, self.query = method, path, query
        self.headers, self.body, self.keep_alive = headers, body, keep_alive
        self.params = ""

    @property
    def client_certified(self) -> bool:
        """Whether the client presented a certificate the server verified (TLS with a client CA)."""
        return self._conn is not None and self._conn.client_certified

    def stream(self, content_type: bytes, headers: dict[str, str] | None = None) -> Stream:
        """Start a streamed 200 answer (chunked); write to it, the server ends it if the handler does not."""
        if self._conn is None or self._stream is not None:
            raise RuntimeError("this request cannot stream (already streaming, or not on a connection)")
        self._stream = Stream(self._conn, self, content_type, headers or {})
        return self._stream


class Stream:
    __slots__ = ("_chunked", "_conn", "ended")

    def __init__(self, conn: _Connection, req: Request, content_type: bytes, headers: dict[str, str]) -> None:
        self._conn = conn
        self._chunked = conn.http11
        self.ended = False
        extra = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items())
        framing = b"Transfer-Encoding: chunked\r\n" if self._chunked else b"Connection: close\r\n"
        if not self._chunked:
            req.keep_alive = False
        conn.write(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\n%s%s\r\n" % (content_type, extra, framing))

    async def write(self, data: bytes) -> None:
        conn = self._conn
        if conn.lost:
            raise ConnectionResetError("the client closed the connection")
        if data:
            conn.write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        if conn.write_paused:
            await conn.drain()

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            if self._chunked and not self._conn.lost:
                self._conn.write(b"0\r\n\r\n")


Handler = Callable[[Request], Awaitable[Response | Stream]]


class Routes:
    """Exact ``(method, path)`` routes and prefix routes (``DELETE /v1/branches/`` + id)."""

    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Handler]] = {}
        self._prefix: list[tuple[str, str, Handler]] = []

    def add(self, method: str, path: str, handler: Handler) -> None:
        self._exact.setdefault(path, {})[method] = handler
        if method == "GET":
            self._exact[path]["HEAD"] = handler

    def add_prefix(self, method: str, prefix: str, handler: Handler) -> None:
        self._prefix.append((method, prefix, handler))

    def find(self, req: Request) -> Handler | Response:
        by_method = self._exact.get(req.path)
        if by_method is not None:
            handler = by_method.get(req.method)
            if handler is None:
                return error_response(405, f"method {req.method} not allowed")
            return handler
        matched = False
        for method, prefix, handler in self._prefix:
            if (
                req.path.startswith(prefix)
                and len(req.path) > len(prefix)
                and "/" not in req.path[len(prefix) :]
            ):
                matched = True
                if method == req.method:
                    req.params = req.path[len(prefix) :]
                    return handler
        if matched:
            return error_response(405, f"method {req.method} not allowed")
        return error_response(404, f"no route {req.method} {req.path}", code="not_found")


class _Reject(Exception):
    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


class HttpServer:
    """Serves ``routes``; ``max_body_bytes`` and ``body_timeout_s`` are read per request (reloadable)."""

    def __init__(
        self,
        routes: Routes,
        max_body_bytes: Callable[[], int],
        body_timeout_s: Callable[[], float],
        keepalive_s: float = 75.0,
    ) -> None:
        self.routes = routes
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.keepalive_s = keepalive_s
        self.connections: set[_Connection] = set()
        self.client_ca = False
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port. ``ssl_context``: HTTPS; one that
        asks for client certificates verifies them (:attr:`Request.client_certified`)."""
        loop = asyncio.get_running_loop()
        self.client_ca = ssl_context is not None and ssl_context.verify_mode != ssl.CERT_NONE
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, backlog=1024, ssl=ssl_context
        )
        self._sweeper = loop.create_task(self._sweep_idle(), name="http-idle-sweep")
        return int(self._server.sockets[0].getsockname()[1])

    async def _sweep_idle(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self.keepalive_s / 2))
            cutoff = asyncio.get_running_loop().time() - self.keepalive_s
            for conn in list(self.connections):
                if conn.idle_since is not None and conn.idle_since < cutoff:
                    conn.close()

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop listening, close idle connections, give requests in flight ``timeout_s`` to finish."""
        if self._server is None:
            return
        self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            conn.stopping = True
            if not conn.busy:
                conn.close()
                conn.wake()  # its task, waiting for a request, ends
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout_s)
            for task in late:
                task.cancel()
        for conn in list(self.connections):
            conn.close()
        self._server = None


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("request handler failed", exc_info=task.exception())


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.queue: deque[Request] = deque()
        self.task: asyncio.Task[None] | None = None  # serves the connection's requests, made at its first
        self.busy = False  # a request is being served (else the task waits on ``_next`` for one)
        self._next: asyncio.Future[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.reading = False  # a request has begun and is not complete yet
        self.final: Response | None = None  # an error to answer once the queue is served, then close
        self.idle_since: float | None = self.loop.time()
        self.lost = False
        self.stopping = False
        self.read_paused = False
        self.client_certified = False
        self.write_paused = False
        self.http11 = True
        self._drain: asyncio.Future[None] | None = None

    # -- asyncio callbacks ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's does not subclass asyncio.Transport, so no isinstance check)
        self.transport = cast(asyncio.Transport, transport)
        self.server.connections.add(self)
        # with a client CA the handshake verified any certificate presented (a bad one fails it)
        self.client_certified = self.server.client_ca and bool(transport.get_extra_info("peercert"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.server.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("the client closed the connection"))
        self.wake()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.final is not None:
            return  # the connection is being closed: ignore what follows the bad request
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__
            self._reject(cause.response if isinstance(cause, _Reject) else _bad_request(str(e)))
        except httptools.HttpParserUpgrade:
            self._reject(_bad_request("protocol upgrades are not supported"))
        except httptools.HttpParserError as e:
            self._reject(_bad_request(f"malformed HTTP request: {e}"))
        else:
            if self.reading and self.timer is None:
                # a request began in this read and is not whole yet: its body timeout starts now (its
                # first byte came in this read); one read usually brings a request whole, no timer
                self.timer = self.loop.call_later(self.server.body_timeout_s(), self._timed_out)

    # -- httptools callbacks --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url, self.headers, self.body, self.size = b"", {}, [], 0
        self.idle_since = None
        self.reading = True  # until on_message_complete; data_received arms the body timer if needed

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_URL_BYTES:
            raise _Reject(Response(414, orjson.dumps(error_body("URL too long", "invalid_request_error"))))

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) > MAX_HEADER_BYTES or len(self.headers) >= MAX_HEADERS:
            message = "request headers too large"
            raise _Reject(Response(431, orjson.dumps(error_body(message, "invalid_request_error"))))
        self.headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        length = self.headers.get("content-length")
        cap = self.server.max_body_bytes()
        if length is not None and length.isdigit() and int(length) > cap:
            raise _Reject(_too_large(cap))
        if (
            self.headers.get("expect", "").lower() == "100-continue"
            and self.parser.get_http_version() == "1.1"
        ):
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        cap = self.server.max_body_bytes()
        if self.size > cap:
            raise _Reject(_too_large(cap))
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.reading = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        parser = self.parser
        raw = self.url.decode("latin-1")
        path, _, query = raw.partition("?")
        self.http11 = parser.get_http_version() == "1.1"
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        method = parser.get_method()
        req = Request(
            self,
            _METHODS.get(method) or method.decode(),
            path,
            query,
            self.headers,
            body,
            parser.should_keep_alive(),
        )
        self.queue.append(req)
        if not self.busy:
            self.busy = True
            if self.task is None:
                self.task = self.loop.create_task(self._serve())
                self.task.add_done_callback(_log_failure)
            else:
                self.wake()
        elif len(self.queue) >= MAX_PIPELINED and self.transport is not None:
            self.read_paused = True
            self.transport.pause_reading()

    # -- serving --------------------------------------------------------------------------------
    async def _serve(self) -> None:
        """The connection's requests in order; between them it waits for the next (one task for the
        connection, not one per request)."""
        try:
            while not self.lost:
                if not self.queue:
                    if self.final is not None:
                        self._answer(self.final, keep_alive=False)
                        return
                    if self.stopping:
                        self.close()
                        return
                    if self.timer is None:
                        self.idle_since = self.loop.time()
                    self.busy = False
                    self._next = self.loop.create_future()
                    await self._next
                    continue
                req = self.queue.popleft()
                if self.read_paused and self.transport is not None:
                    self.read_paused = False
                    self.transport.resume_reading()
                if not await self._one(req):
                    self.close()
                    return
        except BaseException:
            self.close()
            raise
        finally:
            self.task = None
            self.busy = False
            self._next = None

    def wake(self) -> None:
        """The task waiting for a request looks again (one came, or the connection ends)."""
        waiter = self._next
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _one(self, req: Request) -> bool:
        """Answer ``req``; whether the connection stays open."""
        found = self.server.routes.find(req)
        if isinstance(found, Response):
            return self._answer(found, req.keep_alive, req.method == "HEAD")
        try:
            result = await found(req)
        except BaseException:
            if req._stream is None and not self.lost:
                self._answer(error_response(500, "internal error", "server_error"), keep_alive=False)
            raise
        if isinstance(result, Stream):
            result.end()
            return req.keep_alive and not self.stopping
        return self._answer(result, req.keep_alive and not self.stopping, req.method == "HEAD")

    def _answer(self, resp: Response, keep_alive: bool, head_only: bool = False) -> bool:
        keep = keep_alive and not resp.close and self.final is None
        headers = resp.headers  # most answers have none of their own
        extra = (
            b"".join([b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items()])
            if headers
            else b""
        )
        if not keep:
            extra += b"Connection: close\r\n"
        elif not self.http11:
            extra += b"Connection: keep-alive\r\n"
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
            resp.status,
            _REASONS.get(resp.status, b"Unknown"),
            resp.content_type,
            len(resp.body),
            extra,
        )
        self.write(head if head_only else head + resp.body)
        if not keep:
            self.close()
        return keep

    def _reject(self, resp: Response) -> None:
        """Answer ``resp`` after the requests already read, then close; read nothing more."""
        resp.close = True
        self.final = resp
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.busy:
            self._answer(resp, keep_alive=False)

    def _timed_out(self) -> None:
        self.timer = None
        timeout = self.server.body_timeout_s()
        self._reject(Response(408, orjson.dumps(error_body(
            f"the request did not arrive within {timeout:g} s", "invalid_request_error"))))  # fmt: skip

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.lost and not self.transport.is_closing():
            self.transport.write(data)

    async def drain(self) -> None:
        if self.lost:
            raise ConnectionResetError("the client closed the connection")
        self._drain = self.loop.create_future()
        try:
            await self._drain
        finally:
            self._drain = None

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def _bad_request(message: str) -> Response:
    return Response(400, orjson.dumps(error_body(message, "invalid_request_error", "bad_request")))


def _too_large(cap: int) -> Response:
    message = f"request body too large: more than {cap} bytes"
    return Response(413, orjson.dumps(error_body(message, "invalid_request_error", "body_too_large")))
