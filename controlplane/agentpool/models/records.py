"""What engines report to the planner: one record per iteration (evolving-infra §5.1 "Online fitting").

Also the MoE routing shape that the decode model's ``phi(B)`` needs. Plain values, no dependencies
beyond the standard library, so an engine can build them without the fitting machinery.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentpool.models.iteration import PrefillBatchItem


@dataclass(frozen=True, slots=True)
class PrefillIterationRecord:
    """One prefill iteration of ``node``: the requests of its batch and its measured time (s)."""

    node: str
    at: float
    batch: tuple[PrefillBatchItem, ...]
    seconds: float

    def __post_init__(self) -> None:
        _check_seconds(self.seconds)
        if not self.batch:
            raise ValueError("a prefill iteration record needs at least one request")


@dataclass(frozen=True, slots=True)
class DecodeIterationRecord:
    """One decode iteration of ``node`` with ``running`` requests and its measured time (s)."""

    node: str
    at: float
    running: int
    seconds: float

    def __post_init__(self) -> None:
        _check_seconds(self.seconds)
        if self.running < 1:
            raise ValueError(f"a decode iteration runs at least one request, got {self.running}")


IterationRecord = PrefillIterationRecord | DecodeIterationRecord


def _check_seconds(seconds: float) -> None:
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"an iteration time must be positive and finite, got {seconds}")


@dataclass(frozen=True, slots=True)
class MoeShape:
    """How the node's model routes tokens: ``k`` of ``E`` experts, ``t_fwd`` tokens per request.

    ``experts_total = 0`` is a dense model: ``phi`` is 1 and ``d1`` cannot be told from ``d0``;
    the fit then puts the whole fixed cost in ``d0`` and sets ``d1 = 0``.
    """

    experts_active: int = 8
    experts_total: int = 128
    t_fwd: float = 1.0
