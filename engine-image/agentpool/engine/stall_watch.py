"""Requests whose event streams went silent: logged with what each one waits for.

A router gives up on an engine stream that sends nothing for its first-event or between-event
timeout (120 s, 30 s by default) and the client sees ``generation failed: ... timed out``; by then
the engine has long forgotten why. :class:`StallWatch` looks at the engine's open streams every
``check_s`` and logs a warning for each one silent for ``threshold_s`` or longer
(``queued_threshold_s`` while it is queued or prefilling, which under load takes long normally),
again each time its silence doubles, and once more when it speaks again, naming the request and, from the
backend's ``describe``, what it waits for: its place in the queue, a prefix fetch, the KV hand-over
from a peer and how long the NIXL thread has been busy, its decode progress, the driver loop. It also
says when the event loop itself ran nothing for ``threshold_s`` (its own sleep came back that late).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentpool.engine.jobs import EventStream, Job, JobState

if TYPE_CHECKING:
    from agentpool.engine.simstate import SimBackendState

log = logging.getLogger(__name__)
_QUEUED = (JobState.QUEUED, JobState.PREFILL)


@dataclass(slots=True)
class StallWatch:
    streams: Callable[[], Iterable[EventStream]]
    """The open streams (the backend's jobs)."""
    describe: Callable[[EventStream, float], str]
    """What a stream waits for, in words, at ``now`` (the watch's clock)."""
    threshold_s: float = 10.0
    queued_threshold_s: float = 60.0
    """For a request still queued or prefilling: under load a long prompt waits that long normally."""
    check_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    _reported: dict[int, tuple[EventStream, float]] = field(default_factory=dict)
    """id(stream) -> (stream, the silence last reported)."""

    def check(self) -> list[str]:
        """The lines to log now (also marks what was reported)."""
        now = self.clock()
        out: list[str] = []
        seen: set[int] = set()
        for s in self.streams():
            key = id(s)
            seen.add(key)
            silent = now - s.last_event_at
            last = self._reported.get(key)
            if last is not None and silent < last[1]:  # it spoke since it was reported
                out.append(f"request {s.request_id} ({s.phase}) streams again after a stall")
                del self._reported[key]
                last = None
            first = self.queued_threshold_s if s.state in _QUEUED else self.threshold_s
            due = first if last is None else 2 * last[1]
            if silent >= due:
                self._reported[key] = (s, silent)
                out.append(
                    f"request {s.request_id} ({s.phase}, {s.state.value}) has sent nothing for "
                    f"{silent:.1f} s: {self.describe(s, now)}"
                )
        for key in [k for k in self._reported if k not in seen]:
            s, _ = self._reported.pop(key)
            out.append(f"request {s.request_id} ({s.phase}) ended after a stall ({s.state.value})")
        return out

    def lagged(self, slept_s: float) -> str | None:
        """A line when a sleep of ``check_s`` took ``slept_s``, over ``threshold_s`` longer: the event
        loop ran nothing meanwhile (blocked by a call, or the process got no CPU)."""
        late = slept_s - self.check_s
        if late < self.threshold_s:
            return None
        took = f"a {self.check_s:g} s sleep took {slept_s:.1f} s"
        return f"the event loop ran nothing for {late:.1f} s ({took})"

    async def run(self) -> None:
        while True:
            t0 = self.clock()
            await asyncio.sleep(self.check_s)
            lag = self.lagged(self.clock() - t0)
            if lag is not None:
                log.warning("%s", lag)
            for line in self.check():
                log.warning("%s", line)


def sim_wait(b: SimBackendState, s: EventStream, now: float) -> str:
    """What the ``sim`` backend's request ``s`` waits for, and the node's state, in words."""
    parts = []
    if s.waiting_for:
        parts.append(f"waiting for {s.waiting_for} for {now - s.waiting_since:.1f} s")
    node = b.node
    if isinstance(s, Job):
        r = s.req
        if s.state is JobState.QUEUED:
            where = next((i for i, q in enumerate(node.queue) if q is r), None)
            parts.append(
                f"not in the node's queue of {len(node.queue)}"
                if where is None
                else f"queued at {where + 1} of {len(node.queue)}"
                + (" until its fetch ends" if r.fetch_ready_at == float("inf") else "")
            )
        elif s.state is JobState.PREFILL:
            parts.append(f"prefilled {r.done_uc} of {r.uncached_tokens} uncached tokens")
        elif s.state is JobState.DECODE:
            batch = "in" if r.rid in node.running else "NOT in"
            parts.append(
                f"{s.tokens_sent} of {s.output_tokens} tokens sent, {batch} the decode batch of "
                f"{len(node.running)}"
            )
    nixl = b.fetcher.transport
    busy = "idle" if nixl.busy_since is None else f"busy for {time.monotonic() - nixl.busy_since:.1f} s"
    parts.append(
        f"node {node.role.value} {node.status.value}: queue {len(node.queue)}, prefill batch "
        f"{len(node.batch)}, decoding {len(node.running)}, KV arriving {node.joining}, decode iteration "
        f"{b.wall(node.decode_iter_s) * 1e3:.1f} ms; driver loop stepped {now - b.last_step_at:.1f} s ago, "
        f"next in {b.wall(node.wake_time() - b.now()):.2f} s; NIXL thread {busy}, "
        f"{nixl.pending} reads pending"
    )
    return "; ".join(parts)
