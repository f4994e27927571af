"""Polls the routers' work logs (``GET /agentpool/v1/work``) and feeds the planner's inbox.

Each router is polled with the cursor its last batch returned; a batch that says ``more`` is
followed at once (up to ``max_pages`` per poll). A router that fails (connection, timeout, status,
malformed body) is logged and polled again at the next interval with the same cursor, so nothing
is lost unless its ring buffer overwrote it meanwhile (``dropped``: logged). Occupancy samples
keep the router's URL as their ``source``: the planner sums the routers' occupancy per slice.

Engines' iteration records come through the routers too (each engine reports to every router):
the source passes each iteration on once (:class:`IterationDeduper`), so several replicas do not
multiply them in the fit.

Every batch also carries the role each engine last said it serves: the source keeps the newest
per engine in ``served`` (:class:`agentpool.planner.roles.ServedRoles`), which is where the
planner's role board reads it.

Poll each router replica directly (one URL per pod), not a Service that load-balances several:
cursors belong to one router process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import aiohttp
from pydantic import ValidationError

from agentpool.models import IterationRecord
from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.roles import ServedRoles
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
    config_generation: int | None = None  # the pool generation of the config it last said it runs
    failures_in_row: int = 0


class IterationDeduper:
    """Passes each engine's iterations once, however many routers carry them.

    Per engine it keeps the newest ``(at, seq)`` passed on and drops what is not newer: every
    router gets every report of an engine and keeps its iterations in order, so the copies from a
    second router are never newer than what the first one delivered. An engine that restarts
    numbers again from 0, at later times: ``at`` first keeps it newer. Memory: one pair per engine.
    (An iteration only a router that was polled later carries, older than what another delivered,
    is dropped: routers that missed reports lose samples, never duplicate them.)
    """

    def __init__(self) -> None:
        self._newest: dict[str, tuple[float, int]] = {}
        self.duplicates = 0

    def new(self, items: Iterable[WireNodeIteration]) -> list[IterationRecord]:
        out: list[IterationRecord] = []
        for item in items:
            it = item.iteration
            key = (it.at, it.seq)
            last = self._newest.get(item.node)
            if last is not None and key <= last:
                self.duplicates += 1
                continue
            self._newest[item.node] = key
            out.append(item.record())
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
        discover: Callable[[], Awaitable[list[str] | None]] | None = None,
        served: ServedRoles | None = None,
        server_hostname: str | None = None,
    ) -> None:
        """``urls``: routers always polled; ``discover``: finds the others (router pods) before every
        poll (None: it failed, keep the routers known); ``server_hostname``: the name the routers'
        certificates are checked against (None: each URL's host)."""
        self._server_hostname = server_hostname
        if not urls and discover is None:
            raise ValueError("no router to poll")
        if interval_s <= 0 or timeout_s <= 0 or max_pages < 1:
            raise ValueError("interval, timeout and max pages must be positive")
        self.static = [u.rstrip("/") for u in urls]
        self.routers = [RouterCursor(u) for u in self.static]
        self._discover = discover
        self._inbox = inbox
        self._session = session
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._limit = limit
        self._max_pages = max_pages
        self.iterations = IterationDeduper()
        self.served = served if served is not None else ServedRoles()
        self._models = models

    async def poll_once(self) -> int:
        """Poll every router once (concurrently); returns how many entries reached the inbox.

        With a model broadcast, a router that reports another model set than the current one
        gets the current one again."""
        if self._discover is not None:
            found = await self._discover()
            if found is not None:
                self.set_urls([*self.static, *found])
        counts = await asyncio.gather(*(self._poll(r) for r in self.routers))
        if self._models is not None:
            await self._models.sync({r.url: r.models_version for r in self.routers if r.failures_in_row == 0})
        return sum(counts)

    def config_generations(self) -> dict[str, int | None]:
        """The configuration generation each router last said it runs, by URL (the routers that
        answered at least once)."""
        return {r.url: r.config_generation for r in self.routers if r.cursor is not None}

    def set_urls(self, urls: Sequence[str]) -> None:
        """Poll exactly ``urls`` from now on: known routers keep their cursors, new ones start from
        their oldest entry, gone ones are forgotten (and get no more model sets)."""
        wanted = list(dict.fromkeys(u.rstrip("/") for u in urls))
        known = {r.url: r for r in self.routers}
        added = [u for u in wanted if u not in known]
        gone = [u for u in known if u not in wanted]
        if added or gone:
            log.info("routers: %s added, %s gone", added or "none", gone or "none")
        self.routers = [known.get(u) or RouterCursor(u) for u in wanted]
        if self._models is not None:
            self._models.set_urls(wanted)

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
        url, name = router.url + WORK_PATH, self._server_hostname
        async with self._session.get(url, params=params, timeout=self._timeout, server_hostname=name) as resp:
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
        router.config_generation = batch.config_generation
        self._inbox.add_requests(r.record() for r in batch.requests)
        self._inbox.add_occupancy(s.sample(router.url) for s in batch.occupancy)
        self._inbox.add_iterations(self.iterations.new(batch.iterations))
        for s in batch.served:
            self.served.update(s.node, s.role, s.at, s.kv_capacity_tokens)
        n = len(batch.requests) + len(batch.occupancy) + len(batch.iterations)
        router.records += n
        return n
