"""The node model: chunked prefill, continuous decode batching, mixed iterations, GPU cache.

Pure: no clock, no I/O, no event loop. Every method that depends on time takes ``now`` (seconds on
the driver's clock, virtual or scaled wall time); see the package docstring for the model.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from agentpool.models import DecodeModel, PrefillBatchItem, PrefillModel
from agentpool.node.cache import GpuCache
from agentpool.node.timing import EquationTimes, IterationTimes
from agentpool.node.types import (
    Advance,
    Iteration,
    IterationHook,
    NodeLoad,
    NodeStatus,
    QueuedItem,
    Request,
    Role,
)

_EPS = 1e-9


class Node:
    """One engine node: role, status, prefill queue and iterations, decode batch, GPU cache.

    See the package docstring for the model and README.md for how a driver uses it."""

    def __init__(
        self,
        index: int,
        name: str,
        prefill: PrefillModel,
        decode: DecodeModel,
        *,
        role: Role,
        chunk_tokens: int,
        t_acc: float,
        gpu_cache_blocks: int,
        kv_capacity_tokens: int,
        on_iteration: IterationHook | None = None,
        timing: IterationTimes | None = None,
        shared_kv_block_tokens: int | None = None,
    ) -> None:
        if chunk_tokens <= 0 or t_acc <= 0 or kv_capacity_tokens <= 0:
            raise ValueError("chunk_tokens, t_acc and kv_capacity_tokens must be positive")
        self.index = index
        self.name = name
        self.prefill_model = prefill
        self.decode_model = decode
        # what iterations really take: the ground truth (Eq. 1/2 of the models above by default)
        self.timing: IterationTimes = EquationTimes(prefill, decode) if timing is None else timing
        self.role = role
        self.status = NodeStatus.SERVING
        self.chunk_tokens = chunk_tokens
        self.t_acc = t_acc
        self.gpu = GpuCache(gpu_cache_blocks)
        # one GPU memory (shared_kv_block_tokens set): the prefix cache gets what running and
        # reserved requests leave of it, so growing decode contexts evict cached prefixes
        self.gpu_blocks = gpu_cache_blocks
        self._kv_block_tokens = shared_kv_block_tokens
        if shared_kv_block_tokens is not None and shared_kv_block_tokens <= 0:
            raise ValueError("shared_kv_block_tokens must be positive")
        self._kv_used = 0
        self.kv_capacity_tokens = kv_capacity_tokens
        # prefill
        self.queue: deque[Request] = deque()
        self.batch: list[tuple[Request, int]] = []
        self.batch_items: list[PrefillBatchItem] = []
        self.iter_start = 0.0
        self.iter_end = math.inf
        self.busy_s = 0.0
        self.started: list[Request] = []  # first chunks started since the caller last drained it
        # decode
        self.running: dict[int, Request] = {}
        self._finish: list[tuple[float, int]] = []
        self.iter_pos = 0.0
        self.pos_time = 0.0
        self.decode_iter_s = 0.0
        # running KV tokens at position p: _ctx_base + t_acc * len(running) * p (see _context_tokens)
        self._ctx_base = 0.0
        self._ctx_part: dict[int, float] = {}
        # requests bound to this (decode) node while their prefill still runs elsewhere: they hold a
        # KV reservation and count as running for decode binding, as the router counts its bindings
        self.bound_waiting = 0
        # prefilled requests whose KV is on its way to this (decode) node: a drain waits for them
        self.joining = 0
        self.on_iteration = on_iteration

    # -- state --------------------------------------------------------------------------------
    @property
    def kv_used_tokens(self) -> int:
        """Decode KV held by running requests or reserved for bound ones."""
        return self._kv_used

    @kv_used_tokens.setter
    def kv_used_tokens(self, tokens: int) -> None:
        self._kv_used = tokens
        bt = self._kv_block_tokens
        if bt is not None:
            self.gpu.resize(self.gpu_blocks - (max(0, tokens) + bt - 1) // bt)

    @property
    def prefill_active(self) -> bool:
        return bool(self.batch)

    @property
    def idle(self) -> bool:
        return not self.batch and not self.queue and not self.running

    @property
    def kv_room_tokens(self) -> int:
        return max(0, self.kv_capacity_tokens - self.kv_used_tokens)

    def remaining_batch_s(self, now: float) -> float:
        return max(0.0, self.iter_end - now) if self.batch else 0.0

    def wake_time(self) -> float:
        """When the node next needs :meth:`advance` (``inf``: nothing scheduled)."""
        if self.batch:
            return self.iter_end
        t = math.inf
        if self.running and self._finish:
            t = self.pos_time + max(0.0, self._finish[0][0] - self.iter_pos) * self.decode_iter_s
        if self.queue:
            # queued work not started: only fetches that are still running can hold it back
            t = min(t, min(r.fetch_ready_at for r in self.queue))
        return t

    def next_event_time(self) -> float:
        """Same as :meth:`wake_time`: the driver calls :meth:`advance` then (or on any new input)."""
        return self.wake_time()

    @property
    def drained(self) -> bool:
        """Draining and nothing left: no queued or running work, no decode bound or on its way."""
        return (
            self.status is NodeStatus.DRAINING and self.idle and not self.bound_waiting and not self.joining
        )

    def load(self, now: float) -> NodeLoad:
        """A snapshot of the node's state for a load report (reads only)."""
        return NodeLoad(
            role=self.role,
            status=self.status,
            queue=tuple(
                QueuedItem(r.rid, r.uncached_tokens - r.done_uc, r.cached_tokens + r.done_uc, r.done_uc > 0)
                for r in self.queue
            ),
            running=len(self.running),
            remaining_batch_s=self.remaining_batch_s(now),
            kv_used_tokens=self.kv_used_tokens,
            kv_capacity_tokens=self.kv_capacity_tokens,
            kv_room_tokens=self.kv_room_tokens,
            bound_waiting=self.bound_waiting,
            joining=self.joining,
            gpu_cached_blocks=len(self.gpu),
        )

    # -- prefill ------------------------------------------------------------------------------
    def submit(self, req: Request, now: float) -> None:
        """Queue ``req`` for prefill at ``now`` and start an iteration if the node is idle.

        The driver sets the routing result first: ``cached_tokens`` (prefix present or fetched),
        ``restore_tokens`` (of those, the ones loaded from host memory, charged to the first chunk),
        and either ``fetch_ready_at`` (async fetch: the request waits in the queue until then) or
        ``sync_fetch_s`` (sync fetch: its first iteration takes that much longer)."""
        self.enqueue(req, now)
        self.kick(now)

    def enqueue(self, req: Request, now: float) -> None:
        req.enqueued_at = now
        self.queue.append(req)

    def take_queue(self) -> list[Request]:
        """Remove and return the requests not started yet (a switch re-routes them)."""
        out = [r for r in self.queue if r.done_uc == 0]
        self.queue = deque(r for r in self.queue if r.done_uc > 0)
        return out

    def _start_iteration(self, now: float) -> None:
        budget = self.chunk_tokens
        batch: list[tuple[Request, int]] = []
        items: list[PrefillBatchItem] = []
        sync = 0.0
        keep: deque[Request] = deque()
        queue = self.queue
        ready_by = now + _EPS
        while queue:
            if budget <= 0:  # the chunk is full: the rest stays queued, in order (no scan of it)
                keep.extend(queue)
                queue.clear()
                break
            r = queue.popleft()
            if r.fetch_ready_at > ready_by:
                keep.append(r)
                continue
            todo = r.uncached_tokens - r.done_uc
            n = min(todo, budget)
            budget -= n
            first = r.done_uc == 0
            if first:
                r.prefill_start = now
                sync += r.sync_fetch_s
                self.started.append(r)
            items.append(
                PrefillBatchItem(
                    t_uc=float(n),
                    t_c=float(r.cached_tokens + r.done_uc),
                    t_rst=float(r.restore_tokens if first else 0),
                )
            )
            batch.append((r, n))
        self.queue = keep
        if not batch:
            return
        context = self._context_tokens() if self.running else 0.0
        prefill_s = self.timing.prefill_s(items)
        decode_s = self.timing.decode_s(len(self.running), context) if self.running else 0.0
        duration = prefill_s + sync
        if self.running:
            duration += decode_s
        if self.on_iteration is not None:
            self.on_iteration(
                Iteration(
                    self.name,
                    now,
                    now + duration,
                    tuple(items),
                    prefill_s,
                    sync,
                    len(self.running),
                    decode_s,
                    1.0,
                    context,
                )
            )
        self.batch = batch
        self.batch_items = items
        self.iter_start = now
        self.iter_end = now + duration

    def _finish_iteration(self, out: Advance) -> None:
        unfinished: list[Request] = []
        for r, n in self.batch:
            r.done_uc += n
            if r.done_uc >= r.uncached_tokens:
                r.first_token_at = self.iter_end
                out.prefilled.append(r)
            else:
                unfinished.append(r)
        duration = self.iter_end - self.iter_start
        self.busy_s += duration
        out.iteration = (duration, self.batch_items)
        for r in reversed(unfinished):
            self.queue.appendleft(r)
        if self.running:  # a mixed iteration advanced every running request by one iteration
            self.iter_pos += 1.0
            self.pos_time = self.iter_end
            self._pop_finished(self.iter_end, out)
        self.batch = []
        self.batch_items = []
        self.iter_end = math.inf

    # -- decode -------------------------------------------------------------------------------
    def _context_tokens(self) -> float:
        """KV tokens of the running requests at the current position: prompt, first token and
        ``t_acc`` tokens per decode iteration each (kept as a sum, not recounted per request)."""
        if not self.running:
            return 0.0
        return self._ctx_base + self.t_acc * len(self.running) * self.iter_pos

    def decode_position(self, now: float) -> float:
        """The decode batch's position at ``now`` (decode iterations done since the node started):
        as of its last update, plus the pure decode iterations since while no prefill iteration runs
        (a mixed iteration counts one when it ends). A running request has produced
        ``1 + (position - (finish_iter - decode_iterations)) * t_acc`` tokens."""
        if self.batch or not self.running or self.decode_iter_s <= 0:
            return self.iter_pos
        return self.iter_pos + max(0.0, now - self.pos_time) / self.decode_iter_s

    def _progress_to(self, now: float) -> None:
        if not self.batch and self.running and self.decode_iter_s > 0 and now > self.pos_time:
            steps = (now - self.pos_time) / self.decode_iter_s
            if self.on_iteration is not None:
                self.on_iteration(
                    Iteration(
                        self.name,
                        self.pos_time,
                        now,
                        (),
                        0.0,
                        0.0,
                        len(self.running),
                        self.decode_iter_s,
                        steps,
                        self._context_tokens(),
                    )
                )
            self.iter_pos += steps
        if not self.batch:
            self.pos_time = now

    def _retime(self) -> None:
        b = len(self.running)
        self.decode_iter_s = self.timing.decode_s(b, self._context_tokens()) if b else 0.0

    def _pop_finished(self, now: float, out: Advance) -> None:
        changed = False
        while self._finish and self._finish[0][0] <= self.iter_pos + _EPS:
            _, rid = heapq.heappop(self._finish)
            r = self.running.pop(rid)
            self._ctx_base -= self._ctx_part.pop(rid)
            r.done_at = now
            self.kv_used_tokens -= r.kv_tokens
            out.decoded.append(r)
            changed = True
        if changed:
            self._retime()

    def join_decode(self, req: Request, now: float) -> None:
        """Start decoding ``req`` at ``now`` (its KV has arrived)."""
        self._progress_to(now)
        req.decode_start = now
        req.finish_iter = self.iter_pos + req.decode_iterations(self.t_acc)
        self.running[req.rid] = req
        part = req.input_tokens + 1 - self.t_acc * self.iter_pos
        self._ctx_part[req.rid] = part
        self._ctx_base += part
        heapq.heappush(self._finish, (req.finish_iter, req.rid))
        self.kv_used_tokens += req.kv_tokens
        self._retime()

    # -- P->D hand-over (decode side) ---------------------------------------------------------
    def reserve_decode(self, req: Request) -> None:
        """Bind ``req`` to this decode node: hold its KV room from now to its end. A request whose
        prefill has not finished yet (``first_token_at < 0``) counts as bound and waiting."""
        self.kv_used_tokens += req.kv_tokens
        if req.first_token_at < 0:
            self.bound_waiting += 1

    def handover_started(self, req: Request, *, was_waiting: bool) -> None:
        """The prefilled KV of ``req`` leaves for this node (``was_waiting``: it was bound before its
        prefill finished). Until :meth:`handover_arrived` a drain of this node waits for it."""
        if was_waiting:
            self.bound_waiting -= 1
        self.joining += 1

    def handover_arrived(self, req: Request, now: float) -> None:
        """The KV of ``req`` is here: its reservation becomes a running request's KV."""
        self.joining -= 1
        self.kv_used_tokens -= req.kv_tokens
        self.join_decode(req, now)

    # -- role switch ---------------------------------------------------------------------------
    def begin_drain(self) -> list[Request]:
        """Stop admitting work: the node finishes what runs and hands back the requests that have
        not started (the driver re-routes them). Wait for :attr:`drained`, then :meth:`go_down`."""
        self.status = NodeStatus.DRAINING
        return self.take_queue()

    def go_down(self, *, keep_kv: bool) -> None:
        """Out of service for the switch; ``keep_kv=False`` (a relaunch) drops the GPU cache and
        the decode state (the driver drops the host tier and tells the directory)."""
        self.status = NodeStatus.DOWN
        if not keep_kv:
            self.reset_after_relaunch()

    def finish_switch(self, role: Role) -> None:
        """Serve again, in ``role``."""
        self.role = role
        self.status = NodeStatus.SERVING

    # -- the step -----------------------------------------------------------------------------
    def advance(self, now: float) -> Advance:
        """Finish what is due at ``now`` and start the next prefill iteration if work is ready."""
        out = Advance()
        if self.batch and self.iter_end <= now + _EPS:
            self._finish_iteration(out)
        if not self.batch:
            self._progress_to(now)
            self._pop_finished(now, out)
        if not self.batch and self.queue and self.status is not NodeStatus.DOWN:
            self._start_iteration(now)
        return out

    def kick(self, now: float) -> None:
        """Start an iteration now if the node is idle and has ready work (after an enqueue)."""
        if not self.batch and self.queue and self.status is not NodeStatus.DOWN:
            self._progress_to(now)
            self._start_iteration(now)

    def reset_after_relaunch(self) -> None:
        self.gpu.clear()
        self.iter_pos = 0.0
        self._finish.clear()
        self._ctx_base = 0.0
        self._ctx_part.clear()
        self.kv_used_tokens = 0
