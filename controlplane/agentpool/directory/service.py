"""The directory gRPC servicer: a thin asyncio shell around :class:`agentpool.kv.Directory`.

Every mutation runs on the core synchronously, is encoded at once (:func:`~.store.snapshot`) and written
to the store in order (one write lock, FIFO) before the RPC answers; count changes then go to the
engines' count streams. Resolve only reads: the E.1 update of a request (version, path, release of
dropped history) runs in its Place, once a node took the request, in the same write as the placement,
so a routed request costs one Redis round trip per Place and none for its Resolve, and a request that
no node took (429, 503) changes nothing. While the store is down, mutating RPCs answer UNAVAILABLE;
when it is back the agent state is reloaded from it (what it persisted wins over what the failed
writes left in memory).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from agentpool.directory.convert import (
    InvalidRequestError,
    QuotaExceededError,
    ResolveEncoder,
    branch_id,
    eviction_entry,
    node_name,
    phase_from_pb,
    phase_to_pb,
    request_blocks,
)
from agentpool.directory.ingest import EventIngest, ServiceLimits, check_node_cap
from agentpool.directory.metrics import DirectoryMetrics
from agentpool.directory.resync_wire import PackedResync
from agentpool.directory.steps import run_steps, settled
from agentpool.directory.store import BranchStore, Pending, StoreUnavailableError
from agentpool.directory.watch import CountWatchers
from agentpool.directory.writer import StoreWriter, Written
from agentpool.errors import AgentpoolError, grpc_code_name
from agentpool.kv import Changes, Directory, UnknownBranchError, UnknownNodeError
from agentpool.v1 import directory_pb2 as pb
from agentpool.v1 import directory_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


# Engines heartbeat at least every second (the engine agent every 0.5 s); 3 s of silence (checked
# every 0.5 s) purges a node within 3.5 s of its last message and tolerates two late heartbeats.
DEFAULT_NODE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class ServiceTimers:
    idle_ttl_s: float = 3600.0  # branches idle this long are ended
    node_timeout_s: float = DEFAULT_NODE_TIMEOUT_S  # nodes silent this long are dropped
    sweep_interval_s: float = 0.5
    store_check_interval_s: float = 0.5


T = TypeVar("T")

if TYPE_CHECKING:
    Ctx = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True, slots=True)
class Placed:
    """A Place applied to the core; its write (``pending``) still to persist."""

    branch: str
    node: str
    is_new: bool
    bumped: bool
    known: bool
    pending: Pending


RPC_ERRORS = (
    InvalidRequestError,
    QuotaExceededError,
    StoreUnavailableError,
    UnknownNodeError,
    UnknownBranchError,
)
"""The errors an RPC's own checks end it with (answered with their kind's code, the call goes on)."""


def grpc_status(e: AgentpoolError) -> grpc.StatusCode:
    """The directory's one mapping of errors to gRPC codes: a domain error's kind (temporary or
    permanent, :mod:`agentpool.errors`) picks it from the root's table."""
    return grpc.StatusCode[grpc_code_name(e)]


class DirectoryService(pb_grpc.DirectoryServicer):
    def __init__(
        self,
        directory: Directory,
        store: BranchStore,
        metrics: DirectoryMetrics | None = None,
        limits: ServiceLimits | None = None,
        timers: ServiceTimers | None = None,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dir = directory
        self.store = store
        self.metrics = metrics or DirectoryMetrics()
        self.limits = limits or ServiceLimits()
        self.timers = timers or ServiceTimers()
        self.wall = wall_clock
        self.mono = monotonic
        self.store_ok = False
        self._reload_needed = False
        self._node_locks: dict[str, asyncio.Lock] = {}
        self._background: set[asyncio.Future[Any]] = set()  # resyncs and purges left by their callers
        self.writer = StoreWriter(directory, store, self.metrics, self._store_failed)
        self._encoder = ResolveEncoder(directory.page_size)
        self.ingest = EventIngest(directory, self.limits, self.metrics, wall_clock, monotonic)
        self.watchers = CountWatchers(directory, self.metrics)
        # the core's sizes, read when scraped (not set after every write: three locked sets per Place);
        # each a len() of the loop thread's tables, whole under the GIL
        self.metrics.nodes.set_function(lambda: len(directory.phases()))
        self.metrics.branches.set_function(lambda: len(directory.branches))
        self.metrics.index_blocks.set_function(lambda: len(directory.index))
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the agent state from the store (raises StoreUnavailableError) and start the sweeps."""
        phases, branches = await self.store.load()
        self.dir.load_agent_state(phases, branches)
        self.writer.rows.loaded(branches)
        self.ingest.expect(phases)
        self.store_ok = True
        self.metrics.store_up.set(1)
        self._stopping = False
        self._tasks = [
            asyncio.create_task(self._store_monitor(), name="directory-store-monitor"),
            asyncio.create_task(self._sweeper(), name="directory-sweeper"),
        ]

    async def stop(self) -> None:
        """Stop the sweeps. The flag ends a loop whose cancellation was swallowed on the way: Python
        3.11's ``asyncio.wait_for`` (inside redis-py's socket timeouts) drops a cancel that arrives as
        the awaited call completes, and a loop that lost it would run forever."""
        self._stopping = True
        tasks = [*self._tasks, *self._background]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.writer.stop()
        self._tasks = []

    async def _store_monitor(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.timers.store_check_interval_s)
            ok = await self.store.ping()
            if not ok:
                self._reload_needed = True  # mirror what the store kept once it is back
            elif self._reload_needed:
                try:
                    await self._reload()
                except StoreUnavailableError:
                    ok = False
            self.store_ok = ok and not self._reload_needed
            self.metrics.store_up.set(1 if self.store_ok else 0)

    async def _reload(self) -> None:
        async with self.writer.lock:  # no write meanwhile
            phases, branches = await self.store.load()
            self.dir.load_agent_state(phases, branches)
            self.writer.rows.loaded(branches)
            self.ingest.keep_only(phases)
            self._reload_needed = False
        log.info("directory agent state reloaded from the store: %d branches", len(self.dir.branches))
        self.watchers.resnapshot()

    async def _sweeper(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.timers.sweep_interval_s)
            await self.sweep()

    async def sweep(self) -> None:
        """End idle branches and drop silent nodes (one pass; the sweeper task calls it periodically)."""
        if not self.store_ok:
            return
        expired, changes = self.dir.expire_idle(self.wall(), self.timers.idle_ttl_s)
        self.metrics.expired_branches.inc(len(expired))
        for node in self.ingest.silent_since(self.mono() - self.timers.node_timeout_s):
            log.warning("node %s silent for %.1fs: purging it", node, self.timers.node_timeout_s)
            changes.merge(await self._to_the_end(self._purge(node, "timeout")))
        if changes:
            await self._commit(changes, strict=False)

    # -- persistence and publication ---------------------------------------------------------
    async def _commit(self, changes: Changes, strict: bool = True) -> None:
        """Persist ``changes`` in call order, then publish count changes. ``strict``: raise UNAVAILABLE."""
        await self.write(self.encode(changes), strict)

    def encode(self, changes: Changes) -> Pending:
        """The store write of ``changes``, encoded now (the rows as the core holds them at this point)."""
        return self.writer.encode(changes)

    def enqueue(self, pending: Pending) -> Written:
        """Queue an encoded write right after its change (:class:`~.writer.StoreWriter`)."""
        return self.writer.enqueue(pending)

    async def write(self, pending: Pending, strict: bool = True) -> None:
        """Persist an encoded write (:meth:`enqueue`, then :meth:`written`)."""
        await self.written(pending, self.enqueue(pending), strict)

    async def written(self, pending: Pending, done: Written, strict: bool = True) -> None:
        """Wait for a queued write; then :meth:`settle` it."""
        self.settle(pending, await done, strict)

    def settle(self, pending: Pending, error: StoreUnavailableError | None, strict: bool = True) -> None:
        """A write is done (``error``: how it failed): publish its count changes. ``strict``: raise
        UNAVAILABLE when the store failed."""
        if error is not None:
            if strict:
                raise StoreUnavailableError(f"store unavailable: {error}") from error
            return
        self.watchers.publish(pending.changes.counts)

    def _store_failed(self, error: StoreUnavailableError) -> None:
        self.store_ok = False
        self._reload_needed = True  # mirror what the store kept once it is back
        self.metrics.store_up.set(0)

    def _require_store(self) -> None:
        if not self.store_ok:
            raise StoreUnavailableError("store (Redis) unavailable; retry later")

    # -- RPC plumbing ------------------------------------------------------------------------
    async def _run(self, method: str, context: Ctx, work: Awaitable[T]) -> T:
        t0 = time.perf_counter()
        code = grpc.StatusCode.OK
        reason = ""
        try:
            return await work
        except AgentpoolError as e:
            code, reason = grpc_status(e), str(e)
        finally:
            self.metrics.observe(method, code.name, time.perf_counter() - t0)
        await context.abort(code, reason)
        raise AssertionError("context.abort returned")

    def _known_node(self, name: str) -> str:
        node = node_name(name)
        if not self.dir.has_node(node):
            raise UnknownNodeError(f"unknown node {node!r}: it has not registered (resync)")
        return node

    def _check_branch_cap(self, branch: str) -> None:
        cap = self.limits.max_branches
        if branch not in self.dir.branches and len(self.dir.branches) >= cap:
            raise QuotaExceededError(
                f"the directory holds {cap} live branches, its cap: end branches (or raise --max-branches)"
            )

    def _known_branch(self, name: str) -> str:
        branch = branch_id(name)
        if branch not in self.dir.branches:
            raise UnknownBranchError(f"unknown branch {branch!r}: Resolve a request of it first")
        return branch

    # -- Resolve / Place / EndBranch ---------------------------------------------------------
    async def Resolve(self, request: pb.ResolveRequest, context: Ctx) -> bytes:
        return await self._run("Resolve", context, self._resolve(request))

    async def _resolve(self, request: pb.ResolveRequest) -> bytes:
        return self.resolve_now(request)

    def resolve_now(self, request: pb.ResolveRequest) -> bytes:
        """The encoded ``ResolveResponse`` (see :class:`ResolveEncoder`); reads only, never waits."""
        hashes = request_blocks(request, self.limits.max_blocks_per_request)
        branch = branch_id(request.branch) if request.branch else None
        res = self.dir.lookup(hashes, branch)  # read-only: the request's Place applies E.1
        info = None
        obs = res.observation
        if branch is not None and obs is not None:
            state = self.dir.branches.find(branch)
            paths = not request.omit_paths
            info = pb.BranchInfo(
                branch=branch,
                version=obs.version,
                is_new=obs.is_new,
                version_bumped=obs.version_bumped,
                previous_path=obs.old_path if paths else (),
                new_path=obs.new_path if paths else (),
                counted_nodes=sorted(state.counted) if state is not None else [],
            )
        return self._encoder.encode(res.prefixes, self.dir.phases(), info)

    async def Place(self, request: pb.PlaceRequest, context: Ctx) -> pb.PlaceResponse:
        return await self._run("Place", context, self._place(request))

    async def _place(self, request: pb.PlaceRequest) -> pb.PlaceResponse:
        placed = self.place_now(request)
        await self.write(placed.pending)
        return self.place_response(placed)

    def place_now(self, request: pb.PlaceRequest) -> Placed:
        """Apply a Place to the core at once (later Resolves see it) and encode its store write; the
        caller persists it (:meth:`write`) before it tells anyone the Place succeeded."""
        if request.block_hashes:
            branch = branch_id(request.branch)
            hashes = request_blocks(request, self.limits.max_blocks_per_request)
            node = node_name(request.node)  # E.1 holds even before the node registers
        else:
            branch, hashes = self._known_branch(request.branch), None
            node = self._known_node(request.node)
        self._require_store()
        now = self.wall()
        is_new = bumped = False
        changes = Changes()
        if hashes is not None:
            self._check_branch_cap(branch)
            observation, changes = self.dir.observe(branch, hashes, now)
            is_new, bumped = observation.is_new, observation.version_bumped
        known = self.dir.has_node(node)
        if known:
            changes.merge(self.dir.place(branch, node, now))
        return Placed(branch, node, is_new, bumped, known, self.encode(changes))

    def place_response(self, placed: Placed) -> pb.PlaceResponse:
        """The answer to a Place (the branch as it is now: after its write)."""
        state = self.dir.branches.get(placed.branch)
        node = placed.node
        return pb.PlaceResponse(
            version=state.version,
            counted_blocks=len(state.counted.get(node, ())),
            counted_nodes=sorted(state.counted),
            move_pending=node in state.pending,
            is_new=placed.is_new,
            version_bumped=placed.bumped,
            node_known=placed.known,
        )

    async def EndBranch(self, request: pb.EndBranchRequest, context: Ctx) -> pb.EndBranchResponse:
        return await self._run("EndBranch", context, self._end_branch(request))

    async def _end_branch(self, request: pb.EndBranchRequest) -> pb.EndBranchResponse:
        response, pending = self.end_branch_now(request)
        await self.write(pending)
        return response

    def end_branch_now(self, request: pb.EndBranchRequest) -> tuple[pb.EndBranchResponse, Pending]:
        """End the branch in the core at once; its store write for the caller to persist."""
        branch = self._known_branch(request.branch)
        self._require_store()
        nodes = len(self.dir.branches.get(branch).counted)
        return pb.EndBranchResponse(released_nodes=nodes), self.encode(self.dir.end_branch(branch))

    # -- nodes -------------------------------------------------------------------------------
    async def SwitchPhase(self, request: pb.SwitchPhaseRequest, context: Ctx) -> pb.SwitchPhaseResponse:
        return await self._run("SwitchPhase", context, self._switch_phase(request))

    async def _switch_phase(self, request: pb.SwitchPhaseRequest) -> pb.SwitchPhaseResponse:
        node = node_name(request.node)
        phase = phase_from_pb(request.phase)
        self._require_store()
        previous = phase_to_pb(self.dir.phase(node)) if self.dir.has_node(node) else pb.PHASE_UNSPECIFIED
        if not self.dir.has_node(node):
            check_node_cap(self.dir, self.limits.max_nodes)
        changes = self.dir.register_node(node, phase)
        self.ingest.expect([node])
        await self._commit(changes)
        return pb.SwitchPhaseResponse(previous_phase=previous, released_branches=len(changes.branches))

    async def DropNode(self, request: pb.DropNodeRequest, context: Ctx) -> pb.DropNodeResponse:
        return await self._run("DropNode", context, self._drop_node(request))

    async def _drop_node(self, request: pb.DropNodeRequest) -> pb.DropNodeResponse:
        node = self._known_node(request.node)
        self._require_store()
        purged = self.dir.index.node_block_count(node) if self.dir.index.has_node(node) else 0
        changes = await self._to_the_end(self._purge_and_commit(node))
        return pb.DropNodeResponse(released_branches=len(changes.branches), purged_blocks=purged)

    async def EvictionOrder(self, request: pb.EvictionOrderRequest, context: Ctx) -> pb.EvictionOrderResponse:
        return await self._run("EvictionOrder", context, self._eviction_order(request))

    async def _eviction_order(self, request: pb.EvictionOrderRequest) -> pb.EvictionOrderResponse:
        node = self._known_node(request.node)
        if request.limit > self.limits.max_eviction_limit:
            raise InvalidRequestError(f"limit {request.limit} exceeds {self.limits.max_eviction_limit}")
        order = self.dir.eviction_order(node, request.limit or None)
        return pb.EvictionOrderResponse(blocks=[eviction_entry(c) for c in order])

    async def Health(self, request: pb.HealthRequest, context: Ctx) -> pb.HealthResponse:
        return self.health_response()

    def health_response(self) -> pb.HealthResponse:
        return pb.HealthResponse(
            serving=self.store_ok,
            store_ok=self.store_ok,
            nodes=len(self.dir.phases()),
            branches=len(self.dir.branches),
            blocks=len(self.dir.index),
        )

    # -- engine event stream -----------------------------------------------------------------
    async def PublishEvents(
        self, request_iterator: AsyncIterator[tuple[pb.KvEventBatch, PackedResync | None]], context: Ctx
    ) -> AsyncIterator[pb.PublishAck]:
        """The engine's stream; its batches come parsed by :func:`resync_wire.parse_batch`."""
        async for batch, packed in request_iterator:
            t0 = time.perf_counter()
            try:
                ack = await self.apply_batch(batch, packed)
            except (InvalidRequestError, QuotaExceededError) as e:
                code = grpc_status(e)
                self.metrics.requests.labels("PublishEvents", code.name).inc()
                await context.abort(code, str(e))
                return
            self.metrics.latency.labels("PublishEvents").observe(time.perf_counter() - t0)
            yield ack

    async def apply_batch(self, batch: pb.KvEventBatch, packed: PackedResync | None = None) -> pb.PublishAck:
        """Apply one engine batch (validated as a whole first), persist what it changed; returns its ack.
        A resync runs in steps (other RPCs are served between them); the node's lock keeps its other
        batches and its purge out meanwhile. A resync runs to its end even when its stream goes away
        meanwhile (a half-applied one would leave the node's index inconsistent). ``packed``: the
        resync's block lists when the batch was parsed without them."""
        if batch.HasField("resync"):
            return await self._to_the_end(self._apply(batch, packed))
        return await self._apply(batch, packed)

    def _to_the_end(self, work: Awaitable[T]) -> Awaitable[T]:
        """Run ``work`` as a task that a cancelled caller does not cancel (stop() does)."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(settled)
        task.add_done_callback(self._background.discard)
        return asyncio.shield(task)

    async def _apply(self, batch: pb.KvEventBatch, packed: PackedResync | None) -> pb.PublishAck:
        async with self._node_lock(node_name(batch.node)):
            if batch.HasField("resync"):
                ack, changes = await self.ingest.resync(batch, packed)
            else:
                ack, changes = self.ingest.apply(batch)
        if changes:
            await self._commit(changes, strict=False)
        return ack

    def _node_lock(self, node: str) -> asyncio.Lock:
        lock = self._node_locks.get(node)
        if lock is None:
            lock = self._node_locks[node] = asyncio.Lock()
        return lock

    async def _purge_and_commit(self, node: str) -> Changes:
        changes = await self._purge(node, "request")
        await self._commit(changes)
        return changes

    async def _purge(self, node: str, reason: str) -> Changes:
        """Drop ``node`` (gone from every answer at once; its index entries are cleared in steps)."""
        async with self._node_lock(node):
            changes = Changes()
            if self.dir.has_node(node):
                changes = await run_steps(self.dir.drop_node_steps(node))
            self.ingest.forget(node)
            self.metrics.dropped_nodes.labels(reason).inc()
        self._node_locks.pop(node, None)
        return changes

    # -- count streams -----------------------------------------------------------------------
    async def WatchCounts(
        self, request: pb.WatchCountsRequest, context: Ctx
    ) -> AsyncIterator[pb.CountUpdate]:
        try:
            node = self._known_node(request.node)
        except RPC_ERRORS as e:
            code = grpc_status(e)
            await context.abort(code, str(e))
            return
        async for update in self.watchers.stream(node, self.limits.watch_queue, self.limits.snapshot_part):
            yield update
