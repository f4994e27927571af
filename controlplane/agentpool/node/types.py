"""The node core's vocabulary: roles, status, a request's record, what an advance returns, iterations."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from agentpool.kv import Role as Role  # the one role type, re-exported with the node's vocabulary
from agentpool.models import PrefillBatchItem


class NodeStatus(enum.StrEnum):
    SERVING = "serving"
    DRAINING = "draining"  # finishing running work before a switch
    DOWN = "down"  # relaunching or switching: serves nothing


@dataclass(slots=True, eq=False)
class Request:
    """One request as it moves through router, prefill node and decode node (times in seconds).

    The driver sets the routing result (``cached_tokens``, ``restore_tokens``, the fetch timing)
    before :meth:`agentpool.node.Node.submit`; the node writes the timeline fields.
    """

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
    fetch_ready_at: float = 0.0  # async fetch: the prefill may not start before this time
    sync_fetch_s: float = 0.0  # sync fetch: added to the iteration the request starts in
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

    prefilled: list[Request] = field(default_factory=list)
    decoded: list[Request] = field(default_factory=list)
    iteration: tuple[float, list[PrefillBatchItem]] | None = None  # (duration, batch) of a prefill done


@dataclass(frozen=True, slots=True)
class Iteration:
    """What a node ran from ``start`` to ``end``: one prefill/mixed iteration or a decode stretch.

    Prefill or mixed (``batch`` not empty): one iteration, ``iterations == 1``; ``prefill_s`` is
    Eq. 1 of ``batch``, ``sync_fetch_s`` the synchronous fetch the batch waited for, ``running`` the
    decode batch that advanced by one iteration alongside (0 on a prefill node) and ``decode_s`` its
    Eq. 2 time; ``end - start = prefill_s + sync_fetch_s + decode_s``.

    Decode stretch (``batch`` empty): ``running`` requests decoding between two changes of the
    batch (or two wakes of the node): ``decode_s = T_D(running)`` per iteration and ``iterations =
    (end - start) / decode_s``, fractional (progress is continuous, see :mod:`agentpool.node`).

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


IterationHook = Callable[[Iteration], None]


@dataclass(frozen=True, slots=True)
class QueuedItem:
    """One queued prefill as a load report lists it (tokens still to compute and those cached)."""

    rid: int
    uncached_tokens: int
    cached_tokens: int
    started: bool  # a chunk of it already ran (chunked prefill): it is not handed back on a drain


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """A node's state at one instant, what a load report to the router carries."""

    role: Role
    status: NodeStatus
    queue: tuple[QueuedItem, ...]
    running: int  # requests decoding
    remaining_batch_s: float  # time left in the prefill or mixed iteration under way (0: none)
    kv_used_tokens: int  # decode KV held or reserved
    kv_capacity_tokens: int
    kv_room_tokens: int
    bound_waiting: int  # bound here while their prefill runs elsewhere
    joining: int  # hand-overs on their way here
    gpu_cached_blocks: int
