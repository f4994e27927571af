"""Several systems of one comparison at once, one worker process each, with one progress line.

Every run is deterministic and shares nothing with the others, so running them in separate processes
gives exactly the results of running them one after the other (a test checks it); only the wall time
changes. Workers come from a fork server where the platform has one (else they are spawned): a plain
fork would copy whatever threads and locks the caller holds (a test process has gRPC threads). Each
worker receives the loaded conversations once, when it starts (about 150 MB pickled for the bundled
sample, about a second), and keeps them for the runs it is given. Progress goes through a queue that
the parent draws as one line on stderr.
"""

from __future__ import annotations

import multiprocessing
import queue
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from contextlib import ExitStack
from typing import Any, Protocol

from agentpool.sim.run import Scenario, run_system
from agentpool.sim.trace import Conversation

_REDRAW_S = 0.25  # seconds between redraws of the progress line


class ProgressQueue(Protocol):
    def put(self, item: tuple[str, float]) -> None: ...

    def get(self, block: bool = True, timeout: float | None = None) -> tuple[str, float]: ...


class _Worker:
    """What a worker process keeps between runs: the conversations it was started with."""

    conversations: Sequence[Conversation] | None = None


def _start_worker(conversations: Sequence[Conversation] | None) -> None:
    _Worker.conversations = conversations


def _run_reporting(name: str, sc: Scenario, progress: ProgressQueue | None) -> dict[str, Any]:
    """Worker: one run on the worker's conversations, its progress put on ``progress`` as
    ``(name, fraction)``."""
    conversations = _Worker.conversations
    report: Callable[[float], None] | None = None
    if progress is not None:
        sink = progress

        def report(fraction: float) -> None:
            sink.put((name, fraction))

    return run_system(name, sc, conversations, progress=report)


class ProgressLine:
    """``name NN% | name NN% | ...`` and the elapsed time, redrawn in place on stderr."""

    def __init__(self, names: Sequence[str], quiet: bool) -> None:
        self.fractions = dict.fromkeys(names, 0.0)
        self.quiet = quiet
        self.start = time.perf_counter()

    def update(self, name: str, fraction: float) -> None:
        self.fractions[name] = max(self.fractions[name], min(1.0, fraction))

    def draw(self) -> None:
        if self.quiet:
            return
        parts = " | ".join(f"{n} {f:4.0%}" for n, f in self.fractions.items())
        sys.stderr.write(f"\r{parts}  {time.perf_counter() - self.start:6.1f}s")
        sys.stderr.flush()

    def done(self) -> None:
        if not self.quiet:
            self.draw()
            sys.stderr.write("\n")


def run_parallel(
    sc: Scenario,
    names: Sequence[str],
    conversations: Sequence[Conversation] | None,
    jobs: int,
    quiet: bool = True,
) -> list[dict[str, Any]]:
    """The results of ``run_system(name, sc, conversations)`` for every name, in ``names``' order, with
    up to ``jobs`` runs at once. A failed run raises its error here once the others are cancelled."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    server = "forkserver" in multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if server else "spawn")
    line = ProgressLine(names, quiet)
    with ExitStack() as stack:
        progress: ProgressQueue | None = None
        if not quiet:
            progress = stack.enter_context(context.Manager()).Queue()
        pool = stack.enter_context(
            ProcessPoolExecutor(
                max_workers=min(jobs, len(names)),
                mp_context=context,
                initializer=_start_worker,
                initargs=(conversations,),
            )
        )
        futures = [pool.submit(_run_reporting, name, sc, progress) for name in names]
        try:
            _follow(futures, progress, line)
            results = [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    for name in names:
        line.update(name, 1.0)
    line.done()
    return results


def _follow(
    futures: list[Future[dict[str, Any]]], progress: ProgressQueue | None, line: ProgressLine
) -> None:
    """Redraw the progress line until every run has finished (or one failed)."""
    if progress is None:
        wait(futures, return_when=FIRST_EXCEPTION)
        return
    while not all(f.done() for f in futures):
        if any(f.done() and f.exception() is not None for f in futures):
            return
        deadline = time.monotonic() + _REDRAW_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                name, fraction = progress.get(timeout=left)
            except queue.Empty:
                break
            line.update(name, fraction)
        line.draw()
