"""``evolving``: minimum predicted TTFT (evolving-infra Eq. 7 and Algorithm E.3, inner loop).

For each prefill candidate ``n``::

    local_n = longest prefix of the request held on n (GPU or host)
    x_n     = cluster_prefix - local_n  if tau fetches it (>= min_tokens) else 0
    t_c,n   = local_n + x_n ;  t_uc,n = L - t_c,n
    W_n     = T_rem,n + sum_{j in Q_n} T_P,n(w_j)            (Eq. 3 per queued request)
    T_n     = W_n + T_P,n(w_n) + max(0, tau(x_n) - W_n) + kappa * x_n

``Q_n`` is the reported queue (if the report is younger than ``max_report_age_s``) plus the
requests sent but not reported yet. Pick ``argmin T_n``; ties go to the longest local prefix, then
the smallest node id. Fetched tokens are restored like host tokens, so Eq. 3's ``f_n * t_c`` term
applies to them unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentpool.models import attention_pairs, copy_price
from agentpool.router.policy.contract import (
    Decision,
    NodeState,
    PolicyContext,
    RequestView,
    effective_service_s,
    eq3_of_sums,
    pick_min,
    require_candidates,
)

NAME = "evolving"


@dataclass(frozen=True, slots=True)
class EvolvingKnobs:
    """No knobs of its own: tau, kappa and the report age come from the policy context."""


@dataclass(frozen=True, slots=True)
class Prediction:
    wait_s: float
    service_s: float
    exposed_fetch_s: float
    copy_s: float
    cached_tokens: int
    fetch_tokens: int

    @property
    def ttft_s(self) -> float:
        return self.wait_s + self.service_s + self.exposed_fetch_s + self.copy_s


def _parts(
    request: RequestView, node: NodeState, ctx: PolicyContext
) -> tuple[float, float, float, float, int, int]:
    """(wait, own service, exposed fetch, copy price, t_c, x) of ``request`` on ``node``: E.3 lines 6-9."""
    local = request.prefix_on(node.node_id).total
    missing = max(0, max(request.cluster_prefix, local) - local)
    x = missing if ctx.fetch.fetches(missing) else 0
    t_c = local + x
    t_uc = request.prompt_tokens - t_c
    wait = effective_service_s(node, ctx)
    service = eq3_of_sums(node.model, t_uc, t_c, attention_pairs(t_uc, t_c))
    exposed = max(0.0, ctx.fetch.tau(x) - wait)
    return wait, service, exposed, copy_price(ctx.kappa_s_per_token, x), t_c, x


def predict(request: RequestView, node: NodeState, ctx: PolicyContext) -> Prediction:
    """Predicted TTFT of ``request`` on ``node`` with its parts (Algorithm E.3, lines 6-9)."""
    wait, service, exposed, copy, t_c, x = _parts(request, node, ctx)
    return Prediction(wait, service, exposed, copy, t_c, x)


class EvolvingPolicy:
    def __init__(self, knobs: EvolvingKnobs | None = None) -> None:
        self.knobs = knobs or EvolvingKnobs()

    @property
    def name(self) -> str:
        return NAME

    def choose(self, request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext) -> Decision:
        require_candidates(candidates)
        scores: dict[str, float] = {}
        for n in candidates:
            wait, service, exposed, copy, _, _ = _parts(request, n, ctx)
            scores[n.node_id] = wait + service + exposed + copy
        longest_local = {n.node_id: -float(request.prefix_on(n.node_id).total) for n in candidates}
        best = pick_min(scores, longest_local)
        p = predict(request, next(n for n in candidates if n.node_id == best), ctx)
        return Decision(
            node_id=best,
            policy=NAME,
            reason=(
                f"predicted ttft {p.ttft_s:.4f}s = wait {p.wait_s:.4f} + service {p.service_s:.4f}"
                f" + exposed fetch {p.exposed_fetch_s:.4f} + copy {p.copy_s:.4f}"
            ),
            cached_tokens=p.cached_tokens,
            fetch_tokens=p.fetch_tokens,
            scores=scores,
        )
