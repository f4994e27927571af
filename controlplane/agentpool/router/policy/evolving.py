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

The candidates are scored column-wise (numpy, the same float operations per node as the formula
above): the request's own part (``t_c``, ``x``, Eq. 3 of ``w_n``, ``tau(x)``, ``kappa x``) depends
only on ``local_n`` and the node's model, so it is computed once per distinct pair; the wait
``W_n`` is :func:`~agentpool.router.policy.contract.effective_service_column`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, is_

import numpy as np
import numpy.typing as npt

from agentpool.models import NodeModel, attention_pairs, copy_price
from agentpool.router.policy.contract import (
    NO_PREFIX,
    Column,
    Decision,
    NodeState,
    PolicyContext,
    PolicyError,
    RequestView,
    ScoreMap,
    effective_service_column,
    eq3_of_sums,
    pick_min,
    require_candidates,
)

NAME = "evolving"
_ID = attrgetter("node_id")
_MODEL = attrgetter("model")
_TOTAL = attrgetter("total")


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


@dataclass(frozen=True, slots=True)
class _Own:
    """The request's own part on a node holding ``local`` tokens of it: E.3 lines 6-8."""

    service_s: float
    tau_s: float
    copy_s: float
    cached_tokens: int  # t_c
    fetch_tokens: int  # x


def _own(request: RequestView, local: int, model: NodeModel, ctx: PolicyContext) -> _Own:
    missing = max(0, max(request.cluster_prefix, local) - local)
    x = missing if ctx.fetch.fetches(missing) else 0
    t_c = local + x
    t_uc = request.prompt_tokens - t_c
    service = eq3_of_sums(model, t_uc, t_c, attention_pairs(t_uc, t_c))
    return _Own(service, ctx.fetch.tau(x), copy_price(ctx.kappa_s_per_token, x), t_c, x)


@dataclass(frozen=True, slots=True)
class _Scored:
    """Eq. 7 of every candidate, in the candidates' order."""

    ids: list[str]
    local: list[int]
    own: list[_Own]  # per distinct (local, model) pair
    which: npt.NDArray[np.intp]  # per candidate, its index in ``own``
    wait: Column
    service: Column
    exposed: Column
    copy: Column
    ttft: Column

    def prediction(self, i: int) -> Prediction:
        own = self.own[int(self.which[i])]
        return Prediction(
            float(self.wait[i]),
            float(self.service[i]),
            float(self.exposed[i]),
            float(self.copy[i]),
            own.cached_tokens,
            own.fetch_tokens,
        )


def _score(request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext) -> _Scored:
    """``T_n = W_n + T_P,n(w_n) + max(0, tau(x_n) - W_n) + kappa * x_n`` for each candidate."""
    n = len(candidates)
    ids = list(map(_ID, candidates))
    if len(set(ids)) != n:
        raise PolicyError("candidates must have distinct node ids")
    local = list(map(_TOTAL, map(request.local_prefix.get, ids, repeat(NO_PREFIX))))
    models = list(map(_MODEL, candidates))
    keys: list[Hashable] = list(local)
    if not all(map(is_, models, repeat(models[0]))):  # the models outlive this call: ids are stable
        keys = list(zip(local, map(id, models), strict=True))
    pairs = dict(zip(keys, zip(local, models, strict=True), strict=True))
    own = [_own(request, n_local, model, ctx) for n_local, model in pairs.values()]
    slot = {k: i for i, k in enumerate(pairs)}
    which = np.fromiter(map(slot.__getitem__, keys), np.intp, n)
    parts = np.array([(o.service_s, o.tau_s, o.copy_s) for o in own], np.float64)[which]
    wait = effective_service_column(candidates, ctx)
    service, copy = parts[:, 0], parts[:, 2]
    exposed = parts[:, 1] - wait
    exposed = np.where(exposed > 0.0, exposed, 0.0)  # max(0.0, v): NaN and -0.0 give 0.0 too
    ttft = wait + service + exposed + copy
    return _Scored(ids, local, own, which, wait, service, exposed, copy, ttft)


def _best(s: _Scored) -> int:
    """:func:`pick_min` over the scores, tie-break on the longest local prefix: the index of the pick."""
    ttft = s.ttft
    low = ttft.min()
    if low != low:  # NaN somewhere: pick_min's own comparison order decides
        longest = {nid: -float(loc) for nid, loc in zip(s.ids, s.local, strict=True)}
        return s.ids.index(pick_min(dict(zip(s.ids, ttft.tolist(), strict=True)), longest))
    hits = np.flatnonzero(ttft == low).tolist()
    if len(hits) == 1:
        return int(hits[0])
    return int(min(hits, key=lambda i: (-float(s.local[i]), s.ids[i])))


def predict(request: RequestView, node: NodeState, ctx: PolicyContext) -> Prediction:
    """Predicted TTFT of ``request`` on ``node`` with its parts (Algorithm E.3, lines 6-9)."""
    return _score(request, [node], ctx).prediction(0)


class EvolvingPolicy:
    def __init__(self, knobs: EvolvingKnobs | None = None) -> None:
        self.knobs = knobs or EvolvingKnobs()

    @property
    def name(self) -> str:
        return NAME

    def choose(self, request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext) -> Decision:
        require_candidates(candidates)
        scored = _score(request, candidates, ctx)
        i = _best(scored)
        p = scored.prediction(i)
        return Decision(
            node_id=scored.ids[i],
            policy=NAME,
            reason=(
                f"predicted ttft {p.ttft_s:.4f}s = wait {p.wait_s:.4f} + service {p.service_s:.4f}"
                f" + exposed fetch {p.exposed_fetch_s:.4f} + copy {p.copy_s:.4f}"
            ),
            cached_tokens=p.cached_tokens,
            fetch_tokens=p.fetch_tokens,
            scores=ScoreMap(scored.ids, scored.ttft),
        )
