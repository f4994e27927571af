"""HTTP client for the engine protocol (:mod:`agentpool.router.engine_protocol`), with timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import aiohttp
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from agentpool.router.engine_protocol import EngineEvent, GenerateRequest

GENERATE_PATH = "/agentpool/v1/generate"
# The longest event line accepted (aiohttp's readline limit, which the client used before).
MAX_EVENT_BYTES = 1 << 17
_JSON = {"content-type": "application/json"}


class EngineFailure(Exception):
    """The engine could not be reached, failed, timed out or broke the protocol."""


class EngineRejected(Exception):
    """The engine refused the request for its content (HTTP 400/413/422, or an ``error`` event with a
    4xx ``status``), or the request could not be encoded: the request's fault, not the engine's."""


# engine answers that blame the request, not the engine
REJECTED_STATUSES = frozenset((400, 413, 422))


class EngineBusy(Exception):
    """The engine refused the request without failing (HTTP 429/503): route it elsewhere."""


class EngineClient:
    """Streams :class:`EngineEvent` objects from one ``generate`` call; owns an aiohttp session."""

    def __init__(self, connect_s: float, first_event_s: float, between_events_s: float) -> None:
        self.connect_s = connect_s
        self.first_event_s = first_event_s
        self.between_events_s = between_events_s
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, str] = {}  # engine base URL -> its generate URL

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_s),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _url(self, url: str) -> str:
        full = self._urls.get(url)
        if full is None:
            full = self._urls[url] = url.rstrip("/") + GENERATE_PATH
        return full

    async def generate(self, url: str, request: GenerateRequest) -> AsyncGenerator[EngineEvent, None]:
        if self._session is None:
            raise RuntimeError("EngineClient.start() was not called")
        try:
            data = request.model_dump_json().encode()
        except (PydanticSerializationError, UnicodeEncodeError) as e:
            raise EngineRejected(f"the request cannot be encoded for the engine: {e}") from e
        try:
            async with self._session.post(
                self._url(url),
                data=data,
                headers=_JSON,
                timeout=aiohttp.ClientTimeout(total=None, connect=self.connect_s, sock_read=None),
            ) as resp:
                if resp.status in (429, 503):
                    raise EngineBusy(f"{url} answered {resp.status}")
                if resp.status != 200:
                    text = (await resp.content.read(500)).decode(errors="replace")
                    if resp.status in REJECTED_STATUSES:
                        raise EngineRejected(f"{url} rejected the request ({resp.status}): {text}")
                    raise EngineFailure(f"{url} answered {resp.status}: {text}")
                lines = _Lines(resp.content)
                wait = self.first_event_s
                while True:
                    line = await lines.next(wait)
                    if not line:
                        raise EngineFailure(f"{url} closed the stream before the request finished")
                    wait = self.between_events_s
                    if not line.strip():
                        continue
                    try:
                        event = EngineEvent.model_validate_json(line)
                    except ValidationError as e:
                        raise EngineFailure(f"{url} sent an invalid event: {e}") from e
                    yield event
                    if event.type in ("done", "error", "requeue"):
                        return
        except TimeoutError as e:
            raise EngineFailure(f"{url} timed out") from e
        except (aiohttp.ClientError, ValueError) as e:  # ValueError: a line over MAX_EVENT_BYTES
            raise EngineFailure(f"{url}: {type(e).__name__}: {e}") from e


class _Lines:
    """Newline-delimited lines of a response body, each within ``timeout_s`` of asking for it.

    Lines already received are returned without arming a timer (engines often send several events
    in one TCP segment); only waiting for more data is bounded by the timeout. A line (newline
    included) may not exceed :data:`MAX_EVENT_BYTES`. At the end of the body a last line without
    its newline is returned as it is, then ``b""``.
    """

    __slots__ = ("_buf", "_content", "_pos")

    def __init__(self, content: aiohttp.StreamReader) -> None:
        self._content = content
        self._buf = b""
        self._pos = 0

    async def next(self, timeout_s: float) -> bytes:
        deadline: float | None = None
        while True:
            buf, pos = self._buf, self._pos
            end = buf.find(b"\n", pos)
            if end >= 0:
                if end + 1 - pos > MAX_EVENT_BYTES:
                    raise ValueError(f"an event line is over {MAX_EVENT_BYTES} bytes")
                self._pos = end + 1
                return buf[pos : end + 1]
            if len(buf) - pos > MAX_EVENT_BYTES:
                raise ValueError(f"an event line is over {MAX_EVENT_BYTES} bytes")
            data = self._content.read_nowait()
            if not data:
                if deadline is None:
                    deadline = asyncio.get_running_loop().time() + timeout_s
                async with asyncio.timeout_at(deadline):
                    data = await self._content.readany()
                if not data:  # end of the body
                    self._buf, self._pos = b"", 0
                    return buf[pos:]
            self._buf, self._pos = buf[pos:] + data, 0
