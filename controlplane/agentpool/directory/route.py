"""The server side of ``Route``: a router's Resolves and Places on one long-lived stream.

Each ``RouteBatch`` is applied in order and at once: a Resolve reads the core, a Place changes it
(:meth:`DirectoryService.place_now`), so a later operation of the stream sees every earlier Place. A
Place's store write then runs in order with every other write (:meth:`DirectoryService.write`); its
reply (or, for a ``quiet`` Place, only its error) follows once the write is done. Replies ready at the
same time go out in one ``RouteReplies`` message. A big batch (many routers' requests at once) is
applied ``CHUNK_OPS`` operations at a time, the loop turning in between so that the answers ready go
out while the rest is applied: one reply per batch made every request of a batch wait for the whole
batch, which kept the router's requests in lockstep (at 64 requests in flight: 127 operations a
batch, a fifth of the throughput of smaller pipelined batches). A malformed message ends the stream
with INVALID_ARGUMENT; a bad operation gets an error reply and the stream goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError

from agentpool.directory import framing
from agentpool.directory.convert import InvalidRequestError
from agentpool.directory.service import RPC_ERRORS, DirectoryService, Placed, grpc_status
from agentpool.directory.store import Pending, StoreUnavailableError
from agentpool.directory.writer import Written
from agentpool.v1 import directory_pb2 as pb

if TYPE_CHECKING:
    Ctx = grpc.aio.ServicerContext[Any, Any]

log = logging.getLogger(__name__)

_OK = grpc.StatusCode.OK.name
CHUNK_OPS = 16  # operations applied between two turns of the loop (their answers go out meanwhile)

Settle = Callable[[StoreUnavailableError | None], None]  # what follows a write: its reply, or its error


class RouteSession:
    """One ``Route`` stream: applies the batches it reads, queues the replies for the writer."""

    def __init__(self, service: DirectoryService) -> None:
        self.service = service
        self._replies: list[bytes] = []
        self._wake = asyncio.Event()
        self._writes: set[Written] = set()  # store writes whose outcome is not settled yet
        self._reading = True
        self._failure: Exception | None = None
        self._writes_of_batch: list[tuple[Pending, Settle]] = []

    # -- reading and applying ----------------------------------------------------------------
    async def read(self, batches: AsyncIterator[bytes]) -> None:
        """Apply every batch the client sends until it is done (or sends a malformed one)."""
        try:
            async for raw in batches:
                try:
                    ops = pb.RouteBatch.FromString(raw).ops
                except DecodeError as e:
                    raise InvalidRequestError(f"malformed RouteBatch: {e}") from None
                for start in range(0, len(ops), CHUNK_OPS):
                    if self._replies:
                        await asyncio.sleep(0)  # the writer sends the answers ready before
                    self.apply(ops[start : start + CHUNK_OPS])
        except InvalidRequestError as e:
            self._failure = e
        finally:
            self._reading = False
            self._wake.set()

    def apply(self, ops: Sequence[pb.RouteOp]) -> None:
        """Apply ``ops`` (a batch's, or a chunk of them) in order; replies are queued (Places' after
        their writes). Their store writes are queued at the end, in order and in the same step as the
        changes (so no other write comes between), after the Resolve answers: those go out first,
        before the store writer spends its time encoding the rows."""
        writes: list[tuple[Pending, Settle]] = []
        self._writes_of_batch = writes
        for op in ops:
            kind = op.WhichOneof("op")
            if kind == "resolve":
                self._resolve(op.id, op.resolve)
            elif kind == "place":
                self._place(op.id, op.place, op.quiet)
            elif kind == "end_branch":
                self._end_branch(op.id, op.end_branch)
            else:
                self._reply(
                    framing.error_reply(op.id, grpc_status(InvalidRequestError()).value[0], "empty operation")
                )
        for pending, then in writes:
            self._track(self.service.enqueue(pending), then)

    def _resolve(self, op_id: int, request: pb.ResolveRequest) -> None:
        t0 = time.perf_counter()
        code = _OK
        try:
            self._reply(framing.resolve_reply(op_id, self.service.resolve_now(request)))
        except RPC_ERRORS as e:
            status = grpc_status(e)
            code = status.name
            self._reply(framing.error_reply(op_id, status.value[0], str(e)))
        self.service.metrics.observe("Resolve", code, time.perf_counter() - t0)

    def _place(self, op_id: int, request: pb.PlaceRequest, quiet: bool) -> None:
        t0 = time.perf_counter()
        try:
            placed = self.service.place_now(request)
        except RPC_ERRORS as e:
            status = grpc_status(e)
            self.service.metrics.observe("Place", status.name, time.perf_counter() - t0)
            self._reply(framing.error_reply(op_id, status.value[0], str(e)))
            return
        self._writes_of_batch.append(
            (placed.pending, lambda error: self._placed(op_id, placed, error, quiet, t0))
        )

    def _placed(
        self, op_id: int, placed: Placed, error: StoreUnavailableError | None, quiet: bool, t0: float
    ) -> None:
        try:
            self.service.settle(placed.pending, error)
        except RPC_ERRORS as e:
            status = grpc_status(e)
            self.service.metrics.observe("Place", status.name, time.perf_counter() - t0)
            self._reply(framing.error_reply(op_id, status.value[0], str(e)))
            return
        self.service.metrics.observe("Place", _OK, time.perf_counter() - t0)
        if not quiet:
            self._reply(framing.place_reply(op_id, self.service.place_response(placed)))

    def _end_branch(self, op_id: int, request: pb.EndBranchRequest) -> None:
        t0 = time.perf_counter()
        try:
            response, pending = self.service.end_branch_now(request)
        except RPC_ERRORS as e:
            status = grpc_status(e)
            self.service.metrics.observe("EndBranch", status.name, time.perf_counter() - t0)
            self._reply(framing.error_reply(op_id, status.value[0], str(e)))
            return
        self._writes_of_batch.append(
            (pending, lambda error: self._ended(op_id, response, pending, error, t0))
        )

    def _ended(
        self,
        op_id: int,
        response: pb.EndBranchResponse,
        pending: Pending,
        error: StoreUnavailableError | None,
        t0: float,
    ) -> None:
        try:
            self.service.settle(pending, error)
        except RPC_ERRORS as e:
            status = grpc_status(e)
            self.service.metrics.observe("EndBranch", status.name, time.perf_counter() - t0)
            self._reply(framing.error_reply(op_id, status.value[0], str(e)))
            return
        self.service.metrics.observe("EndBranch", _OK, time.perf_counter() - t0)
        reply = pb.RouteReplies(replies=[pb.RouteReply(id=op_id, end_branch=response)])
        self._reply(reply.SerializeToString())

    def _track(self, done: Written, then: Settle) -> None:
        """``then`` runs when the write is done, from a callback on its future, not a task per write
        (a Place at a time: one task less to create and to step). Registered first, it runs before
        anyone waiting for the write (``next_replies``, ``close``) wakes: the reply is queued by then."""
        self._writes.add(done)

        def settled(f: Written) -> None:
            self._writes.discard(f)
            if not f.cancelled():
                then(f.result())

        done.add_done_callback(settled)

    def _reply(self, encoded: bytes) -> None:
        self._replies.append(encoded)
        self._wake.set()

    # -- writing -----------------------------------------------------------------------------
    async def next_replies(self) -> bytes | None:
        """The replies ready now as one encoded ``RouteReplies``; None once the client is done and
        every write has finished (raises what ended the reading)."""
        while not self._replies:
            if self._failure is not None:  # malformed input: the call ends with it
                raise self._failure
            if not self._reading and not self._writes:
                return None
            self._wake.clear()
            if not self._reading and self._writes:
                await asyncio.wait(set(self._writes))
                continue
            await self._wake.wait()
        replies, self._replies = self._replies, []
        return b"".join(replies)

    async def close(self) -> None:
        """Let the started writes finish (the client may be gone; the core and the store stay in step)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)


async def serve_route(service: DirectoryService, batches: AsyncIterator[bytes], context: Ctx) -> None:
    """The ``Route`` handler: reads in a task of its own, writes replies as they are ready."""
    session = RouteSession(service)
    reader = asyncio.create_task(session.read(batches))
    try:
        while (replies := await session.next_replies()) is not None:
            await context.write(replies)
        await reader  # done: raises what it did not expect (the call ends UNKNOWN)
    except InvalidRequestError as e:
        await context.abort(grpc_status(e), str(e))
    finally:
        reader.cancel()
        await session.close()
