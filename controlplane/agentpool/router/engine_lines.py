"""The engine's answer read as newline-delimited event lines (:class:`EventLines`), for the engine
client (:mod:`agentpool.router.engine_client`)."""

from __future__ import annotations

import asyncio
from typing import Protocol

# The longest event line accepted.
MAX_EVENT_BYTES = 1 << 17


class Content(Protocol):
    """A response body as it arrives (the engine client's connection)."""

    def read_nowait(self) -> bytes: ...

    async def readany(self) -> bytes: ...


class EventLines:
    """Newline-delimited lines of a response body, each within ``timeout_s`` of asking for it.

    Lines already received are returned without arming a timer (engines often send several events
    in one TCP segment); only waiting for more data is bounded by the timeout. A line (newline
    included) may not exceed :data:`MAX_EVENT_BYTES`. At the end of the body a last line without
    its newline is returned as it is, then ``b""``.
    """

    __slots__ = ("_buf", "_content", "_pos")

    def __init__(self, content: Content) -> None:
        self._content = content
        self._buf = b""
        self._pos = 0

    @property
    def pending(self) -> bool:
        """Whether received bytes are left unread."""
        return len(self._buf) > self._pos

    def next_nowait(self) -> bytes | None:
        """A whole line already received, or None (then :meth:`next` waits for one)."""
        buf, pos = self._buf, self._pos
        end = buf.find(b"\n", pos)
        if end < 0 or end + 1 - pos > MAX_EVENT_BYTES:
            return None  # :meth:`next` raises for the line too long
        self._pos = end + 1
        return buf[pos : end + 1]

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
