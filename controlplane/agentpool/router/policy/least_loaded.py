"""``least-loaded``: join the shortest queue (vLLM's default; SMetric's "load-balance-only").

    load_n = queued prefill requests + running decode requests (colocated nodes only)

Pick ``argmin load_n``; ties go to fewer queued uncached tokens, then the smallest id. Ignores the
KV cache entirely (the request's local prefix is reported in the decision, not used).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentpool.router.policy.contract import (
    NodeState,
    PolicyContext,
    RequestView,
    RouteDecision,
    effective_queued_tokens,
    node_load_requests,
    pick_min,
    require_candidates,
)

NAME = "least-loaded"


@dataclass(frozen=True, slots=True)
class LeastLoadedKnobs:
    """No knobs."""


class LeastLoadedPolicy:
    def __init__(self, knobs: LeastLoadedKnobs | None = None) -> None:
        self.knobs = knobs or LeastLoadedKnobs()

    @property
    def name(self) -> str:
        return NAME

    def choose(
        self, request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext
    ) -> RouteDecision:
        require_candidates(candidates)
        scores = {n.node_id: float(node_load_requests(n, ctx)) for n in candidates}
        tokens = {n.node_id: effective_queued_tokens(n, ctx) for n in candidates}
        best = pick_min(scores, tokens)
        return RouteDecision(
            node_id=best,
            policy=NAME,
            reason=f"fewest requests ({scores[best]:.0f})",
            cached_tokens=request.prefix_on(best).total,
            scores=scores,
        )
