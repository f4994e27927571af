"""HTTP client for the engine protocol (:mod:`agentpool.wire.engine`), with timeouts.

A lean HTTP/1.1 client: asyncio protocols with httptools' response parser (llhttp) on persistent
connections kept per engine, one request at a time on each. It replaced an aiohttp session, whose
per-request machinery was the largest single cost of the router's shell (bench/results/router_cpu.md).

- A pooled connection the engine closed while idle is detected before reuse; a reused connection that
  fails before any byte of the answer is retried once on a new one (not the engine's fault).
- A stream the router stops reading (the client went away) closes its connection: it is never reused
  half-read. A response over ``MAX_BUFFER`` unread bytes pauses reading from the engine.
- Timeouts: connecting (``connect_s``), the first event (``first_event_s``) and each later event
  (``between_events_s``).
- Authentication: with ``authorization`` (``Bearer <the pool's engine token>``) every request
  carries it as its ``Authorization`` header; an engine that refuses it (401) is an :class:`EngineFailure`
  that says so.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

import httptools
import orjson

from agentpool.errors import InvalidInputError, UnavailableError, UpstreamError
from agentpool.router.engine_lines import EventLines
from agentpool.router.openai_api import CONTEXT_LENGTH_EXCEEDED, REJECTED_BY_ENGINE
from agentpool.wire.engine import TOO_LONG, AnyEvent, GenerateRequest, encode_generate, parse_event

GENERATE_PATH = "/agentpool/v1/generate"
# Unread response bytes at which reading from the engine pauses (resumes below half of it).
MAX_BUFFER = 1 << 20
# Idle connections kept per engine.
MAX_IDLE = 256


class EngineFailure(UpstreamError):
    """The engine could not be reached, failed, timed out or broke the protocol."""


class EngineRejected(InvalidInputError):
    """The engine refused the request for its content (HTTP 400/413/422, or an ``error`` event with a
    4xx ``status``), or the request could not be encoded: the request's fault, not the engine's.
    ``code``: OpenAI's error code for the client (``context_length_exceeded`` when the engine's error
    type says the request is longer than it takes)."""

    def __init__(self, message: str, code: str = REJECTED_BY_ENGINE) -> None:
        super().__init__(message)
        self.code = code


def rejection_code(body: str) -> str:
    """OpenAI's error code for an engine's refusal, from the error ``type`` of its JSON body."""
    try:
        kind = orjson.loads(body)["error"]["type"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return REJECTED_BY_ENGINE
    return code_for_kind(kind)


def code_for_kind(kind: object) -> str:
    """OpenAI's error code for the engine's error kind (a 400's ``type``, an ``error`` event's ``reason``)."""
    return CONTEXT_LENGTH_EXCEEDED if kind == TOO_LONG else REJECTED_BY_ENGINE


# engine answers that blame the request, not the engine
REJECTED_STATUSES = frozenset((400, 413, 422))


class EngineBusy(UnavailableError):
    """The engine refused the request without failing (HTTP 429/503): route it elsewhere."""


class _ConnectionLost(Exception):
    """The connection closed or broke; ``started``: whether any of the answer had arrived."""

    def __init__(self, message: str, started: bool) -> None:
        super().__init__(message)
        self.started = started


@dataclass(slots=True)
class _Target:
    """An engine URL's address and request line parts, with its idle connections (not a dict key:
    hashing a dataclass twice per request cost more than the rest of the pool's bookkeeping)."""

    host: str
    port: int
    tls: bool
    path: bytes
    host_header: bytes
    idle: list[_Connection] = field(default_factory=list)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; its current response's body is read with ``read_nowait``/``readany``."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()  # made by the loop's create_connection
        self.transport: asyncio.Transport | None = None
        # one parser for the connection's responses: llhttp reads keep-alive responses one after
        # another (a connection whose response was not read to its end is closed, never reused)
        self._parser = httptools.HttpResponseParser(self)
        self._buf = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._deadline: float | None = None  # of the current wait
        self._timer: asyncio.TimerHandle | None = None  # at ``_timer_at``, not before the deadline
        self._timer_at = 0.0
        self._paused = False
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.started = False
        self.lost: BaseException | None = None
        self.keep_alive = True

    # -- protocol callbacks (asyncio and httptools) ---------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's does not subclass asyncio.Transport, so no isinstance check)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.started = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(e)
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("the engine closed the connection"))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._buf += body
        if len(self._buf) > MAX_BUFFER and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- helpers --------------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        if self.lost is None:
            self.lost = exc
        self.keep_alive = False
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    @property
    def has_body(self) -> bool:
        return bool(self._buf)

    async def wait(self, deadline: float | None = None) -> None:
        """Until the connection has news; ``TimeoutError`` at ``deadline`` (the loop's clock).

        One timer for the connection, not one per wait: a wait sets its deadline, and a timer is
        armed only when none is armed for that moment or earlier; when it fires it fails the wait
        whose deadline passed, or is armed again for the current wait's (later) deadline. A request
        on a kept-alive connection then makes no timer (the first one fires once a timeout)."""
        loop = self.loop
        waiter = self._waiter = loop.create_future()
        if deadline is not None:
            self._deadline = deadline
            if self._timer is None or deadline < self._timer_at:
                self._arm(deadline)
        try:
            await waiter
        finally:
            self._waiter = None
            self._deadline = None

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(when, self._check_deadline)
        self._timer_at = when

    def _check_deadline(self) -> None:
        self._timer = None
        deadline, waiter = self._deadline, self._waiter
        if deadline is None or waiter is None or waiter.done():
            return  # no wait now: armed again by the next one
        if deadline <= self.loop.time():
            waiter.set_exception(TimeoutError())
        else:
            self._arm(deadline)

    @property
    def reusable(self) -> bool:
        t = self.transport
        return self.lost is None and self.keep_alive and t is not None and not t.is_closing()

    def send(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        self._buf.clear()
        self.status, self.headers_done, self.complete, self.started = 0, False, False, False
        self.transport.write(head + body)

    async def headers(self, deadline: float) -> int:
        while not self.headers_done:
            if self.lost is not None:
                raise _ConnectionLost(str(self.lost) or type(self.lost).__name__, self.started)
            await self.wait(deadline)
        return self.status

    def read_nowait(self) -> bytes:
        data = bytes(self._buf)
        self._buf.clear()
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def readany(self) -> bytes:
        """Body bytes as they arrive; ``b""`` at the end of the response."""
        while not self._buf:
            if self.complete:
                return b""
            if self.lost is not None:
                raise _ConnectionLost(str(self.lost) or type(self.lost).__name__, True)
            await self.wait()
        return self.read_nowait()

    def close(self) -> None:
        self.keep_alive = False
        if self.transport is not None:
            self.transport.close()


class EngineClient:
    """Streams engine events (:func:`~agentpool.wire.engine.parse_event`) from ``generate`` calls
    over pooled connections."""

    def __init__(
        self,
        connect_s: float,
        first_event_s: float,
        between_events_s: float,
        authorization: str | None = None,
    ) -> None:
        self._auth_line = b"" if authorization is None else b"Authorization: %s\r\n" % authorization.encode()
        self.connect_s = connect_s
        self.first_event_s = first_event_s
        self.between_events_s = between_events_s
        self._targets: dict[str, _Target] = {}  # per engine URL, with its idle connections
        self._ssl: ssl.SSLContext | None = None
        self._started = False
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._started = True

    async def close(self) -> None:
        self._started = False
        for task in list(self._pending):
            task.cancel()
        for t in self._targets.values():
            for c in t.idle:
                c.close()
            t.idle.clear()

    def _target(self, url: str) -> _Target:
        t = self._targets.get(url)
        if t is None:
            parts = urlsplit(url)
            tls = parts.scheme == "https"
            if parts.hostname is None:
                raise EngineFailure(f"engine url {url!r} has no host")
            port = parts.port or (443 if tls else 80)
            path = (parts.path.rstrip("/") + GENERATE_PATH).encode()
            t = self._targets[url] = _Target(parts.hostname, port, tls, path, parts.netloc.encode())
        return t

    async def _connect(self, t: _Target) -> _Connection:
        loop = asyncio.get_running_loop()
        context = None
        if t.tls:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        async with asyncio.timeout(self.connect_s):
            _, conn = await loop.create_connection(_Connection, t.host, t.port, ssl=context)
        return conn

    def _release(self, t: _Target, conn: _Connection) -> None:
        idle = t.idle
        if conn.reusable and self._started and len(idle) < MAX_IDLE:
            idle.append(conn)
        else:
            conn.close()

    async def _send(self, t: _Target, head: bytes, body: bytes) -> tuple[_Connection, int]:
        """The connection the answer's headers came back on, and their status."""
        idle = t.idle
        while idle:
            conn = idle.pop()
            if not conn.reusable:
                conn.close()
                continue
            conn.send(head, body)
            try:
                return conn, await conn.headers(conn.loop.time() + self.first_event_s)
            except _ConnectionLost as e:
                conn.close()
                if e.started:
                    raise
                # the engine closed this idle connection as we reused it: try a new one
            except BaseException:
                conn.close()
                raise
        conn = await self._connect(t)
        conn.send(head, body)
        try:
            return conn, await conn.headers(conn.loop.time() + self.first_event_s)
        except BaseException:
            conn.close()
            raise

    def open(self, url: str, request: GenerateRequest | bytes) -> EngineCall:
        """A ``generate`` call to ``url`` (``request``: the model, or its JSON,
        :func:`agentpool.wire.engine.generate_body`), not yet sent: :meth:`EngineCall.next` sends it
        and gives its events one by one; :meth:`EngineCall.close` ends it."""
        return EngineCall(self, url, request)

    def generate(self, url: str, request: GenerateRequest | bytes) -> AsyncGenerator[AnyEvent, None]:
        """The call's events as an async generator (:meth:`EngineCall.events`)."""
        return EngineCall(self, url, request).events()

    async def _some(self, conn: _Connection) -> bytes:
        """Up to 500 bytes of an error answer (bounded in time)."""
        try:
            async with asyncio.timeout(self.between_events_s):
                return (await conn.readany())[:500]
        except (TimeoutError, _ConnectionLost):
            return b""

    def _release_when_complete(self, t: _Target, conn: _Connection) -> None:
        """Pool ``conn`` once its response ended (the chunked terminator often arrives after the last
        event); close it if more body comes, it breaks, or the end takes over a second."""
        if conn.complete:
            self._release(t, conn)
            return
        task = asyncio.get_running_loop().create_task(self._await_complete(t, conn))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _await_complete(self, t: _Target, conn: _Connection) -> None:
        try:
            async with asyncio.timeout(1.0):
                while not conn.complete and conn.lost is None and not conn.has_body:
                    await conn.wait()
        except TimeoutError:
            conn.close()
            return
        if conn.complete and not conn.has_body:
            self._release(t, conn)
        else:
            conn.close()


class EngineCall:
    """One ``generate`` call: :meth:`next` sends the request (at its first call) and returns the
    engine's events one at a time (``finished`` once a ``done``, ``error`` or ``requeue`` came);
    :meth:`close` pools the connection when the answer was read to its end, else closes it. One
    coroutine per event and no async generator: this runs for every event of every request."""

    __slots__ = ("_client", "_conn", "_lines", "_request", "_target", "_wait", "finished", "url")

    def __init__(self, client: EngineClient, url: str, request: GenerateRequest | bytes) -> None:
        self._client = client
        self.url = url
        self._request = request
        self._target: _Target | None = None
        self._conn: _Connection | None = None
        self._lines: EventLines | None = None
        self._wait = client.first_event_s
        self.finished = False

    async def _start(self) -> EventLines:
        client, url, request = self._client, self.url, self._request
        if not client._started:
            raise RuntimeError("EngineClient.start() was not called")
        try:
            body = request if isinstance(request, bytes) else encode_generate(request)
        except (orjson.JSONEncodeError, UnicodeEncodeError) as e:
            raise EngineRejected(f"the request cannot be encoded for the engine: {e}") from e
        t = self._target = client._target(url)
        head = (
            b"POST %s HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (t.path, t.host_header, client._auth_line, len(body))
        )
        conn, status = await client._send(t, head, body)
        self._conn = conn
        if status in (429, 503):
            raise EngineBusy(f"{url} answered {status}")
        if status != 200:
            text = (await client._some(conn)).decode(errors="replace")
            if status in REJECTED_STATUSES:
                raise EngineRejected(f"{url} rejected the request ({status}): {text}", rejection_code(text))
            if status == 401:
                raise EngineFailure(
                    f"{url} refused the router's engine token (401; --engine-token-file): {text}"
                )
            raise EngineFailure(f"{url} answered {status}: {text}")
        lines = self._lines = EventLines(conn)
        return lines

    async def next(self) -> AnyEvent:
        """The next event; raises :class:`EngineBusy`, :class:`EngineRejected` or :class:`EngineFailure`."""
        url = self.url
        try:
            lines = self._lines
            if lines is None:
                lines = await self._start()
            while True:
                line = lines.next_nowait()
                if line is None:
                    line = await lines.next(self._wait)
                if not line:
                    raise EngineFailure(f"{url} closed the stream before the request finished")
                self._wait = self._client.between_events_s
                if not line.strip():
                    continue
                try:
                    event = parse_event(line)
                except ValueError as e:  # pydantic's ValidationError is a ValueError
                    raise EngineFailure(f"{url} sent an invalid event: {e}") from e
                if event.type in _FINAL:
                    self.finished = True
                return event
        except (EngineBusy, EngineRejected, EngineFailure):
            raise  # already the caller's (EngineRejected is a ValueError: not a broken line below)
        except TimeoutError as e:
            raise EngineFailure(f"{url} timed out") from e
        except _ConnectionLost as e:
            raise EngineFailure(f"{url}: connection lost: {e}") from e
        except (OSError, ValueError) as e:  # ValueError: a line over MAX_EVENT_BYTES
            raise EngineFailure(f"{url}: {type(e).__name__}: {e}") from e

    async def events(self) -> AsyncGenerator[AnyEvent, None]:
        """The events as an async generator, closing the call at its end (the router's colocated path
        awaits :meth:`next` itself: no generator on every event of every request)."""
        try:
            while not self.finished:
                yield await self.next()
        finally:
            self.close()

    def close(self) -> None:
        """Pool the connection if the answer was read to its end, else close it (idempotent)."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        lines, t = self._lines, self._target
        if self.finished and lines is not None and not lines.pending and t is not None:
            self._client._release_when_complete(t, conn)
        else:
            conn.close()


_FINAL = frozenset(("done", "error", "requeue"))
