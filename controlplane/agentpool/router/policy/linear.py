"""``linear``: Bailian's weighted sum of normalized load and KV miss (SMetric §4.1).

    f_n = (1 - lam) * l_n / max_m l_m  +  lam * (1 - c_n / L)

``l_n``: requests on n (queued prefills, plus running decodes on colocated nodes), normalized by
the largest load among the candidates (0 when all are idle); ``c_n / L``: the request's hit ratio
on n (GPU or host prefix). Pick ``argmin f_n``; ties go to the lower load, then the smallest id.
Knob ``lam`` (default 0.8: operators favour KV reuse for agents).
"""

from __future__ import annotations

from collections.abc import Sequence
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

NAME = "linear"


@dataclass(frozen=True, slots=True)
class LinearKnobs:
    lam: float = 0.8

    def __post_init__(self) -> None:
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")


class LinearPolicy:
    def __init__(self, knobs: LinearKnobs | None = None) -> None:
        self.knobs = knobs or LinearKnobs()

    @property
    def name(self) -> str:
        return NAME

    def choose(
        self, request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext
    ) -> RouteDecision:
        require_candidates(candidates)
        lam = self.knobs.lam
        load = {n.node_id: float(node_load_requests(n, ctx)) for n in candidates}
        top = max(load.values())
        length = request.prompt_tokens
        scores = {}
        for n in candidates:
            l_hat = load[n.node_id] / top if top > 0 else 0.0
            hit = request.prefix_on(n.node_id).total / length if length else 0.0
            scores[n.node_id] = (1.0 - lam) * l_hat + lam * (1.0 - hit)
        best = pick_min(scores, load)
        return RouteDecision(
            node_id=best,
            policy=NAME,
            reason=f"lowest (1-lam)*load + lam*miss = {scores[best]:.3f}",
            cached_tokens=request.prefix_on(best).total,
            scores=scores,
        )
