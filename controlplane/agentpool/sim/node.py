"""A pure model of one engine node in virtual time: chunked prefill, decode batches, GPU cache.

No clock and no event loop: the caller passes ``now`` and asks :meth:`SimNode.wake_time` when the
node next needs attention; :meth:`SimNode.advance` then returns what finished. The simulator drives
it; the engine's ``sim`` backend can drive the same object on a wall clock.

Prefill (Eq. 1). Each iteration takes queued requests first come first served, skipping those
whose KV fetch is still running, up to ``chunk_tokens`` uncached tokens (chunked prefill: a long
prompt spans iterations; each chunk attends to the cached prefix plus the earlier chunks, so the
chunks' query-key pairs add up to the request's ``A``). A request's restored tokens are charged to
its first chunk. With synchronous fetching (upstream HiCache-like), the fetch time of the requests
that start in an iteration is added to that iteration: the whole batch waits for the load.

Decode (Eq. 2). ``B`` running requests advance one iteration per ``T_D(B)``; a request needs
``ceil((output - 1) / t_acc)`` iterations (the prefill produced its first token). Events happen only
when the batch changes: between two changes the iteration time is constant, so the next completion
is computed, not stepped. Progress is continuous: a request joining mid-iteration starts counting
at once (the error is below one iteration per request).

Colocated nodes (role ``both``) run mixed iterations: while prefill work is present each iteration
lasts ``T_P(chunks) + T_D(B)`` and advances every running request by one iteration.

GPU cache (L1): an LRU of block keys with a capacity in blocks. A request touches its whole path
from the deepest block to the root, so a prefix is always more recent than its extensions and LRU
evicts leaves first: the blocks a node holds stay prefix-closed and a binary search finds the
longest prefix. The host tier (L2) is tracked by the KV directory the simulator drives.

Iteration records (optional): a node given ``on_iteration`` reports each prefill or mixed
iteration when it starts and each stretch of pure decode iterations with a fixed batch when the
stretch ends (:class:`SimIteration`), e.g. for fitting Eq. 1 and Eq. 2 to what the batching really
produces. Reporting only reads state: results are the same with or without it.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice, repeat

from agentpool.models import DecodeModel, PrefillBatchItem, PrefillModel

_EPS = 1e-9


class Role(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"


class NodeStatus(enum.StrEnum):
    SERVING = "serving"
    DRAINING = "draining"  # finishing running work before a switch
    DOWN = "down"  # relaunching or switching: serves nothing


@dataclass(slots=True, eq=False)
class SimRequest:
    """One request as it moves through router, prefill node and decode node (times in seconds)."""

    rid: int
    input_tokens: int
    output_tokens: int
    blocks: list[int]
    produced: list[int]
    branch: str
    issued_at: float
    # routing result (set by the router)
    cached_tokens: int = 0
    restore_tokens: int = 0
    fetch_tokens: int = 0
    fetch_ready_at: float = 0.0
    sync_fetch_s: float = 0.0
    ideal_cached_tokens: int = 0
    prefill_node: int = -1
    decode_node: int = -1
    # progress and timeline
    done_uc: int = 0
    enqueued_at: float = 0.0
    prefill_start: float = -1.0
    first_token_at: float = -1.0
    decode_start: float = -1.0
    done_at: float = -1.0
    finish_iter: float = 0.0
    reroutes: int = 0

    @property
    def uncached_tokens(self) -> int:
        return self.input_tokens - self.cached_tokens

    def decode_iterations(self, t_acc: float) -> int:
        return math.ceil(max(0, self.output_tokens - 1) / t_acc - 1e-9)

    @property
    def kv_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(slots=True)
class Advance:
    """What finished on a node at one ``advance`` call."""

    prefilled: list[SimRequest] = field(default_factory=list)
    decoded: list[SimRequest] = field(default_factory=list)
    iteration: tuple[float, list[PrefillBatchItem]] | None = None  # (duration, batch) of a prefill done


@dataclass(frozen=True, slots=True)
class SimIteration:
    """What a node ran from ``start`` to ``end``: one prefill/mixed iteration or a decode stretch.

    Prefill or mixed (``batch`` not empty): one iteration, ``iterations == 1``; ``prefill_s`` is
    Eq. 1 of ``batch``, ``sync_fetch_s`` the synchronous fetch the batch waited for, ``running`` the
    decode batch that advanced by one iteration alongside (0 on a prefill node) and ``decode_s`` its
    Eq. 2 time; ``end - start = prefill_s + sync_fetch_s + decode_s``.

    Decode stretch (``batch`` empty): ``running`` requests decoding between two changes of the
    batch (or two wakes of the node): ``decode_s = T_D(running)`` per iteration and ``iterations =
    (end - start) / decode_s``, fractional (progress is continuous, see the module docstring).

    ``context_tokens``: KV tokens the running requests hold at ``start`` (prompt, first token and
    decoded tokens at ``t_acc`` per iteration), which Eq. 2 does not use.
    """

    node: str
    start: float
    end: float
    batch: tuple[PrefillBatchItem, ...]
    prefill_s: float
    sync_fetch_s: float
    running: int
    decode_s: float
    iterations: float
    context_tokens: float


IterationHook = Callable[[SimIteration], None]


class GpuCache:
    """LRU set of block keys with a capacity in blocks (prefix-closed; see the module docstring)."""

    __slots__ = ("_lru", "capacity")

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity must be non-negative")
        self.capacity = capacity_blocks
        self._lru: dict[int, None] = {}

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block: int) -> bool:
        return block in self._lru

    def prefix(self, blocks: Sequence[int]) -> int:
        """Longest prefix of ``blocks`` held (binary search; the set is prefix-closed)."""
        lru = self._lru
        n = len(blocks)
        if n == 0 or blocks[0] not in lru:
            return 0
        if blocks[n - 1] in lru:
            return n
        lo, hi = 1, n - 1  # blocks[lo - 1] is held, blocks[hi] is not
        while lo < hi:
            mid = (lo + hi) // 2
            if blocks[mid] in lru:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def touch(self, blocks: Sequence[int]) -> list[int]:
        """Insert or refresh ``blocks`` (deepest first); returns the keys evicted to make room.

        Same order as moving each block to the most recent end from the deepest to the root, done
        with dict operations that loop in C (a path is ~200 blocks, touched at every store)."""
        lru = self._lru
        keys = list(dict.fromkeys(blocks))  # a repeated key counts where it comes first
        keys.reverse()
        deque(map(lru.pop, keys, repeat(None)), maxlen=0)
        lru.update(zip(keys, repeat(None)))
        over = len(lru) - self.capacity
        if over <= 0:
            return []
        evicted = list(islice(lru, over))
        deque(map(lru.__delitem__, evicted), maxlen=0)
        return evicted

    def discard(self, blocks: Sequence[int]) -> None:
        deque(map(self._lru.pop, blocks, repeat(None)), maxlen=0)

    def clear(self) -> None:
        self._lru.clear()


class SimNode:
    """One node: role, status, prefill queue and iterations, decode batch, GPU cache."""

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
    ) -> None:
        if chunk_tokens <= 0 or t_acc <= 0 or kv_capacity_tokens <= 0:
            raise ValueError("chunk_tokens, t_acc and kv_capacity_tokens must be positive")
        self.index = index
        self.name = name
        self.prefill_model = prefill
        self.decode_model = decode
        self.role = role
        self.status = NodeStatus.SERVING
        self.chunk_tokens = chunk_tokens
        self.t_acc = t_acc
        self.gpu = GpuCache(gpu_cache_blocks)
        self.kv_capacity_tokens = kv_capacity_tokens
        # prefill
        self.queue: deque[SimRequest] = deque()
        self.batch: list[tuple[SimRequest, int]] = []
        self.batch_items: list[PrefillBatchItem] = []
        self.iter_start = 0.0
        self.iter_end = math.inf
        self.busy_s = 0.0
        self.started: list[SimRequest] = []  # first chunks started since the caller last drained it
        # decode
        self.running: dict[int, SimRequest] = {}
        self._finish: list[tuple[float, int]] = []
        self.iter_pos = 0.0
        self.pos_time = 0.0
        self.decode_iter_s = 0.0
        self.kv_used_tokens = 0
        # requests bound to this (decode) node while their prefill still runs elsewhere: they hold a
        # KV reservation and count as running for decode binding, as the router counts its bindings
        self.bound_waiting = 0
        # prefilled requests whose KV is on its way to this (decode) node: a drain waits for them
        self.joining = 0
        self.on_iteration = on_iteration

    # -- state --------------------------------------------------------------------------------
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

    # -- prefill ------------------------------------------------------------------------------
    def enqueue(self, req: SimRequest, now: float) -> None:
        req.enqueued_at = now
        self.queue.append(req)

    def take_queue(self) -> list[SimRequest]:
        """Remove and return the requests not started yet (a switch re-routes them)."""
        out = [r for r in self.queue if r.done_uc == 0]
        self.queue = deque(r for r in self.queue if r.done_uc > 0)
        return out

    def _start_iteration(self, now: float) -> None:
        budget = self.chunk_tokens
        batch: list[tuple[SimRequest, int]] = []
        items: list[PrefillBatchItem] = []
        sync = 0.0
        keep: deque[SimRequest] = deque()
        while self.queue:
            r = self.queue.popleft()
            if budget <= 0 or r.fetch_ready_at > now + _EPS:
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
        prefill_s = self.prefill_model.iteration_time(items)
        decode_s = self.decode_model.iteration_time(len(self.running)) if self.running else 0.0
        duration = prefill_s + sync
        if self.running:
            duration += decode_s
        if self.on_iteration is not None:
            self.on_iteration(
                SimIteration(
                    self.name,
                    now,
                    now + duration,
                    tuple(items),
                    prefill_s,
                    sync,
                    len(self.running),
                    decode_s,
                    1.0,
                    self._context_tokens(),
                )
            )
        self.batch = batch
        self.batch_items = items
        self.iter_start = now
        self.iter_end = now + duration

    def _finish_iteration(self, out: Advance) -> None:
        unfinished: list[SimRequest] = []
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
        """KV tokens of the running requests at the current position (for :class:`SimIteration`)."""
        total = 0.0
        for r in self.running.values():
            done = self.iter_pos - (r.finish_iter - r.decode_iterations(self.t_acc))
            total += r.input_tokens + 1 + self.t_acc * max(0.0, done)
        return total

    def _progress_to(self, now: float) -> None:
        if not self.batch and self.running and self.decode_iter_s > 0 and now > self.pos_time:
            steps = (now - self.pos_time) / self.decode_iter_s
            if self.on_iteration is not None:
                self.on_iteration(
                    SimIteration(
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
        self.decode_iter_s = self.decode_model.iteration_time(b) if b else 0.0

    def _pop_finished(self, now: float, out: Advance) -> None:
        changed = False
        while self._finish and self._finish[0][0] <= self.iter_pos + _EPS:
            _, rid = heapq.heappop(self._finish)
            r = self.running.pop(rid)
            r.done_at = now
            self.kv_used_tokens -= r.kv_tokens
            out.decoded.append(r)
            changed = True
        if changed:
            self._retime()

    def join_decode(self, req: SimRequest, now: float) -> None:
        """Start decoding ``req`` at ``now`` (its KV has arrived)."""
        self._progress_to(now)
        req.decode_start = now
        req.finish_iter = self.iter_pos + req.decode_iterations(self.t_acc)
        self.running[req.rid] = req
        heapq.heappush(self._finish, (req.finish_iter, req.rid))
        self.kv_used_tokens += req.kv_tokens
        self._retime()

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
        self.kv_used_tokens = 0
