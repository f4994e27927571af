"""The simulator's router shell: builds policy views from virtual node state and applies decisions.

The live router builds the same :class:`~agentpool.router.policy.RequestView` and
:class:`~agentpool.router.policy.NodeState` values from HTTP requests, the directory and engine
reports; here they come from the simulated nodes. The policy itself is the registry's plugin.
Node reports are always fresh (engines report at every iteration launch, App. E.3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentpool.kv import Directory
from agentpool.models import FetchModel, NodeModel
from agentpool.node import Node, NodeStatus, Request, Role
from agentpool.router.policy import (
    EMPTY_QUEUE,
    CachedPrefix,
    NodeState,
    PolicyContext,
    QueuedPrefill,
    RequestView,
    bind_decode,
)
from agentpool.sim.systems import FetchMode


@dataclass(slots=True)
class Placement:
    """Where a request goes and with what KV: the policy's node plus the data plane's reality."""

    node: int
    local_blocks: int
    gpu_blocks: int
    fetch_blocks: int
    ideal_blocks: int


class NodeStates:
    """The policy's views of the serving nodes of one kind, kept up to date instead of rebuilt.

    A serving node's state is a pure function of its role, status, model, queued sums, running
    count, KV counts, waiting decode KV and remaining batch time (its name never changes). The
    driver calls :meth:`touch` with a node's index after anything that may change one of those
    inputs except the clock (a node method, its queued sums or waiting decode KV, its model);
    :meth:`views` then rebuilds only the touched nodes' states. A node running a prefill batch has
    its remaining time set at every call (it moves with the clock), in place. The list returned,
    and the states in it, are the ones the next call updates: a caller uses them before it touches
    a node or calls again (as a policy does).
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        models: Sequence[NodeModel],
        queued: Sequence[QueuedPrefill] | None,
        *,
        prefill: bool,
        waiting_kv: Sequence[int] | None = None,
    ) -> None:
        """``queued`` is ``None`` for decode nodes: they are viewed with an empty prefill queue.
        ``waiting_kv``: per node, KV tokens of its prefilled requests waiting for local decode room
        (colocated nodes; ``NodeState.decode_waiting_tokens``). The sequences are read when a
        touched node is rebuilt: the driver updates them in place and touches."""
        self._nodes = nodes
        self._models = models
        self._queued = queued
        self._waiting_kv = waiting_kv
        self._prefill = prefill
        self._states: list[NodeState | None] = [None] * len(nodes)  # None: not serving this kind
        self._dirty: set[int] = set(range(len(nodes)))
        self._out: list[NodeState] = []
        self._pos: dict[int, int] = {}  # node index -> its place in _out
        self._busy: dict[int, NodeState] = {}  # viewed nodes running a prefill batch

    def touch(self, index: int) -> None:
        """Node ``index``'s view may have changed (anything but the clock's effect on a batch)."""
        self._dirty.add(index)

    def views(self, now: float) -> list[NodeState]:
        """States of the serving prefill (or colocated) nodes, or of the serving decode nodes, in
        node order."""
        if self._dirty:
            self._refresh(now)
        nodes = self._nodes
        for i, st in self._busy.items():
            end = nodes[i].iter_end - now  # Node.remaining_batch_s, while the batch runs
            st.remaining_batch_s = end if end > 0.0 else 0.0
        return self._out

    def _refresh(self, now: float) -> None:
        nodes, models, queued, states = self._nodes, self._models, self._queued, self._states
        waiting_kv = self._waiting_kv
        prefill = self._prefill
        serving, decode = NodeStatus.SERVING, Role.DECODE
        regroup = False
        for i in self._dirty:
            n = nodes[i]
            was = states[i]
            if n.status is not serving or (n.role is not decode) is not prefill:
                if was is not None:
                    states[i] = None
                    self._busy.pop(i, None)
                    regroup = True
                continue
            queue = EMPTY_QUEUE if queued is None else queued[i]
            running = len(n.running) + n.bound_waiting  # bound here, prefill still running: counted
            waiting = 0 if waiting_kv is None else waiting_kv[i]
            st = states[i] = _node_state(n, models[i], queue, n.remaining_batch_s(now), running, waiting)
            if n.batch:
                self._busy[i] = st
            else:
                self._busy.pop(i, None)
            if was is None:
                regroup = True
            elif not regroup:
                self._out[self._pos[i]] = st
        self._dirty.clear()
        if regroup:
            self._out = [st for st in states if st is not None]
            self._pos = {i: k for k, i in enumerate(i for i, st in enumerate(states) if st is not None)}


def _node_state(
    node: Node, model: NodeModel, queue: QueuedPrefill, remaining_s: float, running: int, waiting: int = 0
) -> NodeState:
    # every viewed node is serving: accepting, not draining; reports are always fresh (age 0)
    return NodeState(
        node.name,
        node.role,
        model,
        remaining_s,
        queue,
        EMPTY_QUEUE,
        running,
        node.kv_room_tokens,
        node.kv_used_tokens,
        True,
        False,
        0.0,
        waiting,
    )


def request_view(
    req: Request,
    turn: int,
    new_turn_tokens: int,
    local: dict[str, CachedPrefix],
    cluster_tokens: int,
    send_branch: bool,
) -> RequestView:
    return RequestView(
        request_id=str(req.rid),
        prompt_tokens=req.input_tokens,
        turn=turn,
        new_turn_tokens=min(new_turn_tokens, req.input_tokens),
        branch_id=req.branch if send_branch else None,
        local_prefix=local,
        cluster_prefix=cluster_tokens,
        expected_output_tokens=req.output_tokens,
    )


@dataclass(slots=True)
class Prefixes:
    """The request's cached prefix per node, in blocks and as the policy's view, and the cluster's best."""

    blocks: dict[int, tuple[int, int]]  # per prefill-capable node index (gpu_blocks, local_blocks)
    views: dict[str, CachedPrefix]  # per prefill-capable node name, in tokens
    best_blocks: int
    best_node: int = -1  # a node holding the cluster's best prefix (the source of a fetch)


def prefixes(
    directory: Directory,
    req: Request,
    nodes: Sequence[Node],
    index_of: Mapping[str, int],
    cap_blocks: int,
    block: int,
    branch: str | None,
    now: float,
) -> Prefixes:
    """Per prefill (or colocated) node the request's ``(gpu_blocks, local_blocks)`` prefix, and the
    cluster's best over every node (decode nodes hold prefixes a prefill node may fetch).

    The directory resolves the host tier (every stored block is written through to host memory);
    the GPU part comes from the node's own cache. Both are capped at ``cap_blocks`` (a prefill
    computes at least one token). Most nodes share a few prefix lengths (a common system prompt):
    the prompt's leading blocks and the views are made once per distinct length.
    """
    res = directory.resolve(req.blocks, branch, now)
    blocks = req.blocks
    heads: dict[int, list[int]] = {}
    made: dict[tuple[int, int], CachedPrefix] = {}
    per_node: dict[int, tuple[int, int]] = {}
    views: dict[str, CachedPrefix] = {}
    best = 0
    best_node = -1
    decode = Role.DECODE
    for name, match in res.prefixes.items():
        i = index_of.get(name)
        if i is None:
            continue
        local = match.local_blocks
        if local > cap_blocks:
            local = cap_blocks
        if local > best:
            best = local
            best_node = i
        if nodes[i].role is decode:
            continue  # a peer to fetch from, never a prefill candidate: only the cluster's best needs it
        gpu = 0
        if local:
            head = heads.get(local)
            if head is None:
                head = heads[local] = blocks[:local]
            gpu = nodes[i].gpu.prefix(head)
            if gpu > local:
                gpu = local
        pair = per_node[i] = (gpu, local)
        view = made.get(pair)
        if view is None:
            view = made[pair] = CachedPrefix(gpu=gpu * block, total=local * block)
        views[name] = view
    return Prefixes(per_node, views, best, best_node)


def fetchable_blocks(mode: FetchMode, fetch: FetchModel, missing_blocks: int, block: int) -> int:
    """Blocks a node gets from peers instead of recomputing, under the system's data plane."""
    if missing_blocks <= 0 or mode is FetchMode.NONE:
        return 0
    if mode is FetchMode.FREE:
        return missing_blocks
    return missing_blocks if fetch.fetches(missing_blocks * block) else 0


def choose_decode(
    req: Request, ctx: PolicyContext, now: float, states: NodeStates, index_of: Mapping[str, int]
) -> int | None:
    """Decode node with KV room and the fewest running requests (the router's ``bind_decode``).

    ``states`` holds the decode views (``prefill=False``); ``index_of`` maps names to indices."""
    view = RequestView(
        request_id=str(req.rid), prompt_tokens=req.input_tokens, expected_output_tokens=req.output_tokens
    )
    binding = bind_decode(view, states.views(now), ctx)
    if binding is None:
        return None
    return index_of[binding.node_id]
