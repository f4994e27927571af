"""``smetric``: balanced session-centric routing without session ids (smetric.md §4, DESIGN.md).

    hits_n       = local prefix of the request on n (GPU + host of n)
    best         = argmax hits_n                  (ties: lower load_n, then the tie rule below)
    cost_n(u, L) = c_linear*u + c_attn*u*(L - u/2)   with c_linear = c1 + c0/t_bar, c_attn = c2 of n
    queued_n     = T_rem,n + sum of cost_n over n's queue  (+ decode interference on colocated n)
    load_n       = queued_n + cost_n(L - hits_n, L)      (the request's local hit subtracted)
    meets_n      = load_n <= SLACK * (b + a*L)           (the pool's TTFT SLO)

    if turn == 1 or hits_best == 0 or hits_best < HIT_RATIO * est_hit:   new or evicted session
        return argmin load_n
    if meets_best: return best                                          stick
    i = argmin load_n
    return i if meets_i else argmin cost_n(L - hits_n, L)               migrate, or least added load

Colocated nodes (role BOTH) decode what they prefill, so ``meets_n`` also asks for KV room there:
``kv_room_n >= L + expected output``. Without it the request, once prefilled, waits for running
decodes to finish, and its TPOT misses the SLO however short the prefill queue. This is what keeps
the SLO-aware migration working under overload: there a sticky node's prefill queue can still look
short while its GPU memory is full of its sessions' decodes, and sticking piled sessions onto such
nodes (measured: TPS within SLO 4.6x below lmetric's at twice the peak load, bench_sim smetric).
``argmin load_n`` prefers nodes with that room (a first turn or a migration goes where it can
decode); the least-added-load branch stays KV$-aware as in the paper.

Ties (the argmins above, and best after load): equal seconds of load are broken by the requests on
the node (queued prefills plus running decodes), then by the KV it holds in use, then by a
rendezvous hash of (request id, node id): stable for one request (a retry sees the same order),
spread evenly over the nodes across requests. Without it, idle nodes tie on every first turn and
every new session went to the smallest id (8 agents at concurrency 1 all landed on one engine).

``est_hit`` is the prompt minus its newly appended turn. Colocated nodes (our extension; the
paper's §B is not available): each prefill iteration also carries the node's running decodes, so
``queued_n`` adds ``ceil((queued + own uncached tokens) / t_bar) * d2 * running_decode`` there.
Knobs: ``slack`` (default 1.0), ``hit_ratio`` (default 0.8).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import xxhash

from agentpool.router.policy.contract import (
    NodeState,
    PolicyContext,
    RequestView,
    Role,
    RouteDecision,
    effective_queued_tokens,
    is_fresh,
    linear_attention_cost_of,
    queue_depth,
    require_candidates,
)
from agentpool.router.policy.decode import kv_tokens_needed

NAME = "smetric"


@dataclass(frozen=True, slots=True)
class SMetricKnobs:
    slack: float = 1.0
    hit_ratio: float = 0.8

    def __post_init__(self) -> None:
        if self.slack < 0 or not 0.0 <= self.hit_ratio <= 1.0:
            raise ValueError(f"need slack >= 0 and 0 <= hit_ratio <= 1: {self}")


class NodeEstimate(NamedTuple):
    hit: int
    own_cost_s: float
    load_s: float


def estimate(request: RequestView, node: NodeState, ctx: PolicyContext) -> NodeEstimate:
    hit = request.prefix_on(node.node_id).total
    length = request.prompt_tokens
    cost = linear_attention_cost_of(node.model)
    own = cost.cost(float(length - hit), float(length))
    queued = node.unreported.linear_attention_cost(cost)
    if is_fresh(node, ctx):
        queued += node.remaining_batch_s + node.queue.linear_attention_cost(cost)
    if node.role is Role.BOTH and node.running_decode:
        iterations = math.ceil((effective_queued_tokens(node, ctx) + length - hit) / node.model.t_bar)
        queued += iterations * node.model.decode.d2 * node.running_decode
    return NodeEstimate(hit=hit, own_cost_s=own, load_s=queued + own)


def has_decode_room(request: RequestView, node: NodeState) -> bool:
    """Whether ``node`` can decode ``request`` as soon as it is prefilled: always on a prefill node
    (its decode node is chosen later); on a colocated node, KV room for the prompt and its output."""
    return node.role is not Role.BOTH or node.kv_room_tokens >= kv_tokens_needed(request)


def tie_rank(request: RequestView, node: NodeState, ctx: PolicyContext) -> tuple[int, int, int, str]:
    """What breaks a tie in seconds of load: requests on the node (queued prefills + running
    decodes), its KV in use, a rendezvous hash of the request and node ids, the node id."""
    return (
        queue_depth(node, ctx) + node.running_decode,
        node.kv_used_tokens,
        xxhash.xxh3_64_intdigest(f"{request.request_id}\0{node.node_id}".encode()),
        node.node_id,
    )


def _argmin(scores: Mapping[str, tuple[float, ...]], tie: Callable[[str], tuple[int, int, int, str]]) -> str:
    """The node with the lowest score; :func:`tie_rank` only among the nodes that share it."""
    low = min(scores.values())
    tied = [nid for nid, v in scores.items() if v == low]
    return tied[0] if len(tied) == 1 else min(tied, key=tie)


class SMetricPolicy:
    def __init__(self, knobs: SMetricKnobs | None = None) -> None:
        self.knobs = knobs or SMetricKnobs()

    @property
    def name(self) -> str:
        return NAME

    def choose(
        self, request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext
    ) -> RouteDecision:
        require_candidates(candidates)
        load: dict[str, float] = {}
        neg_hits: dict[str, float] = {}
        own: dict[str, float] = {}
        for n in candidates:
            e = estimate(request, n, ctx)
            load[n.node_id], neg_hits[n.node_id], own[n.node_id] = e.load_s, -float(e.hit), e.own_cost_s
        deadline = self.knobs.slack * ctx.slo.deadline(request.prompt_tokens)
        by_id = {n.node_id: n for n in candidates}

        def tie(nid: str) -> tuple[int, int, int, str]:
            return tie_rank(request, by_id[nid], ctx)

        full = {n.node_id: float(not has_decode_room(request, n)) for n in candidates}  # 1.0: no room
        best = _argmin({nid: (neg_hits[nid], load[nid]) for nid in load}, tie)
        least = _argmin({nid: (full[nid], v) for nid, v in load.items()}, tie)
        hit = int(-neg_hits[best])
        expected = self.knobs.hit_ratio * request.expected_hit
        if request.turn == 1 or hit == 0 or hit < expected:
            why = "first turn" if request.turn == 1 else f"session not cached (hit {hit} < {expected:.0f})"
            return self._decision(request, least, f"{why}: least loaded", load)
        if load[best] <= deadline and not full[best]:
            return self._decision(request, best, f"stick: load {load[best]:.3f}s <= {deadline:.3f}s", load)
        if load[least] <= deadline and not full[least]:
            why = f"no KV room on {best}" if full[best] else f"{best} would miss {deadline:.3f}s"
            return self._decision(request, least, f"migrate: {why}, {least} meets it", load)
        added = _argmin({nid: (own[nid], load[nid]) for nid in load}, tie)
        return self._decision(request, added, f"no node meets {deadline:.3f}s: least added load", load)

    def _decision(
        self, request: RequestView, node_id: str, reason: str, load: Mapping[str, float]
    ) -> RouteDecision:
        return RouteDecision(
            node_id=node_id,
            policy=NAME,
            reason=reason,
            cached_tokens=request.prefix_on(node_id).total,
            scores=dict(load),
        )
