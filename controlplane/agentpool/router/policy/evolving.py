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

The request's own part (``t_c``, ``x``, Eq. 3 of ``w_n``, ``tau(x)``, ``kappa x``) depends only on
``local_n`` and the node's model: all but Eq. 3 is computed once per distinct ``local_n`` (most
nodes share a few prefix lengths, e.g. a common system prompt), Eq. 3 once per distinct pair (each
node has its own model once the planner fitted it), then each node adds its own wait ``W_n``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from agentpool.models import NodeModel, attention_pairs, copy_price
from agentpool.router.policy.contract import (
    NO_PREFIX,
    NodeState,
    PolicyContext,
    PolicyError,
    RequestView,
    RouteDecision,
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
    ttft_s: float  # the policy's score: wait + service + exposed fetch + copy


class _Own(NamedTuple):
    """The request's own part on a node holding ``local`` tokens of it: E.3 lines 6-8."""

    service_s: float
    tau_s: float
    copy_s: float
    cached_tokens: int  # t_c
    fetch_tokens: int  # x


class _Fetch(NamedTuple):
    """The part of :class:`_Own` that depends on ``local`` only (not on the node's model)."""

    t_uc: int
    t_c: int
    pairs: float  # attention_pairs(t_uc, t_c)
    tau_s: float
    copy_s: float
    fetch_tokens: int  # x


def _fetch(request: RequestView, local: int, ctx: PolicyContext) -> _Fetch:
    missing = max(0, max(request.cluster_prefix, local) - local)
    x = missing if ctx.fetch.fetches(missing) else 0
    t_c = local + x
    t_uc = request.prompt_tokens - t_c
    return _Fetch(
        t_uc, t_c, attention_pairs(t_uc, t_c), ctx.fetch.tau(x), copy_price(ctx.kappa_s_per_token, x), x
    )


def _own_of(f: _Fetch, service_s: float) -> _Own:
    return _Own(service_s, f.tau_s, f.copy_s, f.t_c, f.fetch_tokens)


def _own(request: RequestView, local: int, model: NodeModel, ctx: PolicyContext) -> _Own:
    f = _fetch(request, local, ctx)
    return _own_of(f, eq3_of_sums(model, f.t_uc, f.t_c, f.pairs))


def _exposed_fetch_s(wait: float, own: _Own) -> float:
    return max(0.0, own.tau_s - wait)


def _ttft(wait: float, own: _Own) -> float:
    """E.3 line 9: ``T_n = W_n + T_P,n(w_n) + max(0, tau(x_n) - W_n) + kappa * x_n``."""
    return wait + own.service_s + _exposed_fetch_s(wait, own) + own.copy_s


def _prediction(wait: float, own: _Own) -> Prediction:
    return Prediction(
        wait,
        own.service_s,
        _exposed_fetch_s(wait, own),
        own.copy_s,
        own.cached_tokens,
        own.fetch_tokens,
        _ttft(wait, own),
    )


def predict(request: RequestView, node: NodeState, ctx: PolicyContext) -> Prediction:
    """Predicted TTFT of ``request`` on ``node`` with its parts (Algorithm E.3, lines 6-9)."""
    own = _own(request, request.prefix_on(node.node_id).total, node.model, ctx)
    return _prediction(effective_service_s(node, ctx), own)


class EvolvingPolicy:
    def __init__(self, knobs: EvolvingKnobs | None = None) -> None:
        self.knobs = knobs or EvolvingKnobs()

    @property
    def name(self) -> str:
        return NAME

    def choose(
        self, request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext
    ) -> RouteDecision:
        require_candidates(candidates)
        prefix = request.local_prefix.get
        fetches: dict[int, _Fetch] = {}  # per local prefix: most nodes share a few lengths
        services: dict[tuple[int, int], float] = {}  # Eq. 3 per (local, model); models outlive the call
        scores: dict[str, float] = {}
        nan = False
        # the loop runs for every candidate of every request: _ttft is written out (same operations)
        for n in candidates:
            nid = n.node_id
            local = prefix(nid, NO_PREFIX).total
            f = fetches.get(local)
            if f is None:
                f = fetches[local] = _fetch(request, local, ctx)
            model = n.model
            key = (local, id(model))
            service = services.get(key)
            if service is None:
                service = services[key] = eq3_of_sums(model, f.t_uc, f.t_c, f.pairs)
            wait = effective_service_s(n, ctx)
            exposed = f.tau_s - wait
            score = scores[nid] = wait + service + (exposed if exposed > 0.0 else 0.0) + f.copy_s
            if score != score:
                nan = True
        if len(scores) != len(candidates):
            raise PolicyError("candidate node ids must be distinct")
        best = _pick(scores, request, nan)
        # the winner's parts again, from the same caches (not kept per candidate: one of many wins);
        # :func:`_prediction` written out (the same operations in the same order)
        node = next(n for n in candidates if n.node_id == best)
        local = prefix(best, NO_PREFIX).total
        f = fetches[local]
        wait = effective_service_s(node, ctx)
        service = services[local, id(node.model)]
        exposed = max(0.0, f.tau_s - wait)
        ttft = wait + service + exposed + f.copy_s
        return RouteDecision(
            node_id=best,
            policy=NAME,
            reason=(
                f"predicted ttft {ttft:.4f}s = wait {wait:.4f} + service {service:.4f}"
                f" + exposed fetch {exposed:.4f} + copy {f.copy_s:.4f}"
            ),
            cached_tokens=f.t_c,
            fetch_tokens=f.fetch_tokens,
            scores=scores,
        )


def _pick(scores: dict[str, float], request: RequestView, nan: bool) -> str:
    """:func:`pick_min` with the longest local prefix as tie-break, its tie-break built only for ties."""
    if not nan:  # without NaN the lowest score is well defined: only the nodes that have it compete
        low = min(scores.values())
        tied = [nid for nid, s in scores.items() if s == low]
        if len(tied) == 1:
            return tied[0]
        if not request.local_prefix:  # every tie-break value is the same: the smallest id wins
            return min(tied)
        scores = dict.fromkeys(tied, low)
    return pick_min(scores, {nid: -float(request.prefix_on(nid).total) for nid in scores})
