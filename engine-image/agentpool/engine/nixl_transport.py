"""Real block transfers between host pools with NIXL (UCX backend, DRAM).

Each engine registers its pool buffer with one NIXL agent and publishes :class:`PoolInfo` (agent
name, metadata, buffer address, block size). A reader adds the peer's metadata once and READs
``(local slot, remote slot)`` pairs.

Descriptors are prepared once, not per transfer: one strided descriptor list over every local slot
at start, one over every slot of a peer's pool when the peer is first seen (``prepXferDlist`` with an
``(address, length, device, stride, count)`` row); a READ names slots by index (``makeXferReq``) and
NIXL merges runs contiguous on both sides into one descriptor.

The agent is built on NIXL's binding (``nixlBind``) rather than its ``nixl_agent`` wrapper because the
wrapper fixes the progress thread's delay at 0: the thread then polls UCX without pause and an idle
engine burns ~25% of a core. With a delay the thread sleeps in ``poll()`` on the UCX workers' event
descriptors and wakes on traffic, or after the delay at the latest (``progress_delay_us``). This
node's own READs do not wait for that thread: polling a transfer's state progresses UCX.

One-sided fetches (:meth:`NixlTransport.read_indexed`): the pool's slot table (``slottable.py``) is
registered too, and a reader finds a peer's blocks and validates what it read with small READs of that
table (three READs in one executor call: the blocks' index sets, the blocks, the slots' headers), with
no work by the peer's process: on loopback UCX reads the peer's memory itself (a 4 x 16 B READ took
~15 us, ~23 us with the peer process stopped; a lease round trip to the peer ~450 us). Each reader
keeps a small registered scratch area for those table READs.

NIXL calls are blocking C calls: every one of them runs on one dedicated thread (the agent is used
from that thread only), and the event loop awaits it. A read's deadline counts from when it is asked
for, its wait for that thread included: a read the thread has not started by its deadline fails then
and never starts, however long the thread stays busy (before, reads queued behind a slow or hung one
each got a fresh deadline once the thread reached them). A transfer that does not finish within its
deadline is released and raised as :class:`FetchError`, as is a peer that disconnected.
:attr:`NixlTransport.pending` and :attr:`NixlTransport.busy_since` say how many reads wait or run
and since when the thread works on the current one (the engine's stall log reports them).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from agentpool.engine import slottable
from agentpool.engine.errors import FetchError
from agentpool.engine.slottable import HEADER_BYTES, SET_BYTES, SlotTable

log = logging.getLogger(__name__)
_SPIN_S = 0.05  # a transfer polled without sleeping for this long (most finish well within it)
PROGRESS_DELAY_US = 100_000  # the progress thread's longest sleep when UCX reports no event
SCRATCH_BLOCKS = 4096  # most blocks one one-sided fetch looks up (a larger one takes a lease)
_T = TypeVar("_T")
_START_GRACE_S = 0.05  # past a read's deadline, how long its caller waits for the thread to start it
_SET_WORDS = SET_BYTES // 8
_HEADER_WORDS = HEADER_BYTES // 8


@dataclass(frozen=True, slots=True)
class PoolInfo:
    """What a peer needs to READ from a pool: the NIXL agent and where the slots are."""

    agent: str
    metadata: bytes
    base: int
    block_bytes: int
    slots: int
    table: int = 0  # address of the slot table (0: the peer publishes none)
    sets: int = 0  # index sets in the slot table

    def to_json(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "metadata": base64.b64encode(self.metadata).decode(),
            "base": self.base,
            "block_bytes": self.block_bytes,
            "slots": self.slots,
            "table": self.table,
            "sets": self.sets,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PoolInfo:
        try:
            return cls(
                str(d["agent"]),
                base64.b64decode(d["metadata"], validate=True),
                int(d["base"]),
                int(d["block_bytes"]),
                int(d["slots"]),
                int(d.get("table", 0)),
                int(d.get("sets", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise FetchError(f"bad pool info from peer: {e}") from None


@dataclass(frozen=True, slots=True)
class _Remote:
    """A peer added to the agent: the name NIXL gave it and its prepared slot list."""

    name: str
    dlist: int
    sets: int = 0  # prepared list of the peer's index sets (0: none)
    headers: int = 0  # prepared list of the peer's slot headers


@dataclass(frozen=True, slots=True)
class IndexedRead:
    """What :meth:`NixlTransport.read_indexed` did: bytes moved, or why it found nothing to trust."""

    moved: int
    miss: str | None = None  # "not_indexed" (a block not in the peer's index), "changed" (overwritten)


@dataclass(slots=True)
class _Ticket:
    """A read handed to the NIXL thread: whether the thread began it, or its caller gave up first."""

    started: bool = False
    given_up: bool = False


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """A read whose caller gave up ends (or fails unstarted) unawaited: its outcome is dropped."""
    if not fut.cancelled():
        fut.exception()


class NixlTransport:
    """One NIXL agent over one registered host buffer; reads from peers' buffers."""

    def __init__(
        self,
        name_prefix: str,
        buffer: npt.NDArray[np.uint8],
        block_bytes: int,
        progress_delay_us: int = PROGRESS_DELAY_US,
        table: SlotTable | None = None,
        scratch_blocks: int = SCRATCH_BLOCKS,
    ) -> None:
        if progress_delay_us < 0:
            raise ValueError("progress_delay_us must be non-negative")
        self.name = f"{name_prefix}-{os.getpid()}-{secrets.token_hex(3)}"
        self.buffer = buffer
        self.block_bytes = block_bytes
        self.progress_delay_us = progress_delay_us
        self.table = table
        self.scratch_blocks = scratch_blocks
        # the table READs land here: ``scratch_blocks`` sets, then as many slot headers
        self._scratch = np.zeros(scratch_blocks * (_SET_WORDS + _HEADER_WORDS), dtype=np.uint64)
        self._words = self._scratch.view(np.uint8).data.cast("Q")
        self._arange = np.arange(scratch_blocks, dtype=np.int32)
        self._scratch_sets = 0  # prepared lists over the scratch area
        self._scratch_headers = 0
        self.after_lookup: Callable[[], None] | None = None  # a test seam: runs between two READs
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nixl")
        self._bind: Any = None  # the nixlBind module (an optional dependency, imported at start)
        self._agent: Any = None
        self._backend = 0
        self._local = 0  # prepared list of every local slot
        self._metadata = b""
        self._remotes: dict[str, _Remote] = {}  # peer agent name -> its entry
        self._errors: tuple[type[BaseException], ...] = (RuntimeError,)  # NIXL's binding errors
        self.pending = 0  # reads asked for and not answered yet (queued for the thread or running)
        self.busy_since: float | None = None  # monotonic time the thread began its current read
        self._tickets = threading.Lock()  # a read's start on the thread vs its caller giving up

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._start)

    def _start(self) -> None:
        from nixl._api import nixlBind  # the optional dependency

        found = [v for k, v in vars(nixlBind).items() if k.endswith("Error") and isinstance(v, type)]
        self._errors = (*found, RuntimeError)
        cfg = nixlBind.nixlAgentConfig()
        cfg.useProgThread = True
        cfg.useListenThread = False
        cfg.syncMode = nixlBind.NIXL_THREAD_SYNC_NONE  # the agent is used from one thread
        cfg.pthrDelay = self.progress_delay_us
        cfg.captureTelemetry = False
        agent = nixlBind.nixlAgent(self.name, cfg)
        if "UCX" not in agent.getAvailPlugins():
            raise RuntimeError("NIXL has no UCX plugin: cannot serve the host KV pool")
        self._backend = agent.createBackend("UCX", {})
        buf = self.buffer
        arrays: list[npt.NDArray[Any]] = [buf, self._scratch]
        if self.table is not None:
            arrays.append(self.table.array)
        regions = np.array([[a.ctypes.data, a.nbytes, 0] for a in arrays], dtype=np.uint64)
        agent.registerMem(nixlBind.nixlRegDList(nixlBind.DRAM_SEG, regions), [self._backend])

        def prep(base: int, length: int, count: int) -> int:
            rows = np.array([[base, length, 0, length, count]], dtype=np.uint64)
            dlist: int = agent.prepXferDlist(
                nixlBind.NIXL_INIT_AGENT, nixlBind.DRAM_SEG, rows, [self._backend]
            )
            return dlist

        self._local = prep(int(buf.ctypes.data), self.block_bytes, self._slots())
        scratch = int(self._scratch.ctypes.data)
        self._scratch_sets = prep(scratch, SET_BYTES, self.scratch_blocks)
        self._scratch_headers = prep(
            scratch + self.scratch_blocks * SET_BYTES, HEADER_BYTES, self.scratch_blocks
        )
        self._bind = nixlBind
        self._agent = agent
        self._metadata = agent.getLocalMD()

    def _slots(self) -> int:
        return self.buffer.nbytes // self.block_bytes

    def _slot_rows(self, base: int, slots: int, length: int = 0) -> npt.NDArray[np.uint64]:
        """One strided descriptor row: ``slots`` pieces of ``length`` (a block) bytes from ``base``."""
        n = length or self.block_bytes
        return np.array([[base, n, 0, n, slots]], dtype=np.uint64)

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def info(self) -> PoolInfo:
        if self._agent is None:
            raise RuntimeError("the NIXL transport is not started")
        t = self.table
        return PoolInfo(
            self.name,
            self._metadata,
            int(self.buffer.ctypes.data),
            self.block_bytes,
            self._slots(),
            0 if t is None else int(t.array.ctypes.data),
            0 if t is None else t.sets,
        )

    # -- reads ----------------------------------------------------------------------------------
    async def read(self, peer: PoolInfo, pairs: Sequence[tuple[int, int]], timeout_s: float) -> int:
        """READ ``(local slot, remote slot)`` pairs from ``peer``; returns the bytes moved."""
        if peer.block_bytes != self.block_bytes:
            raise FetchError(f"peer block size {peer.block_bytes} != local {self.block_bytes}")
        if not pairs:
            return 0
        idx = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        if idx[:, 1].min() < 0 or idx[:, 1].max() >= peer.slots:
            raise FetchError("peer named a slot outside its pool")
        if idx[:, 0].min() < 0 or idx[:, 0].max() >= self._slots():
            raise ValueError("a local slot outside this pool")
        local = np.ascontiguousarray(idx[:, 0], dtype=np.int32)
        remote = np.ascontiguousarray(idx[:, 1], dtype=np.int32)
        deadline = time.monotonic() + timeout_s
        read = functools.partial(self._read, peer, local, remote, deadline, timeout_s)
        return await self._on_thread(peer, deadline, timeout_s, read)

    async def _on_thread(self, peer: PoolInfo, deadline: float, timeout_s: float, fn: Callable[[], _T]) -> _T:
        """``fn()`` (a read from ``peer``) on the NIXL thread, counted in :attr:`pending` and timed in
        :attr:`busy_since`. A read the thread has not started by ``deadline`` fails then and never
        starts (however long the thread stays busy); one it started is bounded by its own polling."""
        ticket = _Ticket()
        why = f"timed out after {timeout_s:.3g} s waiting for the NIXL thread"

        def run() -> _T:
            with self._tickets:
                late = ticket.given_up or time.monotonic() > deadline
                ticket.started = not late
            if late:
                raise FetchError(f"NIXL read from {peer.agent} {why}")
            self.busy_since = time.monotonic()
            try:
                return fn()
            finally:
                self.busy_since = None

        self.pending += 1
        fut = asyncio.get_running_loop().run_in_executor(self._executor, run)
        try:
            wait = max(0.0, deadline - time.monotonic()) + _START_GRACE_S
            return await asyncio.wait_for(asyncio.shield(fut), wait)
        except BaseException as e:  # timed out or cancelled: a read not started yet never starts
            with self._tickets:
                ticket.given_up = not ticket.started
            if not ticket.given_up and isinstance(e, TimeoutError):
                return await fut  # the thread runs it: its polling ends it at the deadline
            fut.add_done_callback(_retrieve)
            if isinstance(e, TimeoutError):
                raise FetchError(f"NIXL read from {peer.agent} {why}") from None
            raise
        finally:
            self.pending -= 1

    def _remote(self, peer: PoolInfo) -> _Remote:
        entry = self._remotes.get(peer.agent)
        if entry is None:
            bind, agent = self._bind, self._agent
            name = agent.loadRemoteMD(peer.metadata)
            if isinstance(name, bytes):
                name = name.decode()
            be = [self._backend]
            try:
                dlist = agent.prepXferDlist(name, bind.DRAM_SEG, self._slot_rows(peer.base, peer.slots), be)
                sets = headers = 0
                if peer.table and peer.sets:
                    rows = self._slot_rows(peer.table, peer.slots, HEADER_BYTES)
                    headers = agent.prepXferDlist(name, bind.DRAM_SEG, rows, be)
                    rows = self._slot_rows(peer.table + peer.slots * HEADER_BYTES, peer.sets, SET_BYTES)
                    sets = agent.prepXferDlist(name, bind.DRAM_SEG, rows, be)
            except self._errors:
                agent.invalidateRemoteMD(name)
                raise
            entry = self._remotes[peer.agent] = _Remote(name, dlist, sets, headers)
        return entry

    def _forget(self, peer: PoolInfo) -> None:
        entry = self._remotes.pop(peer.agent, None)
        if entry is not None:
            try:
                for d in (entry.dlist, entry.sets, entry.headers):
                    if d:
                        self._agent.releasedDlistH(d)
                self._agent.invalidateRemoteMD(entry.name)
            except self._errors as e:  # the peer is gone anyway
                log.debug("forgetting %s: %s", entry.name, e)

    async def read_indexed(
        self, peer: PoolInfo, hashes: Sequence[int], local: Sequence[int], timeout_s: float
    ) -> IndexedRead:
        """READ blocks ``hashes`` from wherever ``peer``'s slot table says they are into local slots
        ``local``, one-sidedly, and validate them against the table after the READ. A miss
        (``IndexedRead.miss``) leaves the local slots' bytes undefined; the caller takes a lease."""
        if peer.block_bytes != self.block_bytes:
            raise FetchError(f"peer block size {peer.block_bytes} != local {self.block_bytes}")
        if len(hashes) != len(local):
            raise ValueError("one local slot per block")
        if not peer.table or not peer.sets:
            return IndexedRead(0, "no_table")
        if not hashes:
            return IndexedRead(0)
        if len(hashes) > self.scratch_blocks:
            return IndexedRead(0, "too_many")
        if min(local) < 0 or max(local) >= self._slots():
            raise ValueError("a local slot outside this pool")
        want = list(hashes)
        slots = np.asarray(local, dtype=np.int32)
        deadline = time.monotonic() + timeout_s
        read = functools.partial(self._read_indexed, peer, want, slots, deadline, timeout_s)
        return await self._on_thread(peer, deadline, timeout_s, read)

    def _read_indexed(
        self,
        peer: PoolInfo,
        want: list[int],
        local: npt.NDArray[np.int32],
        deadline: float,
        timeout_s: float,
    ) -> IndexedRead:
        n = len(want)
        scratch = self._arange[:n]
        with self._reading(peer):
            entry = self._remote(peer)
            sets = np.array([slottable.set_of(h, peer.sets) for h in want], dtype=np.int32)
            self._xfer(peer, self._scratch_sets, scratch, entry.sets, sets, deadline, timeout_s)
            found = slottable.find(self._words, want)
            if found is None:
                return IndexedRead(0, "not_indexed")
            slots, gens = found
            if max(slots) >= peer.slots:
                raise FetchError(f"{peer.agent}'s slot table names a slot outside its pool")
            remote = np.array(slots, dtype=np.int32)
            if self.after_lookup is not None:
                self.after_lookup()
            self._xfer(peer, self._local, local, entry.dlist, remote, deadline, timeout_s)
            self._xfer(peer, self._scratch_headers, scratch, entry.headers, remote, deadline, timeout_s)
            if not slottable.valid(self._words[self.scratch_blocks * _SET_WORDS :], want, gens):
                return IndexedRead(0, "changed")
        return IndexedRead(n * self.block_bytes)

    def _read(
        self,
        peer: PoolInfo,
        local: npt.NDArray[np.int32],
        remote: npt.NDArray[np.int32],
        deadline: float,
        timeout_s: float,
    ) -> int:
        with self._reading(peer):
            entry = self._remote(peer)
            self._xfer(peer, self._local, local, entry.dlist, remote, deadline, timeout_s)
        return len(local) * self.block_bytes

    @contextlib.contextmanager
    def _reading(self, peer: PoolInfo) -> Iterator[None]:
        """A failed READ from ``peer`` forgets it (its descriptors are rebuilt next time) and is a
        :class:`FetchError`, whatever NIXL raised."""
        try:
            yield
        except FetchError:
            self._forget(peer)
            raise
        except self._errors as e:  # NIXL's binding errors (no common base but Exception)
            self._forget(peer)
            raise FetchError(f"NIXL read from {peer.agent} failed: {type(e).__name__}: {e}") from None

    def _xfer(
        self,
        peer: PoolInfo,
        local_list: int,
        local: npt.NDArray[np.int32],
        remote_list: int,
        remote: npt.NDArray[np.int32],
        deadline: float,
        timeout_s: float,
    ) -> None:
        """One READ of prepared descriptors ``remote`` into ``local``, polled until done."""
        bind, agent = self._bind, self._agent
        handle = agent.makeXferReq(
            bind.NIXL_READ, local_list, local, remote_list, remote, "", [self._backend]
        )
        try:
            status = agent.postXferReq(handle)
            spin_until = time.monotonic() + _SPIN_S
            while status == bind.NIXL_IN_PROG:
                now = time.monotonic()
                if now > deadline:
                    raise FetchError(f"NIXL read from {peer.agent} timed out after {timeout_s:.3g} s")
                # poll, yielding the CPU (sched_yield) for the first _SPIN_S, then sleeping 0.5 ms
                time.sleep(0 if now < spin_until else 0.0005)
                status = agent.getXferStatus(handle)
            if status != bind.NIXL_SUCCESS:
                raise FetchError(f"NIXL read from {peer.agent} failed: {status}")
        finally:
            try:
                agent.releaseXferReq(handle)
            except self._errors as e:  # a handle of a dead peer may refuse release
                log.debug("releaseXferReq: %s", e)
