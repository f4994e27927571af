"""agentpool.node: the pure model of one engine node (batching, timing, caches), driven by a clock owner.

No clock, no I/O, no event loop: the driver passes ``now`` (seconds on its own clock) to every call
and asks :meth:`Node.wake_time` when the node next needs attention; :meth:`Node.advance` then returns
what finished. The simulator (:mod:`agentpool.sim`) drives it in virtual time; the engine's ``sim``
backend drives the same object in real time (wall seconds times a time-scale factor). README.md in
this package shows a driver loop.

Iteration times come from ``timing`` (:class:`agentpool.node.timing.IterationTimes`): Eq. 1 and
Eq. 2 of the node's models by default (:class:`agentpool.node.timing.EquationTimes`), or the
ground truth :class:`agentpool.node.roofline.Roofline` (architecture and GPU roofline, decode
growing with the running requests' context), optionally noisy
(:class:`agentpool.node.timing.NoisyTimes`). Below, "Eq. 1"/"Eq. 2" stand for whichever is used.

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
longest prefix. The host tier (L2): :class:`HostCache`, written through on every store and evicted
in Algorithm E.2's order from the directory's branch counts (the simulator keeps it in the
directory's index).

Iteration records (optional): a node given ``on_iteration`` reports each prefill or mixed
iteration when it starts and each stretch of pure decode iterations with a fixed batch when the
stretch ends (:class:`Iteration`), e.g. for fitting Eq. 1 and Eq. 2 to what the batching really
produces. Reporting only reads state: results are the same with or without it.

P->D hand-over (decode side): :meth:`Node.reserve_decode` when the router binds a request,
:meth:`Node.handover_started` when its KV leaves the prefill node, :meth:`Node.handover_arrived` when
it is here (the driver computes the transfer time). Role switch: :meth:`Node.begin_drain` hands
back the queued requests, :attr:`Node.drained` says when running work is done, then
:meth:`Node.go_down` and :meth:`Node.finish_switch`.
"""

from agentpool.node.cache import GpuCache, HostCache
from agentpool.node.core import Node
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

__all__ = [
    "Advance",
    "GpuCache",
    "HostCache",
    "Iteration",
    "IterationHook",
    "Node",
    "NodeLoad",
    "NodeStatus",
    "QueuedItem",
    "Request",
    "Role",
]
