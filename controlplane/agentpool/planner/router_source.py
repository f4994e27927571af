"""Polls the routers' work logs (``GET /agentpool/v1/work``) and feeds the planner's inbox.

Each router is polled with the cursor its last batch returned; a batch that says ``more`` is
followed at once (up to ``max_pages`` per poll). A router that fails (connection, timeout, status,
malformed body) is logged and polled again at the next interval with the same cursor, so nothing
is lost unless its ring buffer overwrote it meanwhile (``dropped``: logged). Occupancy samples
keep the router's URL as their ``source``: the planner sums the routers' occupancy per slice.

Engines' iteration records come through the routers too (each engine reports to every router):
the source keeps one copy of each (``node``, engine ``seq``, ``at``) for ``dedupe_s`` seconds, so
several replicas do not multiply them in the fit.

Poll each router replica directly (one URL per pod), not a Service that load-balances several:
cursors belong to one router process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import aiohttp
from pydantic import ValidationError

from agentpool.models import IterationRecord
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.router_models import ModelBroadcast
from agentpool.wire.work import MAX_BATCH, WORK_PATH, WireNodeIteration, WorkBatch

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RouterCursor:
    url: str
    cursor: str | None = None
    failures: int = 0
    dropped: int = 0
    records: int = 0
    models_version: int | None = None  # the fitted models' version the router last said it uses
    failures_in_row: int = 0


class IterationDeduper:
    """Passes each iteration (``node``, engine ``seq``, ``at``) once; remembers keys ``keep_s`` seconds
    (of the records' own clock) after the newest one seen."""

    def __init__(self, keep_s: float = 600.0) -> None:
        self.keep_s = keep_s
        self._seen: dict[tuple[str, int, float], float] = {}
        self._newest = float("-inf")
        self.duplicates = 0

    def new(self, items: Iterable[WireNodeIteration]) -> list[IterationRecord]:
        out: list[IterationRecord] = []
        for item in items:
            it = item.iteration
            key = (item.node, it.seq, it.at)
            if key in self._seen:
                self.duplicates += 1
                continue
            self._seen[key] = it.at
            self._newest = max(self._newest, it.at)
            out.append(item.record())
        if len(self._seen) > 1024:
            horizon = self._newest - self.keep_s
            self._seen = {k: at for k, at in self._seen.items() if at >= horizon}
        return out


class RouterWorkSource:
    def __init__(
        self,
        urls: Sequence[str],
        inbox: PlannerInbox,
        session: aiohttp.ClientSession,
        interval_s: float = 5.0,
        timeout_s: float = 5.0,
        limit: int = MAX_BATCH,
        max_pages: int = 20,
        models: ModelBroadcast | None = None,
    ) -> None:
        if not urls:
            raise ValueError("no router to poll")
        if interval_s <= 0 or timeout_s <= 0 or max_pages < 1:
            raise ValueError("interval, timeout and max pages must be positive")
        self.routers = [RouterCursor(u.rstrip("/")) for u in urls]
        self._inbox = inbox
        self._session = session
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._limit = limit
        self._max_pages = max_pages
        self.iterations = IterationDeduper()
        self._models = models

    async def poll_once(self) -> int:
        """Poll every router once (concurrently); returns how many entries reached the inbox.

        With a model broadcast, a router that reports another model set than the current one
        gets the current one again."""
        counts = await asyncio.gather(*(self._poll(r) for r in self.routers))
        if self._models is not None:
            await self._models.sync({r.url: r.models_version for r in self.routers if r.failures_in_row == 0})
        return sum(counts)

    async def run(self, stop: asyncio.Event) -> None:
        """Poll every ``interval_s`` until ``stop``."""
        while not stop.is_set():
            await self.poll_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval_s)

    async def _poll(self, router: RouterCursor) -> int:
        added = 0
        for _ in range(self._max_pages):
            try:
                batch = await self._fetch(router)
            except (aiohttp.ClientError, TimeoutError, ValidationError) as e:
                router.failures += 1
                router.failures_in_row += 1
                log.warning("work log of %s not read: %s", router.url, e)
                return added
            added += self._take(router, batch)
            if not batch.more:
                break
        return added

    async def _fetch(self, router: RouterCursor) -> WorkBatch:
        params = {"limit": str(self._limit)}
        if router.cursor is not None:
            params["since"] = router.cursor
        async with self._session.get(router.url + WORK_PATH, params=params, timeout=self._timeout) as resp:
            resp.raise_for_status()
            body = await resp.read()
        return WorkBatch.model_validate_json(body)

    def _take(self, router: RouterCursor, batch: WorkBatch) -> int:
        if batch.reset and router.cursor is not None:
            log.warning(
                "router %s (%s) restarted or forgot the cursor: reading from its oldest entry",
                router.url,
                batch.router,
            )
        if batch.dropped:
            router.dropped += batch.dropped
            log.warning(
                "router %s overwrote %d work-log entries before they were read", router.url, batch.dropped
            )
        router.cursor = batch.next
        router.failures_in_row = 0
        router.models_version = batch.models_version
        self._inbox.add_requests(r.record() for r in batch.requests)
        self._inbox.add_occupancy(s.sample(router.url) for s in batch.occupancy)
        self._inbox.add_iterations(self.iterations.new(batch.iterations))
        n = len(batch.requests) + len(batch.occupancy) + len(batch.iterations)
        router.records += n
        return n
