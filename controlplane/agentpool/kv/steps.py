"""Stepwise operations of the core: generators that yield between steps of a few hundred blocks, so a
shell can serve other work in between (``agentpool.directory.steps.run_steps``); :func:`drain` runs
one to its end at once (the simulator, tests, small inputs)."""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

R = TypeVar("R")

STEP_BLOCKS = 256  # blocks per step of the stepwise resync and purge (a few hundred microseconds)


def drain(steps: Generator[None, None, R]) -> R:
    """Run a stepwise operation to its end at once; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: R = done.value
            return result
