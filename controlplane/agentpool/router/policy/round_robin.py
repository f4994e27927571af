"""``round-robin``: the next candidate after the last one chosen, in node-id order.

State: the id of the last node chosen (one string, bounded). Candidates are sorted by id, and the
policy picks the first id greater than the last one, wrapping around; it ignores load and cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentpool.router.policy.contract import (
    NodeState,
    PolicyContext,
    RequestView,
    RouteDecision,
    require_candidates,
)

NAME = "round-robin"


@dataclass(frozen=True, slots=True)
class RoundRobinKnobs:
    """No knobs."""


class RoundRobinPolicy:
    def __init__(self, knobs: RoundRobinKnobs | None = None) -> None:
        self.knobs = knobs or RoundRobinKnobs()
        self._last: str | None = None

    @property
    def name(self) -> str:
        return NAME

    def choose(
        self, request: RequestView, candidates: Sequence[NodeState], ctx: PolicyContext
    ) -> RouteDecision:
        require_candidates(candidates)
        ids = sorted(n.node_id for n in candidates)
        last = self._last
        chosen = next((i for i in ids if last is None or i > last), ids[0])
        self._last = chosen
        cached = request.prefix_on(chosen).total
        return RouteDecision(node_id=chosen, policy=NAME, reason=f"next after {last}", cached_tokens=cached)
