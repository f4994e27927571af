"""Run the core's stepwise operations (big resyncs, node purges) without blocking the event loop.

The core (``agentpool.kv``) offers them as generators that yield between steps of some dozens of
blocks; :func:`run_steps` runs steps until a time slice is used up, then lets the loop serve other
RPCs (``asyncio.sleep(0)``) and goes on. The work stays on the loop's thread, so the core is never
touched by two threads at once; callers keep conflicting changes of the same node out (a per-node lock
in the service).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Generator
from typing import Any, TypeVar

R = TypeVar("R")
log = logging.getLogger(__name__)

SLICE_S = 0.001  # longest run of steps between two turns of the event loop
PAUSE_S = 0.001  # then the loop waits this long: gRPC's poller thread gets the GIL and hands in RPCs


async def run_steps(steps: Generator[None, None, R], slice_s: float = SLICE_S, pause_s: float = PAUSE_S) -> R:
    start = time.perf_counter()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: R = done.value
            return result
        if time.perf_counter() - start >= slice_s:
            await asyncio.sleep(pause_s)
            start = time.perf_counter()


def settled(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a task whose caller may have gone (no "never retrieved" warning); the
    caller, if still there, gets the error itself."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("background directory work failed: %s", task.exception())
