"""The simulator's router shell: builds policy views from virtual node state and applies decisions.

The live router builds the same :class:`~agentpool.router.policy.RequestView` and
:class:`~agentpool.router.policy.NodeState` values from HTTP requests, the directory and engine
reports; here they come from the simulated nodes. The policy itself is the registry's plugin.
Node reports are always fresh (engines report at every iteration launch, App. E.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentpool.kv import Directory
from agentpool.models import FetchModel, NodeModel, attention_pairs
from agentpool.router.policy import (
    EMPTY_QUEUE,
    CachedPrefix,
    NodeState,
    PolicyContext,
    QueuedPrefill,
    RequestView,
    bind_decode,
)
from agentpool.router.policy import Role as PolicyRole
from agentpool.sim.node import NodeStatus, Role, SimNode, SimRequest
from agentpool.sim.systems import FetchMode

_ROLE = {Role.PREFILL: PolicyRole.PREFILL, Role.DECODE: PolicyRole.DECODE, Role.BOTH: PolicyRole.BOTH}


@dataclass(slots=True)
class QueueSums:
    """Running sums of a node's queued prefill work (Eq. 3 is linear in them)."""

    requests: int = 0
    t_uc: float = 0.0
    t_c: float = 0.0
    pairs: float = 0.0
    _view: QueuedPrefill | None = None  # the last view, until the sums change

    def add(self, r: SimRequest, sign: int) -> None:
        uc = float(r.uncached_tokens)
        c = float(r.cached_tokens)
        self.requests += sign
        self.t_uc += sign * uc
        self.t_c += sign * c
        self.pairs += sign * attention_pairs(uc, c)
        self._view = None

    def view(self) -> QueuedPrefill:
        """The sums as the policy's value; the same object while the sums do not change."""
        v = self._view
        if v is None:
            if self.requests <= 0:
                v = QueuedPrefill()
            else:
                uc, c, pairs = max(0.0, self.t_uc), max(0.0, self.t_c), max(0.0, self.pairs)
                v = QueuedPrefill(self.requests, uc, c, pairs)
            self._view = v
        return v


@dataclass(slots=True)
class Placement:
    """Where a request goes and with what KV: the policy's node plus the data plane's reality."""

    node: int
    local_blocks: int
    gpu_blocks: int
    fetch_blocks: int
    ideal_blocks: int


class NodeStates:
    """One :class:`NodeState` per node, rebuilt only when one of its inputs changed.

    A node's state is a pure function of its role, status, remaining batch time at ``now``, model,
    queued sums, running count and KV counts; the cache keeps the last state with those inputs and
    returns it while they are equal, so policies see the same values as with a fresh build.
    """

    def __init__(self) -> None:
        self._cache: dict[int, tuple[tuple[object, ...], NodeState]] = {}

    def get(self, node: SimNode, model: NodeModel, queued: QueuedPrefill, now: float) -> NodeState:
        key = (
            node.role,
            node.status,
            node.remaining_batch_s(now),
            model,
            queued,
            len(node.running),
            node.kv_used_tokens,
            node.kv_capacity_tokens,
            node.name,
        )
        hit = self._cache.get(node.index)
        if hit is not None and hit[0] == key:
            return hit[1]
        state = _node_state(node, model, queued, key[2])
        self._cache[node.index] = (key, state)
        return state


def node_state(node: SimNode, model: NodeModel, queued: QueueSums, now: float) -> NodeState:
    return _node_state(node, model, queued.view(), node.remaining_batch_s(now))


def _node_state(node: SimNode, model: NodeModel, queue: QueuedPrefill, remaining_s: float) -> NodeState:
    return NodeState(
        node_id=node.name,
        role=_ROLE[node.role],
        model=model,
        remaining_batch_s=remaining_s,
        queue=queue,
        running_decode=len(node.running),
        kv_room_tokens=node.kv_room_tokens,
        kv_used_tokens=node.kv_used_tokens,
        accepting=node.status is NodeStatus.SERVING,
        draining=node.status is NodeStatus.DRAINING,
        report_age_s=0.0,
    )


def request_view(
    req: SimRequest,
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


def prefixes(
    directory: Directory,
    req: SimRequest,
    nodes: Sequence[SimNode],
    cap_blocks: int,
    branch: str | None,
    now: float,
) -> tuple[dict[int, tuple[int, int]], int]:
    """Per node index ``(gpu_blocks, local_blocks)`` of the request's prefix, and the cluster's best.

    The directory resolves the host tier (every stored block is written through to host memory);
    the GPU part comes from the node's own cache. Both are capped at ``cap_blocks`` (a prefill
    computes at least one token).
    """
    res = directory.resolve(req.blocks, branch, now)
    by_name = {n.name: n for n in nodes}
    out: dict[int, tuple[int, int]] = {}
    best = 0
    for name, match in res.prefixes.items():
        node = by_name.get(name)
        if node is None:
            continue
        local = min(match.local_blocks, cap_blocks)
        gpu = min(node.gpu.prefix(req.blocks[:local]) if local else 0, local)
        out[node.index] = (gpu, local)
        best = max(best, local)
    return out, best


def fetchable_blocks(mode: FetchMode, fetch: FetchModel, missing_blocks: int, block: int) -> int:
    """Blocks a node gets from peers instead of recomputing, under the system's data plane."""
    if missing_blocks <= 0 or mode is FetchMode.NONE:
        return 0
    if mode is FetchMode.FREE:
        return missing_blocks
    return missing_blocks if fetch.fetches(missing_blocks * block) else 0


def choose_decode(
    req: SimRequest,
    nodes: Sequence[SimNode],
    models: Sequence[NodeModel],
    ctx: PolicyContext,
    now: float,
    cache: NodeStates | None = None,
) -> int | None:
    """Decode node with KV room and the fewest running requests (the router's ``bind_decode``).

    Decode nodes are viewed with an empty prefill queue; ``cache`` (one kept for decode views only)
    avoids rebuilding unchanged states."""
    if cache is None:
        cache = NodeStates()
    states = [
        cache.get(n, models[n.index], EMPTY_QUEUE, now)
        for n in nodes
        if n.role is Role.DECODE and n.status is NodeStatus.SERVING
    ]
    view = RequestView(
        request_id=str(req.rid), prompt_tokens=req.input_tokens, expected_output_tokens=req.output_tokens
    )
    binding = bind_decode(view, states, ctx)
    if binding is None:
        return None
    return next(n.index for n in nodes if n.name == binding.node_id)
