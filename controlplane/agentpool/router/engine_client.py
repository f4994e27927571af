"""HTTP client for the engine protocol (:mod:`agentpool.router.engine_protocol`), with timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import aiohttp
from pydantic import ValidationError

from agentpool.router.engine_protocol import EngineEvent, GenerateRequest

GENERATE_PATH = "/agentpool/v1/generate"


class EngineFailure(Exception):
    """The engine could not be reached, failed, timed out or broke the protocol."""


class EngineBusy(Exception):
    """The engine refused the request without failing (HTTP 429/503): route it elsewhere."""


class EngineClient:
    """Streams :class:`EngineEvent` objects from one ``generate`` call; owns an aiohttp session."""

    def __init__(self, connect_s: float, first_event_s: float, between_events_s: float) -> None:
        self.connect_s = connect_s
        self.first_event_s = first_event_s
        self.between_events_s = between_events_s
        self._session: aiohttp.ClientSession | None = None

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

    async def generate(self, url: str, request: GenerateRequest) -> AsyncGenerator[EngineEvent, None]:
        if self._session is None:
            raise RuntimeError("EngineClient.start() was not called")
        try:
            async with self._session.post(
                url.rstrip("/") + GENERATE_PATH,
                data=request.model_dump_json(),
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=None, connect=self.connect_s, sock_read=None),
            ) as resp:
                if resp.status in (429, 503):
                    raise EngineBusy(f"{url} answered {resp.status}")
                if resp.status != 200:
                    text = (await resp.content.read(500)).decode(errors="replace")
                    raise EngineFailure(f"{url} answered {resp.status}: {text}")
                wait = self.first_event_s
                while True:
                    async with asyncio.timeout(wait):
                        line = await resp.content.readline()
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
        except (aiohttp.ClientError, ValueError) as e:  # ValueError: a line over the reader's limit
            raise EngineFailure(f"{url}: {type(e).__name__}: {e}") from e
