"""``lmetric``: LMetric's product of prefill work left and load (SMetric §4.1).

    f_n = (q_n + L - c_n) * l_n

``q_n``: uncached tokens queued for prefill on n; ``L``: prompt tokens; ``c_n``: the request's
prefix cached on n (GPU or host); ``l_n``: requests on n (queued prefills, plus running decodes on
colocated nodes). Pick ``argmin f_n``; ties (e.g. every node idle, ``l_n = 0``) go to the smaller
``q_n + L - c_n``, then the smallest id.
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

NAME = "lmetric"


@dataclass(frozen=True, slots=True)
class LMetricKnobs:
    """No knobs."""


class LMetricPolicy:
    def __init__(self, knobs: LMetricKnobs | None = None) -> None:
        self.knobs = knobs or LMetricKnobs()

    @property
    def name(self) -> str:
        return NAME

    def choose(
        self, request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext
    ) -> RouteDecision:
        require_candidates(candidates)
        left = {
            n.node_id: effective_queued_tokens(n, ctx)
            + request.prompt_tokens
            - request.prefix_on(n.node_id).total
            for n in candidates
        }
        scores = {n.node_id: left[n.node_id] * node_load_requests(n, ctx) for n in candidates}
        best = pick_min(scores, left)
        return RouteDecision(
            node_id=best,
            policy=NAME,
            reason=f"(q + L - c) * l = {left[best]:.0f} * load = {scores[best]:.0f}",
            cached_tokens=request.prefix_on(best).total,
            scores=scores,
        )
