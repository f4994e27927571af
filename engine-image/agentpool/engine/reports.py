"""Load reports to every router (``POST {router}/agentpool/v1/report``), with the iteration records.

Every ``interval_s`` (and at once after :meth:`Reporter.kick`, e.g. when a drain starts) the engine
sends one :class:`LoadReport` to each router, with the bearer token the router wants. The iterations
run since the last report go to every router (each passes them on to the planner, which drops the
copies). A router that refuses a report (4xx) or cannot be reached is logged and counted; the next
report carries the state anyway.

``last_dispatch_seq`` is per router: every router numbers its own dispatches, so each report target
gets the last sequence number of the dispatches carrying its ``router_id`` (:class:`DispatchSeqs`),
which the engine learns from the router's answer to a report (:class:`ReportAck`). Until then
a target gets the numbering of dispatches without a router id (-1 when none came).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from pydantic import ValidationError

from agentpool.engine.metrics import EngineMetrics
from agentpool.wire.engine import LoadReport, ReportAck

log = logging.getLogger(__name__)
REPORT_PATH = "/agentpool/v1/report"


@dataclass(slots=True)
class ReportTarget:
    url: str
    token: str | None
    router_id: str | None = None
    """The router behind ``url`` (from its answer to a report): whose dispatch numbers it gets."""
    tls: ssl.SSLContext | None = None
    """An ``https://`` router's TLS (its CA, the engine's client certificate); None: the defaults."""


class DispatchSeqs:
    """The last ``dispatch_seq`` seen from each router (``None``: dispatches without a router id)."""

    def __init__(self) -> None:
        self._last: dict[str | None, int] = {}

    def saw(self, router_id: str | None, seq: int) -> None:
        if seq > self._last.get(router_id, -1):
            self._last[router_id] = seq

    def last(self, router_id: str | None) -> int:
        return self._last.get(router_id, -1)


class Reporter:
    def __init__(
        self,
        targets: list[ReportTarget],
        session: aiohttp.ClientSession,
        build: Callable[[], LoadReport],
        metrics: EngineMetrics,
        seqs: DispatchSeqs,
        interval_s: float = 0.5,
        timeout_s: float = 2.0,
    ) -> None:
        self.targets = targets
        self.session = session
        self.build = build
        self.metrics = metrics
        self.seqs = seqs
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.sent = 0
        self.last_error: str | None = None
        self._kick = asyncio.Event()

    def kick(self) -> None:
        self._kick.set()

    async def run(self) -> None:
        if not self.targets:
            return
        while True:
            self._kick.clear()
            await self.send_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.interval_s)

    async def send_once(self) -> None:
        report = self.build()  # once: the iteration records go to every router
        await asyncio.gather(*(self._post(t, self._body(report, t)) for t in self.targets))
        self.sent += 1

    def _body(self, report: LoadReport, target: ReportTarget) -> bytes:
        own = report.model_copy(update={"last_dispatch_seq": self.seqs.last(target.router_id)})
        return own.model_dump_json(exclude_none=True).encode()

    async def _post(self, target: ReportTarget, body: bytes) -> None:
        headers = {"content-type": "application/json"}
        if target.token:
            headers["authorization"] = f"Bearer {target.token}"
        try:
            async with self.session.post(
                target.url.rstrip("/") + REPORT_PATH,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                ssl=True if target.tls is None else target.tls,
            ) as r:
                if r.status == 200:
                    self.metrics.reports.labels("ok").inc()
                    self.last_error = None
                    try:
                        ack = ReportAck.model_validate_json(await r.read())
                    except ValidationError:
                        return  # an answer without a router id: the target keeps the one it had
                    if ack.router_id is not None:
                        target.router_id = ack.router_id
                    return
                text = (await r.text())[:300]
                self.metrics.reports.labels("rejected").inc()
                self.last_error = f"{target.url}: HTTP {r.status}: {text}"
                log.warning("router refused the load report: %s", self.last_error)
        except (aiohttp.ClientError, TimeoutError) as e:
            self.metrics.reports.labels("failed").inc()
            self.last_error = f"{target.url}: {type(e).__name__}: {e}"
            log.info("load report not delivered: %s", self.last_error)
