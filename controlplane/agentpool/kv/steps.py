"""Stepwise operations of the core: generators that yield between steps of some dozens of blocks, so a
shell can serve other work in between (``agentpool.directory.steps.run_steps``); :func:`drain` runs
one to its end at once (the simulator, tests, small inputs)."""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

R = TypeVar("R")

# blocks per step of the stepwise resync and purge (about 50 us): a step that also grows (rebuilds)
# some of the index's shard tables takes milliseconds, and smaller steps put fewer of those rebuilds
# into one step (1M-block resync in process, interleaved: steps over 2 ms of CPU 4-7 with 256-block
# steps, 0-2 with 64; bench/results/bench_directory.md)
STEP_BLOCKS = 64


def drain(steps: Generator[None, None, R]) -> R:
    """Run a stepwise operation to its end at once; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: R = done.value
            return result
