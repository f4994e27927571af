"""A router's session with the directory: Resolves, Places and EndBranches on one ``Route`` stream.

One unary gRPC call costs the caller about 300 us of CPU in grpc.aio; a router asks twice per request
(Resolve before routing, Place once a node took the request). On the stream a Resolve is one message
each way and a Place one message out, not waited for (``quiet``: the directory answers only when it
failed, and the failure is handed to ``on_place_error``). Operations queued while a message is being
written go out together in the next one. The directory applies a stream's operations in order, so a
Place is seen by every later operation of the same router (an EndBranch of the branch included).

    session = DirectorySession(client)
    answer = await session.resolve(hashes, "agent-7")  # read-only
    session.place("agent-7", "node-3", hashes)  # node-3 took the request: E.1 + E.2, not waited for

The stream is opened on first use and again after it broke (the directory restarted, the connection
dropped); operations in flight when it broke fail with :class:`DirectoryRpcError`. It is a gRPC call
(a :class:`DirectoryClient`) or a Route link connection (a
:class:`agentpool.directory.link_client.LinkClient`, the same batches on a framed connection).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc
from google.protobuf.message import DecodeError

from agentpool.directory import framing
from agentpool.directory.client import DirectoryRpcError, RouteStream
from agentpool.v1 import directory_pb2 as pb

log = logging.getLogger(__name__)

_CODES = {c.value[0]: c for c in grpc.StatusCode}

PlaceErrorHandler = Callable[[DirectoryRpcError], None]


class RouteClient(Protocol):
    """What opens the session's streams: a ``DirectoryClient`` or a ``LinkClient``."""

    timeout_s: float

    def open_route(self) -> RouteStream: ...


def _log_place_error(e: DirectoryRpcError) -> None:
    log.warning("directory Place failed: %s", e)


class DirectorySession:
    def __init__(
        self,
        client: RouteClient,
        on_place_error: PlaceErrorHandler = _log_place_error,
        stale_s: float = 1.0,
        place_delay_s: float = 0.025,
    ) -> None:
        """``on_place_error``: called with each failed Place (its reply, or the stream breaking before
        it went out). ``stale_s``: a Resolve left unanswered this long when its caller gave up means the
        stream is stuck (a directory that went away without closing it): the next operation opens a
        new one. A Resolve not answered within ``client.timeout_s`` (or its own ``timeout_s``) fails
        with DEADLINE_EXCEEDED. ``place_delay_s``: how long a Place may wait for another operation to
        travel with (it goes at once with the next Resolve; 0: at once). 25 ms: a router at 100
        requests a second (one every 10 ms) sends each Place with the next Resolve instead of alone,
        one message each way per request instead of two messages out (half the directory's wake-ups
        at one request in flight); another replica sees the Place up to that much later."""
        self.client = client
        self.on_place_error = on_place_error
        self.stale_s = stale_s
        self.place_delay_s = place_delay_s
        self._flush_timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._call: RouteStream | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[pb.RouteReply]] = {}
        self._out: list[bytes] = []
        self._out_places = 0  # quiet Places among _out
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- operations --------------------------------------------------------------------------
    async def resolve(
        self,
        block_hashes: Sequence[int],
        branch: str | None = None,
        *,
        omit_paths: bool = True,
        timeout_s: float | None = None,
    ) -> pb.ResolveResponse:
        """Read-only lookup (see ``Resolve`` in the proto); ``omit_paths`` by default (a router needs
        the branch's version, not two more copies of the prompt's hashes). Not answered within
        ``timeout_s`` (default ``client.timeout_s``): DEADLINE_EXCEEDED."""
        request = framing.resolve_request(block_hashes, branch or "", omit_paths)
        reply = await self._ask(lambda op_id: framing.route_op(op_id, resolve=request), timeout_s)
        return reply.resolve

    async def place_and_wait(
        self, branch: str, node: str, block_hashes: Sequence[int] = ()
    ) -> pb.PlaceResponse:
        """A Place whose answer is waited for (after its store write)."""
        request = framing.place_request(branch, node, block_hashes)
        reply = await self._ask(lambda op_id: framing.route_op(op_id, place=request))
        return reply.place

    async def end_branch(self, branch: str) -> int:
        """End ``branch`` after this stream's Places of it; returns how many nodes it held counts on."""
        reply = await self._ask(lambda op_id: _end_branch_op(op_id, branch))
        return int(reply.end_branch.released_nodes)

    def place(self, branch: str, node: str, block_hashes: Sequence[int] = ()) -> None:
        """``node`` took a request of ``branch`` (see ``Place`` in the proto); sent, not waited for: a
        failure goes to ``on_place_error``."""
        self._ensure_open()
        op = framing.route_op(
            next(self._ids), place=framing.place_request(branch, node, block_hashes), quiet=True
        )
        self._out.append(op)
        self._out_places += 1
        if self.place_delay_s <= 0:
            self._wake.set()
        elif self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(self.place_delay_s, self._wake.set)

    async def _ask(self, encode: Callable[[int], bytes], timeout_s: float | None = None) -> pb.RouteReply:
        self._ensure_open()
        op_id = next(self._ids)
        future: asyncio.Future[pb.RouteReply] = asyncio.get_running_loop().create_future()
        self._waiting[op_id] = future
        self._out.append(encode(op_id))
        self._wake.set()
        call, sent = self._call, time.monotonic()
        # a timer on the future, not asyncio.timeout (several times the CPU, on every Resolve)
        limit = self.client.timeout_s if timeout_s is None else timeout_s
        timer = asyncio.get_running_loop().call_later(limit, _expire, future)
        try:
            reply = await future
        except TimeoutError:
            self._reset(call, "no reply within the client's timeout")
            raise DirectoryRpcError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "no reply from the directory"
            ) from None
        finally:
            timer.cancel()
            self._waiting.pop(op_id, None)
            unanswered = future.cancelled() or not future.done()  # the caller gave up waiting
            if unanswered and time.monotonic() - sent >= self.stale_s:
                self._reset(call, f"no reply for {self.stale_s:g} s")
        if reply.WhichOneof("result") == "error":
            raise _error(reply.error)
        return reply

    # -- the stream --------------------------------------------------------------------------
    def _ensure_open(self) -> None:
        if self._call is not None:
            return
        call = self.client.open_route()
        self._call = call
        self._tasks = [
            asyncio.create_task(self._write(call), name="directory-route-writer"),
            asyncio.create_task(self._read(call), name="directory-route-reader"),
        ]

    async def _write(self, call: RouteStream) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if self._out:
                    if self._flush_timer is not None:
                        self._flush_timer.cancel()
                        self._flush_timer = None
                    data, self._out = b"".join(self._out), []
                    self._out_places = 0
                    await call.write(data)
                if self._closing:
                    if self._out:  # queued while the last message was being written: send it first
                        self._wake.set()
                        continue
                    await call.done_writing()
                    return
        except DirectoryRpcError:
            return  # the stream ended: the reader reports how

    async def _read(self, call: RouteStream) -> None:
        try:
            while True:
                message = pb.RouteReplies.FromString(await call.read())
                for reply in message.replies:
                    self._deliver(reply)
        except DirectoryRpcError as e:
            error = e
        except DecodeError as e:
            error = DirectoryRpcError(grpc.StatusCode.INTERNAL, f"malformed RouteReplies: {e}")
            call.cancel()
        if self._call is call:
            self._broken(error)

    def _deliver(self, reply: pb.RouteReply) -> None:
        future = self._waiting.get(reply.id)
        if future is not None:
            if not future.done():
                future.set_result(reply)
        elif reply.WhichOneof("result") == "error":  # a quiet Place failed
            self.on_place_error(_error(reply.error))

    def _broken(self, error: DirectoryRpcError) -> None:
        """The stream ended: fail what waits on it; the next operation opens a new one."""
        self._call = None
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        for t in self._tasks:
            if t is not asyncio.current_task():
                t.cancel()
        self._tasks = []
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)
        unsent, self._out_places, self._out = self._out_places, 0, []
        for _ in range(unsent):
            self.on_place_error(error)

    def _reset(self, call: RouteStream | None, why: str) -> None:
        """Replace ``call`` if it is still the session's stream."""
        if call is None or call is not self._call:
            return
        log.warning("directory Route stream looks stuck (%s): opening a new one", why)
        self._broken(DirectoryRpcError(grpc.StatusCode.UNAVAILABLE, f"Route stream reset: {why}"))
        call.cancel()

    async def close(self, grace_s: float = 1.0) -> None:
        """Send what is queued, end the stream; wait at most ``grace_s`` for the directory to answer
        the last operations (a failed Place is still reported)."""
        call, tasks = self._call, self._tasks
        if call is None:
            return
        self._closing = True
        self._wake.set()
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
        self._call, self._tasks = None, []
        call.cancel()
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._closing = False


def _expire(future: asyncio.Future[pb.RouteReply]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _error(e: pb.RouteError) -> DirectoryRpcError:
    return DirectoryRpcError(_CODES.get(e.code, grpc.StatusCode.UNKNOWN), e.reason)


def _end_branch_op(op_id: int, branch: str) -> bytes:
    op = pb.RouteOp(id=op_id, end_branch=pb.EndBranchRequest(branch=branch))
    encoded: bytes = pb.RouteBatch(ops=[op]).SerializeToString()
    return encoded  # a batch of one op: concatenates with the others
