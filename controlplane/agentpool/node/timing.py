"""Iteration times of a node: the interface the node model asks, and the two implementations.

- :class:`EquationTimes`: Eq. 1 and Eq. 2 of evolving-infra §5.1 with given coefficients (what
  agentpool's planner and router fit and predict with; the decode context is ignored, as Eq. 2
  does).
- :class:`NoisyTimes`: any times multiplied by ``1 + sigma * N(0, 1)`` per iteration, never below
  :func:`noise_floor` (so a bound from the noiseless times scaled by it holds for every draw), from
  a generator the driver seeds (no global random state).

The ground truth the simulator runs on by default is :class:`agentpool.node.roofline.Roofline`,
an architecture and GPU roofline model that shares nothing with Eq. 1-4.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from agentpool.models import DecodeModel, PrefillBatchItem, PrefillModel


class IterationTimes(Protocol):
    """Seconds one iteration takes on a node."""

    def prefill_s(self, batch: Sequence[PrefillBatchItem]) -> float:
        """A prefill iteration over ``batch`` (chunks: uncached, cached-before, restored tokens)."""
        ...

    def decode_s(self, running: int, context_tokens: float) -> float:
        """A decode iteration of ``running`` requests holding ``context_tokens`` KV tokens in all."""
        ...


NOISE_FLOOR_SIGMAS = 4.0  # a noisy iteration takes at least 1 - 4 sigma of its noiseless time


def noise_floor(sigma: float) -> float:
    """The smallest factor :class:`NoisyTimes` applies for ``sigma``: ``1 - 4 sigma``, at least 0.1."""
    return max(0.1, 1.0 - NOISE_FLOOR_SIGMAS * sigma)


@dataclass(frozen=True, slots=True)
class EquationTimes:
    """Eq. 1 and Eq. 2: the model agentpool fits (context-blind)."""

    prefill: PrefillModel
    decode: DecodeModel

    def prefill_s(self, batch: Sequence[PrefillBatchItem]) -> float:
        return self.prefill.iteration_time(batch)

    def decode_s(self, running: int, context_tokens: float) -> float:
        del context_tokens
        return self.decode.iteration_time(running)


class NoisyTimes:
    """``base`` times ``max(noise_floor(sigma), 1 + sigma * N(0, 1))``, one draw per iteration asked.

    The normal draws come from ``rng`` in blocks of :attr:`BLOCK` (one call per block instead of
    one per iteration): a numpy ``Generator`` gives the same sequence either way."""

    __slots__ = ("_draws", "_floor", "_rng", "base", "sigma")
    BLOCK = 512

    def __init__(self, base: IterationTimes, sigma: float, rng: np.random.Generator) -> None:
        if not 0.0 <= sigma < 1.0:
            raise ValueError(f"noise sigma must be in [0, 1), got {sigma}")
        self.base = base
        self.sigma = sigma
        self._floor = noise_floor(sigma)
        self._rng = rng
        self._draws: list[float] = []  # drawn, not used yet (last one first)

    def _factor(self) -> float:
        if not self.sigma:
            return 1.0
        draws = self._draws
        if not draws:
            draws.extend(reversed(self._rng.standard_normal(self.BLOCK).tolist()))
        return max(self._floor, 1.0 + self.sigma * draws.pop())

    def prefill_s(self, batch: Sequence[PrefillBatchItem]) -> float:
        return self.base.prefill_s(batch) * self._factor()

    def decode_s(self, running: int, context_tokens: float) -> float:
        return self.base.decode_s(running, context_tokens) * self._factor()
