"""One window's evaluation by the planner (:class:`agentpool.planner.controller.PlannerController`):
the decision with the pods left out of it, and the words that tell it in the pool's Kubernetes
Events and its last switch's reason."""

from __future__ import annotations

from dataclasses import dataclass

from agentpool.planner.core import SplitDecision


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One window's decision plus the pods the controller left out of it, and why."""

    decision: SplitDecision
    excluded: tuple[str, ...]


def event_message(decision: SplitDecision, excluded: list[str]) -> str:
    best = decision.best
    parts = [decision.reason]
    if decision.to_prefill:
        parts.append(f"to prefill: {', '.join(decision.to_prefill)}")
    if decision.to_decode:
        parts.append(f"to decode: {', '.join(decision.to_decode)}")
    if best is not None:
        parts.append(f"gains per slice {', '.join(f'{g:.3g}' for g in best.gains)}")
    if excluded:
        parts.append(f"left out: {', '.join(excluded)}")
    return "; ".join(parts)
