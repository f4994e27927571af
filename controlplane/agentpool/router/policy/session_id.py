"""``session-id``: sticky by the harness's session id (llm-d-style session affinity; SMetric's baseline).

    session   = the request's branch id (``x-agentpool-branch``), the harness's own session identity
    node      = argmax_n  xxh3_64(session || 0x00 || n)          (rendezvous hashing over candidates)
    no session -> the least-loaded rule (fewest requests, then fewer queued uncached tokens)

Rendezvous hashing keeps the policy stateless: every follow-up of a session lands on the same node
while that node is a candidate, and a node leaving moves only its own sessions. It ignores load and
SLOs entirely: the ideal-stickiness baseline that SMetric approximates without session ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from agentpool.router.policy.contract import (
    NodeState,
    PolicyContext,
    RequestView,
    RouteDecision,
    require_candidates,
)
from agentpool.router.policy.least_loaded import LeastLoadedPolicy

NAME = "session-id"


@dataclass(frozen=True, slots=True)
class SessionIdKnobs:
    """No knobs."""


def affinity(session: str, node_id: str) -> int:
    """The rendezvous weight of ``node_id`` for ``session`` (higher wins)."""
    return xxhash.xxh3_64_intdigest(f"{session}\x00{node_id}".encode())


class SessionIdPolicy:
    def __init__(self, knobs: SessionIdKnobs | None = None) -> None:
        self.knobs = knobs or SessionIdKnobs()
        self._without_session = LeastLoadedPolicy()

    @property
    def name(self) -> str:
        return NAME

    def choose(
        self, request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext
    ) -> RouteDecision:
        require_candidates(candidates)
        session = request.branch_id
        if session is None:
            d = self._without_session.choose(request, candidates, ctx)
            return RouteDecision(
                node_id=d.node_id,
                policy=NAME,
                reason=f"no session id: {d.reason}",
                cached_tokens=d.cached_tokens,
                scores=d.scores,
            )
        weights = {n.node_id: affinity(session, n.node_id) for n in candidates}
        best = max(weights, key=lambda nid: (weights[nid], nid))
        scores = {nid: -float(w) for nid, w in weights.items()}
        return RouteDecision(
            node_id=best,
            policy=NAME,
            reason=f"session {session!r} is pinned to {best}",
            cached_tokens=request.prefix_on(best).total,
            scores=scores,
        )
