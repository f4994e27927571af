"""One generate request inside the engine: the event stream back to the router (:class:`EventStream`,
any backend) and, for the ``sim`` backend, its node-model record (:class:`Job`)."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from agentpool.node import Request

log = logging.getLogger(__name__)


class JobState(enum.StrEnum):
    QUEUED = "queued"  # waiting for its prefill (maybe for a fetch)
    PREFILL = "prefill"
    HANDOVER = "handover"  # decode side: reading the prefill node's KV
    DECODE = "decode"
    FINISHED = "finished"


@dataclass(eq=False)
class EventStream:
    """A request's events for the router; ``on_cancel``: what the backend does when the router hangs up."""

    request_id: str
    phase: str  # both | prefill | decode
    state: JobState = JobState.QUEUED
    events: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    on_cancel: Callable[[], None] | None = None
    last_event_at: float = field(default_factory=time.monotonic)
    """When the stream last got an event (its start before any): what a stall is measured from."""
    waiting_for: str = ""
    """What the request awaits now, in words ("" when it awaits nothing of its own): the stall log's."""
    waiting_since: float = 0.0

    def waiting(self, what: str) -> None:
        """The request awaits ``what`` from now on (``""``: nothing any more)."""
        self.waiting_for = what
        self.waiting_since = time.monotonic()

    def emit(self, event: dict[str, Any]) -> None:
        if self.state is not JobState.FINISHED:
            self.events.put_nowait(event)
            self.last_event_at = time.monotonic()

    def finish(self, event: dict[str, Any] | None = None) -> None:
        if self.state is JobState.FINISHED:
            return
        if event is not None:
            self.events.put_nowait(event)
            self.last_event_at = time.monotonic()
        self.state = JobState.FINISHED
        self.events.put_nowait(None)
        current = asyncio.current_task()
        for t in self.tasks:
            if t is not current:
                t.cancel()

    def spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """Forget ``task``; log its exception with the request it served (never left unretrieved:
        the task's owner handles what the failure means for the stream)."""
        self.tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error(
                "request %s (%s): task %s failed: %r",
                self.request_id,
                self.phase,
                getattr(task.get_coro(), "__qualname__", task.get_name()),
                exc,
                exc_info=exc,
            )

    def cancel(self) -> None:
        if self.on_cancel is not None:
            self.on_cancel()

    async def stream(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            ev = await self.events.get()
            if ev is None:
                return
            yield ev


@dataclass(eq=False, kw_only=True)
class Job(EventStream):
    req: Request
    hashes: list[int]
    tokens_sent: int = 0
    fetching: bool = False
    fetched_tokens: int = 0
    cached_at_start: int = -1  # tokens of the prompt held locally when the prefill started

    @property
    def output_tokens(self) -> int:
        return self.req.output_tokens


def token_text(i: int) -> str:
    """The sim backend's output: deterministic words, one per token."""
    return f"t{i} "
