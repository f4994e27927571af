"""``smetric``: balanced session-centric routing without session ids (smetric.md §4, DESIGN.md).

    hits_n       = local prefix of the request on n (GPU + host of n)
    best         = argmax hits_n                  (ties: lower load_n, then the tie rule below)
    cost_n(u, L) = c_linear*u + c_attn*u*(L - u/2)   with c_linear = c1 + c0/t_bar, c_attn = c2 of n
    queued_n     = T_rem,n + sum of cost_n over n's queue  (+ decode interference on colocated n)
    load_n       = queued_n + cost_n(L - hits_n, L)      (the request's local hit subtracted)
    tpot_n       = predicted TPOT on n with the request added (colocated n, below; 0 on a prefill n)
    slow_n       = tpot_n > SLACK * TPOT_SLO                 (the pool's TPOT SLO, ctx.tpot_slo_s)
    meets_n      = load_n <= SLACK * (b + a*L)  and  not slow_n    (the pool's TTFT and TPOT SLOs)
    stalled      = slow_n on every n                         (colocated nodes only)
    i            = argmin load_n + requests_n * cost_n(L - hits_n, L)  if stalled
                   else argmin (slow_n, load_n)

    if turn == 1 or hits_best == 0 or hits_best < HIT_RATIO * est_hit:   new or evicted session
        return i
    if meets_best: return best                                          stick
    if meets_i: return i                                                migrate
    return i if stalled else argmin cost_n(L - hits_n, L)               no node meets both

Migration (paper §4.2: a session leaves its node when sticking would miss the SLO): ``i`` is the
node of least load among those whose TPOT holds, so when it meets the TTFT deadline it is the best
node meeting both; its load counts the session's lost local reuse as prefill work (only n's own
prefix is subtracted), which weighs a move against the reuse it gives up. When no node meets the
TTFT deadline, the paper's KV$-aware fallback adds the least load (line 7 of its Figure 13); on
prefill nodes (disaggregated pools) nothing else changes, as their TPOT is 0.

Colocated nodes (role BOTH; the paper's §B is not available, this is our extension) decode what
they prefill, so the SLO check also predicts the TPOT the request gets there::

    pending_n = decode_waiting_n + prompt tokens queued on n     (KV claimed before this request)
    tpot_n    = inf  if kv_room_n - pending_n < L + expected output  (it would wait for KV room)
    tpot_n    = d_n(running_decode_n + queued requests_n + 1) + load_n / max(t_out, chunks)

``d_n(b)`` is Eq. 2's decode iteration with ``b`` running (the queued requests decode alongside
this one); the second term spreads the prefill backlog with this request (``load_n``) over a
decode: each prefill chunk rides in a mixed iteration with the node's decodes, so a decode of
``t_out`` tokens (the request's expected output) absorbs the backlog, at most one chunk per token.
With the TTFT check alone (and KV room without ``pending_n``), a session stayed on a node whose GPU
memory was already promised to requests prefilled or queued there; after its prefill it waited for
room, and the wait counted in its TPOT (measured in ``bench_sim smetric``: TPOT 1.5-2.4x lmetric's
past the peak load, most of it that wait; bench/results/sim_smetric_sweep.md).

When the TPOT misses on every node (``stalled``: past the peak, the cluster's KV is taken and every
node has prefilled requests waiting for room), no placement meets the SLO; a request then goes
where it adds the least delay: its own wait for its first token there (``load_n``) plus the time its
prefill holds up each request already on n (``cost_n(L - hits_n, L)`` times ``requests_n``, queued
prefills plus running decodes: every prefill chunk on a colocated node rides with all of its
decodes). The session's node keeps its reuse in that sum (its prefill is the shortest), and a node
crowded with requests pays for each. Two simpler fallbacks fail there (``bench_sim smetric``, 16
nodes, 30 + 10 min, six seeds, ``sim_README.md``): the paper's least added load alone (the session's
node) piles prefills onto nodes whose decodes then crawl (0.39-0.70x lmetric's TPS within SLO at 640
agents), and least ``load_n`` times ``requests_n + 1`` (this rule until session 15) spreads sessions
off their nodes and loses their reuse (0.68-1.17x at 640 agents, lost reuse up to 7.5%).

Ties (the argmins above, and best after load): equal seconds of load are broken by the requests on
the node (queued prefills plus running decodes), then by the KV it holds in use, then by a
rendezvous hash of (request id, node id): stable for one request (a retry sees the same order),
spread evenly over the nodes across requests. Without it, idle nodes tie on every first turn and
every new session went to the smallest id (8 agents at concurrency 1 all landed on one engine).

``est_hit`` is the prompt minus its newly appended turn. Colocated nodes: each prefill iteration
also carries the node's running decodes, so ``queued_n`` adds
``ceil((queued + own uncached tokens) / t_bar) * d2 * running_decode`` there.
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
    effective_queue,
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


def kv_shortfall(request: RequestView, node: NodeState, ctx: PolicyContext) -> float:
    """KV tokens ``node`` lacks to decode ``request`` as soon as it is prefilled: 0 on a prefill node
    (its decode node is chosen later); on a colocated node, the prompt and its output less the room
    left after the requests prefilled and waiting for room there and the prompts queued before it."""
    if node.role is not Role.BOTH:
        return 0.0
    q = effective_queue(node, ctx)
    pending = node.decode_waiting_tokens + q.t_uc + q.t_c
    return max(0.0, kv_tokens_needed(request) + pending - node.kv_room_tokens)


def predicted_tpot(request: RequestView, node: NodeState, ctx: PolicyContext, e: NodeEstimate) -> float:
    """Seconds per output token on ``node`` with ``request`` added (module docstring): 0 on a prefill
    node, ``inf`` on a colocated node short of KV room for it (:func:`kv_shortfall`)."""
    if node.role is not Role.BOTH:
        return 0.0
    if kv_shortfall(request, node, ctx) > 0:
        return math.inf
    q = effective_queue(node, ctx)
    iterations = math.ceil((q.t_uc + request.prompt_tokens - e.hit) / node.model.t_bar)
    spread = max(request.expected_output_tokens, iterations, 1)
    batch = node.running_decode + q.requests + 1
    return node.model.decode.iteration_time(batch) + e.load_s / spread


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
        tpot: dict[str, float] = {}
        for n in candidates:
            e = estimate(request, n, ctx)
            nid = n.node_id
            load[nid], neg_hits[nid], own[nid] = e.load_s, -float(e.hit), e.own_cost_s
            tpot[nid] = predicted_tpot(request, n, ctx, e)
        deadline = self.knobs.slack * ctx.slo.deadline(request.prompt_tokens)
        tpot_limit = self.knobs.slack * ctx.tpot_slo_s
        by_id = {n.node_id: n for n in candidates}

        def tie(nid: str) -> tuple[int, int, int, str]:
            return tie_rank(request, by_id[nid], ctx)

        slow = {nid: float(t > tpot_limit) for nid, t in tpot.items()}  # 1.0: TPOT would miss
        best = _argmin({nid: (neg_hits[nid], load[nid]) for nid in load}, tie)
        # TPOT misses everywhere (colocated nodes only: a prefill node's TPOT is 0)
        stalled = all(slow.values())
        if stalled:  # the least delay added: its own wait, and its prefill's on each request there
            least = _argmin({nid: (v + own[nid] * tie(nid)[0],) for nid, v in load.items()}, tie)
        else:
            least = _argmin({nid: (slow[nid], v) for nid, v in load.items()}, tie)
        hit = int(-neg_hits[best])
        expected = self.knobs.hit_ratio * request.expected_hit
        if request.turn == 1 or hit == 0 or hit < expected:
            why = "first turn" if request.turn == 1 else f"session not cached (hit {hit} < {expected:.0f})"
            return self._decision(request, least, f"{why}: least loaded", load)
        if load[best] <= deadline and not slow[best]:
            why = f"load {load[best]:.3f}s <= {deadline:.3f}s, TPOT {tpot[best]:.3f}s"
            return self._decision(request, best, f"stick: {why}", load)
        if load[least] <= deadline and not slow[least]:
            if math.isinf(tpot[best]):
                why = f"no KV room on {best}"
            elif slow[best]:
                why = f"{best} TPOT {tpot[best]:.3f}s > {tpot_limit:.3f}s"
            else:
                why = f"{best} would miss {deadline:.3f}s"
            return self._decision(request, least, f"migrate: {why}, {least} meets both", load)
        if stalled:
            why = f"no node meets TPOT {tpot_limit:.3f}s: least delay added"
            return self._decision(request, least, why, load)
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
