"""The router's log of per-request work and occupancy, served to the planner.

The planner (evolving-infra §5.2, Algorithm E.3 line 15) needs, per slice of a window, the average
work ``w̄ = (t_uc, t_c, t_out, t_acc)`` of the requests and the occupancy ``q̄``. The router knows
both: the work after KV reuse when it routes a request (``t_uc``, ``t_c`` from the policy's
decision), the output length when the request finishes, and which requests it routed and has not
seen finish. This module keeps them and answers ``GET /agentpool/v1/work?since=<cursor>`` with a
:class:`agentpool.wire.work.WorkBatch` (the format and cursor rules are documented there).

- :meth:`WorkLog.routed` at every dispatch of a request (a retry replaces the work, keeps the
  arrival); :meth:`WorkLog.finished` when its answer ends, with the output tokens. A request
  that produced at least one token becomes one work record, stamped when it finished, with
  ``t_out`` the decode tokens (output tokens minus the one prefill produces, at least 1, as the
  simulator counts them) instead of the ``max_tokens`` estimate the router routes with. A request
  that failed before its first token leaves no record (it did no decode work).
- Occupancy: every ``sample_interval_s`` the number of requests in flight (routed, not finished),
  which is what the planner's ``q̄`` counts by default
  (:class:`agentpool.models.OccupancyCount`).
- ``t_acc``: :meth:`WorkLog.decoding` when the request starts to decode on a node, with the tokens
  per decode iteration that node last reported (``LoadReport.t_acc``; 1 until it reports one).
- Iterations: :meth:`WorkLog.iterations` with the iteration records of an engine's load report,
  passed on to the planner unchanged (:mod:`agentpool.wire.iterations`), at most 10 per second per
  node and phase on average (a sample: the rest would crowd the request records out of the ring).
- ``models_version``: the version of the planner's fitted models the router uses
  (:mod:`agentpool.wire.fits`), carried in every batch.
- ``config_generation``: the pool generation of the configuration the router runs, carried in
  every batch (set by the service at start and at every reload).
- Served roles: :meth:`WorkLog.served_role` with the role each engine's load report says it
  serves; every batch carries the latest per engine (the planner's only source of it). One small
  entry per engine id that ever reported (the planner looks up only the pods that exist).

Memory is bounded: the entries are a ring buffer of ``capacity`` (the oldest are overwritten and
a poller that fell behind is told how many it missed), and at most ``max_in_flight`` requests are
tracked, each for at most ``max_request_s`` (a request whose end was never reported is dropped
then, and counted in ``abandoned``). One asyncio loop owns a log.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import parse_qs

from agentpool.models import OccupancyCount, Work
from agentpool.router.http_server import Handler, Request, Response, Routes, error_response
from agentpool.wire.iterations import WireIteration
from agentpool.wire.work import (
    MAX_BATCH,
    WORK_PATH,
    WireNodeIteration,
    WireOccupancy,
    WireRequestWork,
    WireServedRole,
    WorkBatch,
    format_cursor,
    parse_cursor,
)

# A finished request's work: (seq, at, t_uc, t_c, t_out, t_acc). A plain tuple of numbers, not an
# object: no :class:`Work` is built per request, and the cyclic GC stops tracking such a tuple at its
# first collection, so a full collection does not walk a full ring of them (65,536 by default).
_Finished = tuple[int, float, float, float, float, float]


@dataclass(frozen=True, slots=True)
class _Sample:
    seq: int
    at: float
    requests: int


@dataclass(frozen=True, slots=True)
class _Iteration:
    seq: int
    node: str
    iteration: WireIteration


def _seq_of(e: _Finished | _Sample | _Iteration) -> int:
    return e[0] if isinstance(e, tuple) else e.seq


@dataclass(slots=True)
class _Pending:
    routed_at: float
    work: Work
    t_acc: float  # of the node decoding it (the work's until then): one Work is built at the end


class WorkLog:
    def __init__(
        self,
        router_id: str = "router",
        capacity: int = 65_536,
        max_in_flight: int = 100_000,
        max_request_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
        iterations_per_s: float = 10.0,
        iterations_burst: int = 50,
    ) -> None:
        if capacity < 1 or max_in_flight < 1 or max_request_s <= 0:
            raise ValueError("capacity, max_in_flight and max_request_s must be positive")
        if iterations_per_s <= 0 or iterations_burst < 1:
            raise ValueError("the iteration rate and burst must be positive")
        self.iterations_per_s = iterations_per_s
        self.iterations_burst = iterations_burst
        self.iterations_dropped = 0
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}
        self.router_id = router_id
        self.epoch = secrets.token_hex(8)
        self.max_in_flight = max_in_flight
        self.max_request_s = max_request_s
        self.abandoned = 0
        self._clock = clock
        self._seq = 0
        self._entries: deque[_Finished | _Sample | _Iteration] = deque(maxlen=capacity)
        self.models_version: int | None = None
        self.config_generation: int | None = None
        self._served: dict[str, WireServedRole] = {}
        self._pending: OrderedDict[str, _Pending] = OrderedDict()

    # -- recording ---------------------------------------------------------------------------
    def routed(self, request_id: str, work: Work) -> None:
        """A dispatch of ``request_id`` with ``work``; a re-dispatch replaces the work."""
        entry = self._pending.get(request_id)
        if entry is not None:
            entry.work, entry.t_acc = work, work.t_acc
            return
        if len(self._pending) >= self.max_in_flight:
            self._pending.popitem(last=False)
            self.abandoned += 1
        self._pending[request_id] = _Pending(self._clock(), work, work.t_acc)

    def decoding(self, request_id: str, t_acc: float) -> None:
        """``request_id`` decodes on a node that accepts ``t_acc`` tokens per iteration."""
        entry = self._pending.get(request_id)
        if entry is not None and t_acc > 0:
            entry.t_acc = t_acc

    def served_role(self, node: str, role: str, kv_capacity_tokens: int | None = None) -> None:
        """``node``'s load report says it serves ``role`` (now), with room for
        ``kv_capacity_tokens`` KV tokens in all (None: not reported)."""
        self._served[node] = WireServedRole(
            node=node, role=role, at=self._clock(), kv_capacity_tokens=kv_capacity_tokens
        )

    def iterations(self, node: str, iterations: Iterable[WireIteration]) -> None:
        """Keep the iteration records ``node`` reported, for the planner: at most
        ``iterations_per_s`` per node and phase on average (bursts of ``iterations_burst``), by the
        records' own times, so engines' iterations never crowd the request records out of the
        ring; the rest are counted in ``iterations_dropped`` (the fit needs a sample, not all)."""
        for it in iterations:
            key = (node, it.phase)
            tokens, last = self._buckets.get(key, (float(self.iterations_burst), it.at))
            tokens = min(
                float(self.iterations_burst), tokens + max(0.0, it.at - last) * self.iterations_per_s
            )
            if tokens < 1.0:
                self._buckets[key] = (tokens, max(last, it.at))
                self.iterations_dropped += 1
                continue
            self._buckets[key] = (tokens - 1.0, max(last, it.at))
            self._seq += 1
            self._entries.append(_Iteration(self._seq, node, it))

    def finished(self, request_id: str, output_tokens: int) -> None:
        """``request_id``'s answer ended after ``output_tokens`` tokens (0: it failed before any)."""
        entry = self._pending.pop(request_id, None)
        if entry is None or output_tokens < 1:
            return
        w = entry.work  # validated when routed; t_acc > 0 (decoding() takes only positive ones)
        self._seq += 1
        t_out = float(max(1, output_tokens - 1))
        self._entries.append((self._seq, self._clock(), w.t_uc, w.t_c, t_out, entry.t_acc))

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def sample(self) -> None:
        """Record the requests in flight now (after dropping those older than ``max_request_s``)."""
        now = self._clock()
        while self._pending:
            rid, oldest = next(iter(self._pending.items()))
            if now - oldest.routed_at <= self.max_request_s:
                break
            del self._pending[rid]
            self.abandoned += 1
        self._seq += 1
        self._entries.append(_Sample(self._seq, now, len(self._pending)))

    # -- serving -----------------------------------------------------------------------------
    def batch(self, since: str | None, limit: int = MAX_BATCH) -> WorkBatch:
        """The entries after ``since`` (at most ``limit``); ValueError for a malformed cursor."""
        if not 1 <= limit <= MAX_BATCH:
            raise ValueError(f"limit must be in 1..{MAX_BATCH}, got {limit}")
        after, reset = 0, True
        if since is not None:
            epoch, seq = parse_cursor(since)
            if epoch == self.epoch and seq <= self._seq:
                after, reset = seq, False
        oldest = _seq_of(self._entries[0]) if self._entries else self._seq + 1
        dropped = 0 if reset else max(0, oldest - after - 1)
        start = max(0, after - oldest + 1)
        stop = min(len(self._entries), start + limit)
        requests: list[WireRequestWork] = []
        occupancy: list[WireOccupancy] = []
        iterations: list[WireNodeIteration] = []
        last = max(after, oldest - 1)
        for e in itertools.islice(self._entries, start, stop):
            if isinstance(e, tuple):
                last, at, t_uc, t_c, t_out, t_acc = e
                requests.append(
                    WireRequestWork(seq=last, at=at, t_uc=t_uc, t_c=t_c, t_out=t_out, t_acc=t_acc)
                )
                continue
            last = e.seq
            if isinstance(e, _Iteration):
                iterations.append(WireNodeIteration(seq=e.seq, node=e.node, iteration=e.iteration))
            else:
                occupancy.append(
                    WireOccupancy(seq=e.seq, at=e.at, requests=e.requests, counts=OccupancyCount.IN_FLIGHT)
                )
        return WorkBatch(
            router=self.router_id,
            epoch=self.epoch,
            next=format_cursor(self.epoch, last),
            requests=requests,
            occupancy=occupancy,
            iterations=iterations,
            models_version=self.models_version,
            config_generation=self.config_generation,
            served=sorted(self._served.values(), key=lambda s: s.node),
            dropped=dropped,
            reset=reset,
            more=stop < len(self._entries),
        )


def work_handler(log: WorkLog) -> Handler:
    """``GET /agentpool/v1/work?since=<cursor>&limit=<n>``: a :class:`WorkBatch` as JSON."""

    async def handle(request: Request) -> Response:
        query = parse_qs(request.query)
        since = query.get("since", [None])[0]
        raw_limit = query.get("limit", [str(MAX_BATCH)])[0]
        try:
            batch = log.batch(since, int(raw_limit))
        except ValueError as e:
            return error_response(400, str(e))
        return Response(200, batch.model_dump_json().encode())

    return handle


async def sample_every(log: WorkLog, interval_s: float, stop: asyncio.Event) -> None:
    """Sample the log's occupancy every ``interval_s`` until ``stop``."""
    while True:
        log.sample()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        if stop.is_set():
            return


def mount(routes: Routes, log: WorkLog) -> None:
    """Serve ``log`` at ``GET /agentpool/v1/work`` (run :func:`sampling` alongside)."""
    routes.add("GET", WORK_PATH, work_handler(log))


@contextlib.asynccontextmanager
async def sampling(log: WorkLog, interval_s: float = 1.0) -> AsyncIterator[None]:
    """Sample ``log`` every ``interval_s`` (once at the start) while the context is open."""
    if interval_s <= 0:
        raise ValueError(f"sample interval must be positive, got {interval_s}")
    stop = asyncio.Event()
    task = asyncio.create_task(sample_every(log, interval_s, stop), name="work-log-sampler")
    try:
        yield
    finally:
        stop.set()
        await task
