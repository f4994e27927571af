"""The request flow: choose a node, dispatch, bind decode, hand over KV, retry, re-route.

Colocated pool: one ``generate`` call with ``phase=both`` on the chosen node.
Disaggregated pool: ``phase=prefill`` on the chosen prefill node; when it reports ``started``, the
decode node is bound (:func:`agentpool.router.policy.bind_decode`) and the branch placed there; its
``prefilled`` event carries the first token and the KV ``transfer_id``, and ``phase=decode`` on the
bound node continues the stream from the handed-over KV.

Failures: an engine that fails before the first token reaches the client is marked down (the
prefill node also excluded for the request; a failed decode node is the one marked down, not the
prefill node) and the request re-dispatched, at most ``max_retries`` times; a ``requeue`` (a
draining engine giving the request back) or a busy answer re-routes it without counting as a
failure (at most ``max_requeues`` times). A decode node that cannot get the KV because the prefill
node is gone or refuses (``requeue`` with reason :data:`~agentpool.wire.engine.KV_SOURCE_LOST`,
before any output) makes the router place the request again from the start, on another prefill
node, once (``agentpool_router_retries_total{reason="kv_source_lost"}``); a second loss is a 503.
After the first token a failure raises :class:`StreamBroken`: the server ends the stream with an
error event.
Every engine call has connect, first-event and between-event timeouts, so no client hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable

import orjson

from agentpool.models import Work
from agentpool.router.directory_view import DirectoryError, DirectoryView
from agentpool.router.engine_client import (
    EngineBusy,
    EngineCall,
    EngineClient,
    EngineFailure,
    EngineRejected,
    code_for_kind,
)
from agentpool.router.flow_types import (
    BadRequest,
    Finish,
    FlowError,
    NoCapacity,
    Output,
    Overloaded,
    Prepared,
    RequestFailed,
    Routing,
    StreamBroken,
)
from agentpool.router.metrics import RouterMetrics
from agentpool.router.nodes import NodeTable
from agentpool.router.policy import (
    NodeState,
    RequestView,
    Role,
    RouteDecision,
    bind_decode,
    decode_role,
    decode_room_will_free,
    kv_tokens_needed,
    prefill_candidates,
)
from agentpool.router.policy.contract import serves_prefill
from agentpool.router.work_log import WorkLog
from agentpool.wire.engine import (
    KV_SOURCE_LOST,
    AnyEvent,
    KvSource,
    Phase,
    Usage,
    generate_body,
    with_cached_tokens,
)

log = logging.getLogger(__name__)

# how often a request waiting for decode KV room looks again (room frees as decodes finish)
_DECODE_ROOM_POLL_S = 0.05


class _Requeue(Exception):
    pass


class _DecodeFailed(Exception):
    """The bound decode node failed (:class:`EngineFailure`): that node is marked down, not the
    prefill node the request was placed on."""

    def __init__(self, node: str, cause: EngineFailure) -> None:
        super().__init__(str(cause))
        self.node = node


class _KvSourceLost(Exception):
    """A decode node could not get the request's KV from its prefill node (gone or refusing) and sent
    nothing: the request is placed again from the start."""


class Dispatcher:
    def __init__(
        self,
        nodes: NodeTable,
        engines: EngineClient,
        directory: DirectoryView,
        metrics: RouterMetrics,
        routing: Routing,
        clock: Callable[[], float] = time.monotonic,
        work_log: WorkLog | None = None,
        router_id: str | None = None,
    ) -> None:
        self.router_id = router_id  # sent with every dispatch: engines number reports per router
        self.nodes = nodes
        self.engines = engines
        self.directory = directory
        self.metrics = metrics
        self.routing = routing
        self.clock = clock
        self.work_log = work_log if work_log is not None else WorkLog()

    # -- choosing ----------------------------------------------------------------------------
    def choose(self, prep: Prepared) -> RouteDecision:
        routing = self.routing
        snapshot = self.nodes.snapshot(self.clock())
        candidates = [n for n in prefill_candidates(snapshot, routing.ctx) if n.node_id not in prep.excluded]
        if not candidates:
            raise self._no_candidate(snapshot, prep)
        t0 = time.perf_counter()
        decision = routing.policy.choose(prep.view, candidates, routing.ctx)
        m = self.metrics
        m.child(m.decision, routing.policy.name).observe(time.perf_counter() - t0)
        m.child(m.decisions, routing.policy.name, decision.node_id, "prefill").inc()
        return decision

    def _no_candidate(self, snapshot: list[NodeState], prep: Prepared) -> FlowError:
        live = [
            n
            for n in snapshot
            if serves_prefill(n) and n.accepting and not n.draining and n.node_id not in prep.excluded
        ]
        if live:
            return Overloaded(f"all {len(live)} eligible nodes are over their queue limit")
        return NoCapacity("no node can take a prefill now")

    # -- running -----------------------------------------------------------------------------
    async def run(self, prep: Prepared, out: Output) -> Finish:
        """Serve ``prep``: its text goes to ``out`` as it comes, the :class:`Finish` is returned once
        the engines are done with it (one coroutine for the whole request on a colocated node)."""
        cfg = self.routing.config
        failures = requeues = kv_lost = 0
        last_error = ""
        while True:
            try:
                decision = self.choose(prep)
            except (Overloaded, NoCapacity) as e:
                if failures:
                    raise RequestFailed(f"{failures} engines failed, last: {last_error}; {e}") from e
                raise
            node = decision.node_id
            work = Work(
                t_uc=float(prep.view.prompt_tokens - decision.cached_tokens),
                t_c=float(decision.cached_tokens),
                t_out=float(prep.view.expected_output_tokens),
            )
            # Take the node's queue slot in the same step as choose(), before any await: otherwise
            # concurrent requests all choose the node while its count is still low (the queue limit).
            seq = self.nodes.dispatch_prefill(node, prep.request_id, work, kv_tokens_needed(prep.view))
            self._count_prefix(prep.view, decision)
            self.work_log.routed(prep.request_id, work)
            colocated = self.nodes.get(node).role is Role.BOTH
            try:
                if colocated:
                    finish = await self._colocated(prep, decision, seq, out)
                else:
                    finish = await self._disaggregated(prep, decision, seq, out)
                self.nodes.succeeded(node)
                return finish
            except _Requeue as e:
                if out.sent:
                    raise StreamBroken(f"requeued after the first token: {e}") from e
                requeues += 1
                prep.excluded.add(node)
                self.metrics.retries.labels("requeue").inc()
                if requeues > cfg.max_requeues:
                    raise NoCapacity(f"re-routed {requeues} times: {e}") from e
            except _KvSourceLost as e:
                if out.sent:  # placing it again would send the client its first token twice
                    raise StreamBroken(f"the prefilled KV was lost after the first token: {e}") from e
                kv_lost += 1
                down_s = self.nodes.mark_down(node, self.clock())
                prep.excluded.add(node)
                log.warning(
                    "request %s: the KV prefilled on %s was lost (%s); sending %s nothing for %g s",
                    prep.request_id,
                    node,
                    e,
                    node,
                    down_s,
                )
                if kv_lost > 1:
                    raise NoCapacity(f"the prefilled KV was lost {kv_lost} times, last: {e}") from e
                self.metrics.retries.labels("kv_source_lost").inc()
            except EngineRejected as e:
                self.metrics.engine_failures.labels("request").inc()
                log.warning("request %s: %s refused it for its content: %s", prep.request_id, node, e)
                if out.sent:
                    raise StreamBroken(str(e)) from e
                raise BadRequest(str(e), e.code) from e
            except (EngineFailure, _DecodeFailed) as e:
                failed = e.node if isinstance(e, _DecodeFailed) else node
                self.metrics.engine_failures.labels("engine").inc()
                if out.sent:
                    log.warning("request %s: engine %s failed mid-stream: %s", prep.request_id, failed, e)
                    raise StreamBroken(str(e)) from e
                down_s = self.nodes.mark_down(failed, self.clock())
                log.warning(
                    "request %s: engine %s failed (%s); sending it nothing for %g s",
                    prep.request_id,
                    failed,
                    e,
                    down_s,
                )
                failures += 1
                last_error = str(e)
                if failed == node:  # a failed decode node is down: the next binding avoids it
                    prep.excluded.add(node)
                self.metrics.retries.labels("engine_failure").inc()
                if failures > cfg.max_retries:
                    raise RequestFailed(f"{failures} engines failed, last: {last_error}") from e
            finally:
                self.nodes.finish_prefill(node, prep.request_id)

    def _count_prefix(self, view: RequestView, d: RouteDecision) -> None:
        local = d.cached_tokens - d.fetch_tokens
        m = self.metrics
        m.child(m.prefix_tokens, "local").inc(local)
        m.child(m.prefix_tokens, "remote").inc(d.fetch_tokens)
        m.child(m.prefix_tokens, "miss").inc(view.prompt_tokens - d.cached_tokens)

    async def _place(self, prep: Prepared, node: str) -> None:
        """``node`` took the request: the directory applies the branch's E.1 update and counts it there
        (a request an engine refused, 429/503, changed nothing)."""
        if prep.branch is None:
            return
        try:
            await self.directory.place(prep.branch, node, prep.hashes)  # never waits: no timer
        except DirectoryError:
            self.metrics.directory_errors.labels("place").inc()

    def _generate_request(
        self, prep: Prepared, decision: RouteDecision, seq: int, phase: Phase, kv: KvSource | None = None
    ) -> bytes:
        """The engine's ``generate`` body (a :class:`GenerateRequest`'s JSON, built without the model:
        the fields were validated where they came from; the counts are checked here)."""
        if seq < 0 or decision.cached_tokens < 0 or decision.fetch_tokens < 0:  # what validation checked
            raise ValueError(f"negative dispatch counts from {decision.policy}: {decision}")
        try:
            return generate_body(
                prep.request_id,
                seq,
                phase,
                prep.endpoint,
                prep.body,
                prep.token_ids,
                decision.cached_tokens,
                decision.fetch_tokens,
                None if kv is None else kv.model_dump(),
                self.router_id,
                prompt_token_ids_json=prep.token_ids_json,
            )
        except (orjson.JSONEncodeError, UnicodeEncodeError) as e:
            raise EngineRejected(f"the request cannot be encoded for the engine: {e}") from e

    def _engine(self, node: str, request: bytes) -> EngineCall:
        """The engine call (not yet sent); the caller checks each event (:meth:`_refused`), turns
        :class:`EngineBusy` into a re-route and closes the call."""
        if node not in self.nodes:  # discovery removed it while the request waited: route again
            raise _Requeue(f"{node} is gone")
        return self.engines.open(self.nodes.get(node).url, request)

    @staticmethod
    def _refused(node: str, ev: AnyEvent) -> None:
        """Raise what a ``requeue`` or ``error`` event means."""
        if ev.type == "requeue":
            if ev.reason == KV_SOURCE_LOST:
                raise _KvSourceLost(f"{node}: {ev.message or ev.reason}")
            raise _Requeue(f"{node}: {ev.reason or 'requeued'}")
        if ev.type == "error":
            if ev.status is not None and ev.status < 500:
                raise EngineRejected(f"{node}: {ev.message or 'request refused'}", code_for_kind(ev.reason))
            raise EngineFailure(f"{node}: {ev.message or 'engine error'}")

    async def _events(
        self, node: str, request: bytes, place: Prepared | None = None
    ) -> AsyncGenerator[AnyEvent, None]:
        """The engine's events; with ``place``, its branch is placed on ``node`` at the first event
        (the engine accepted the request)."""
        call = self._engine(node, request)
        try:
            async with contextlib.aclosing(call.events()) as events:
                async for ev in events:
                    self._refused(node, ev)
                    if place is not None:
                        await self._place(place, node)
                        place = None
                    yield ev
        except EngineBusy as e:
            raise _Requeue(str(e)) from e

    async def _colocated(self, prep: Prepared, decision: RouteDecision, seq: int, out: Output) -> Finish:
        """``phase=both`` on the node: its events read here, its text put to ``out``."""
        node = decision.node_id
        request = self._generate_request(prep, decision, seq, "both")
        decoding = False
        place = prep.branch is not None
        call = self._engine(node, request)
        try:
            while True:
                ev = await call.next()
                self._refused(node, ev)
                if place:  # the engine accepted the request: its branch is placed on the node
                    place = False
                    await self._place(prep, node)
                if ev.type == "token" and ev.text:
                    if not decoding:  # prefill done: the request leaves the queue and decodes
                        decoding = True
                        self.nodes.finish_prefill(node, prep.request_id)
                        self.nodes.bind_decode(node, prep.request_id, kv_tokens_needed(prep.view))
                        self.work_log.decoding(prep.request_id, self.nodes.t_acc(node))
                    out.sent = True
                    await out.chunk(ev.text)
                elif ev.type == "done":
                    return Finish(ev.finish_reason or "stop", ev.usage or Usage())
        except EngineBusy as e:
            raise _Requeue(str(e)) from e
        finally:
            call.close()
            if decoding:
                self.nodes.finish_decode(node, prep.request_id)

    async def _disaggregated(self, prep: Prepared, decision: RouteDecision, seq: int, out: Output) -> Finish:
        prefill_node = decision.node_id
        prefill_url = self.nodes.get(prefill_node).url  # before any await: discovery may remove it
        decode_node: str | None = None
        decode_seq = 0
        transfer: str | None = None
        prefill_cached: int | None = None
        request = self._generate_request(prep, decision, seq, "prefill")
        first = ""
        try:
            async with contextlib.aclosing(self._events(prefill_node, request, prep)) as events:
                async for ev in events:
                    if ev.type == "started":
                        prefill_cached = ev.cached_tokens
                        if decode_node is None:
                            decode_node, decode_seq = await self._bind(prep)
                    elif ev.type == "prefilled":
                        transfer = ev.transfer_id
                        first = ev.text
                        self.nodes.finish_prefill(prefill_node, prep.request_id)
                        break
                    elif ev.type == "done":  # finished on the prefill node (e.g. max_tokens=1)
                        if ev.text:
                            out.sent = True
                            await out.chunk(ev.text)
                        return Finish(ev.finish_reason or "length", ev.usage or Usage())
            if transfer is None:
                raise EngineFailure(f"{prefill_node}: prefill ended without a KV transfer id")
            if decode_node is None:
                decode_node, decode_seq = await self._bind(prep)
            if first:
                out.sent = True
                await out.chunk(first)
            kv = KvSource(node_id=prefill_node, url=prefill_url, transfer_id=transfer)
            gave_back: set[str] = set()
            while True:
                decode_request = self._generate_request(prep, decision, decode_seq, "decode", kv)
                decoding = False
                try:
                    async with contextlib.aclosing(self._events(decode_node, decode_request)) as events:
                        async for ev in events:
                            if ev.type == "token" and ev.text:
                                decoding = True
                                out.sent = True
                                await out.chunk(ev.text)
                            elif ev.type == "done":
                                usage = ev.usage or Usage()
                                if prefill_cached is not None:
                                    usage = with_cached_tokens(usage, prefill_cached)
                                return Finish(ev.finish_reason or "stop", usage)
                    raise EngineFailure(f"{decode_node}: decode stream ended without done")
                except EngineFailure as e:
                    raise _DecodeFailed(decode_node, e) from e
                except _Requeue:
                    # The decode node gave the request back before decoding it (it drains for a role
                    # switch that began after the binding). The KV still waits on the prefill node
                    # under its transfer id: bind another decode node rather than fail a request
                    # whose first token is out.
                    gave_back.add(decode_node)
                    if decoding or len(gave_back) > self.routing.config.max_requeues:
                        raise
                    self.nodes.finish_decode(decode_node, prep.request_id)
                    decode_node = None
                    self.metrics.retries.labels("decode_requeue").inc()
                    decode_node, decode_seq = await self._bind(prep, frozenset(gave_back))
        finally:
            if decode_node is not None:
                self.nodes.finish_decode(decode_node, prep.request_id)

    async def _bind(self, prep: Prepared, exclude: frozenset[str] = frozenset()) -> tuple[str, int]:
        """Bind the request to a decode node (not one of ``exclude``; a colocated one once no node
        has the decode role, :func:`decode_role`), waiting while none has KV room for it: as long as
        room will free on some decode node (:func:`decode_room_will_free`), else at most
        ``decodeWait`` in a row; never longer than ``decodeWaitMax`` in all."""
        timeouts = self.routing.config.timeouts
        wait_s = timeouts.decode_wait_s
        deadline = self.clock() + wait_s
        give_up = self.clock() + timeouts.decode_wait_max_s
        while True:
            now = self.clock()
            nodes = self.nodes.snapshot(now)
            if exclude:
                nodes = [n for n in nodes if n.node_id not in exclude]
            role = decode_role(nodes)
            binding = bind_decode(prep.view, nodes, self.routing.ctx, role)
            if binding is not None:
                break
            if now >= give_up:
                raise NoCapacity(
                    f"no decode node had KV room for the request within {timeouts.decode_wait_max_s:g} s"
                )
            if decode_room_will_free(prep.view, nodes, role):
                deadline = now + wait_s
            elif now >= deadline:
                raise NoCapacity(
                    f"no decode node had KV room for the request within {wait_s:g} s, "
                    "and none has decodes running that would free it"
                )
            await asyncio.sleep(_DECODE_ROOM_POLL_S)
        seq = self.nodes.bind_decode(binding.node_id, prep.request_id, kv_tokens_needed(prep.view))
        self.work_log.decoding(prep.request_id, self.nodes.t_acc(binding.node_id))
        m = self.metrics
        m.child(m.decisions, self.routing.policy.name, binding.node_id, "decode").inc()
        await self._place(prep, binding.node_id)
        return binding.node_id, seq
