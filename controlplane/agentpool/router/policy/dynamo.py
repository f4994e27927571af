"""``dynamo``: NVIDIA Dynamo's KV router cost with overlap credits (host blocks credit 0.75).

    blocks        = L / page
    credit_n      = gpu_blocks_n + host_credit * host_only_blocks_n       (local prefix on n)
    prefill_n     = queued uncached tokens_n / page + (blocks - credit_n)
    decode_n      = KV tokens in use on n / page                          (active blocks)
    cost_n        = overlap_weight * prefill_n + decode_n

Pick ``argmin cost_n`` (Dynamo's temperature 0); ties go to the lower load, then the smallest id.
Knobs: ``overlap_weight`` (Dynamo's overlap_score_weight, default 1), ``host_credit`` (0.75).
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

NAME = "dynamo"


@dataclass(frozen=True, slots=True)
class DynamoKnobs:
    overlap_weight: float = 1.0
    host_credit: float = 0.75

    def __post_init__(self) -> None:
        if self.overlap_weight < 0 or not 0.0 <= self.host_credit <= 1.0:
            raise ValueError(f"need overlap_weight >= 0 and 0 <= host_credit <= 1: {self}")


class DynamoPolicy:
    def __init__(self, knobs: DynamoKnobs | None = None) -> None:
        self.knobs = knobs or DynamoKnobs()

    @property
    def name(self) -> str:
        return NAME

    def cost(self, request: RequestView, node: NodeState, ctx: PolicyContext) -> float:
        page = ctx.page_size
        prefix = request.prefix_on(node.node_id)
        gpu_blocks = prefix.gpu // page
        host_blocks = prefix.total // page - gpu_blocks
        credit = gpu_blocks + self.knobs.host_credit * host_blocks
        prefill = effective_queued_tokens(node, ctx) / page + (request.prompt_tokens / page - credit)
        decode = node.kv_used_tokens / page
        return self.knobs.overlap_weight * prefill + decode

    def choose(
        self, request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext
    ) -> RouteDecision:
        require_candidates(candidates)
        scores = {n.node_id: self.cost(request, n, ctx) for n in candidates}
        load = {n.node_id: float(node_load_requests(n, ctx)) for n in candidates}
        best = pick_min(scores, load)
        return RouteDecision(
            node_id=best,
            policy=NAME,
            reason=f"lowest block cost {scores[best]:.1f}",
            cached_tokens=request.prefix_on(best).total,
            scores=scores,
        )
