"""``cache-aware``: the SGLang model gateway's policy, with the KV directory as its prefix tree.

    load_n      = requests on n (queued prefills; plus running decodes on colocated nodes)
    imbalanced  = (max load - min load) > balance_abs  and  max load > balance_rel * min load
    if imbalanced:                       pick argmin load                      (shortest queue)
    match_n     = longest prefix of the request on n (GPU or host);  rate = max match / L
    elif rate > cache_threshold:         pick argmax match_n   (ties: lower load, then id)
    else:                                pick argmax KV room   (SGLang: the smallest tree)

Defaults are sglang-router 0.3.2's: cache_threshold 0.3, balance_abs 64, balance_rel 1.5.
Unlike SGLang's approximate per-worker tree of routed text, the match comes from the directory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentpool.router.policy.contract import (
    NodeState,
    PolicyContext,
    RequestView,
    RouteDecision,
    node_load_requests,
    pick_min,
    require_candidates,
)

NAME = "cache-aware"


@dataclass(frozen=True, slots=True)
class CacheAwareKnobs:
    cache_threshold: float = 0.3
    balance_abs: float = 64.0
    balance_rel: float = 1.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0 or self.balance_abs < 0 or self.balance_rel < 1.0:
            raise ValueError(f"need 0 <= cache_threshold <= 1, balance_abs >= 0, balance_rel >= 1: {self}")


class CacheAwarePolicy:
    def __init__(self, knobs: CacheAwareKnobs | None = None) -> None:
        self.knobs = knobs or CacheAwareKnobs()

    @property
    def name(self) -> str:
        return NAME

    def choose(
        self, request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext
    ) -> RouteDecision:
        require_candidates(candidates)
        k = self.knobs
        load = {n.node_id: float(node_load_requests(n, ctx)) for n in candidates}
        hi, lo = max(load.values()), min(load.values())
        if hi - lo > k.balance_abs and hi > k.balance_rel * lo:
            best = pick_min(load)
            return self._decision(
                request, best, f"imbalanced (max {hi:.0f}, min {lo:.0f}): least loaded", load
            )
        match = {n.node_id: request.prefix_on(n.node_id).total for n in candidates}
        top = max(match.values())
        rate = top / request.prompt_tokens if request.prompt_tokens else 0.0
        if rate > k.cache_threshold:
            best = pick_min({nid: -float(m) for nid, m in match.items()}, load)
            return self._decision(request, best, f"match rate {rate:.2f} > {k.cache_threshold}", load)
        room = {n.node_id: -float(n.kv_room_tokens) for n in candidates}
        best = pick_min(room, load)
        return self._decision(
            request, best, f"match rate {rate:.2f} <= {k.cache_threshold}: most KV room", load
        )

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
