"""The dynamo-like planner: Dynamo's load-based planner on a fixed pool of nodes.

Follows what Dynamo's load-based planner documents (ai-dynamo/dynamo, ``docs/architecture/
load_planner.md``; read, not copied): every ``pull_s`` (1 s) it samples the prefill queue (pending
prefill requests per prefill worker) and the decode workers' mean KV-cache utilization; every
``interval_s`` (30 s) it compares the interval's means with thresholds (KV: scale up above 0.9;
queue: scale up above 0.5) and changes the worker count by one at most. Sampling and adjusting
stop while workers change. Two rules against over-correction: no decode scale-down for
``grace_intervals`` (3) intervals after a decode worker was added, and no prefill scale-up if the
queue's trend over the last interval would bring it under the threshold within ``trend_intervals``
(3) intervals.

On a fixed pool (the paper's nine nodes) adding a worker of one phase means relaunching a worker of
the other, so KV pressure moves a prefill node to decode and a long prefill queue moves a decode
node to prefill (a decode scale-down, held back by the grace period). Relaunches take the preset's
``relaunch_s`` and drop the node's KV (``SwitchMode.RELAUNCH``). High decode KV use therefore
drifts the split toward decode, as evolving-infra §3.2 measures.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentpool.node import Node, Role
from agentpool.sim.simulator import Simulator


@dataclass(frozen=True, slots=True)
class DynamoSettings:
    interval_s: float = 30.0
    pull_s: float = 1.0
    kv_scale_up: float = 0.9
    queue_scale_up: float = 0.5
    grace_intervals: int = 3
    trend_intervals: int = 3


class DynamoLoadPlanner:
    def __init__(self, sim: Simulator, s: DynamoSettings) -> None:
        self.sim = sim
        self.s = s
        self.kv: list[float] = []
        self.queue: list[float] = []
        self.last_queue: float | None = None
        self.grace = 0

    def _phases(self) -> tuple[list[Node], list[Node]] | None:
        if self.sim.switching:  # blocked while workers change
            return None
        prefill = [n for n in self.sim.nodes if n.role is Role.PREFILL]
        decode = [n for n in self.sim.nodes if n.role is Role.DECODE]
        return (prefill, decode) if prefill and decode else None

    def sample(self, now: float) -> None:
        del now
        phases = self._phases()
        if phases is None:
            return
        prefill, decode = phases
        self.kv.append(sum(n.kv_used_tokens / n.kv_capacity_tokens for n in decode) / len(decode))
        self.queue.append(sum(self.sim.queued[n.index].requests for n in prefill) / len(prefill))

    def tick(self, now: float) -> None:
        phases = self._phases()
        if phases is None:
            self.kv.clear()
            self.queue.clear()
            return
        if not self.kv:
            self.sample(now)
        prefill, decode = phases
        kv = sum(self.kv) / len(self.kv)
        queue = sum(self.queue) / len(self.queue)
        trend = 0.0 if self.last_queue is None else queue - self.last_queue
        self.kv.clear()
        self.queue.clear()
        self.last_queue = queue
        s = self.s
        if kv > s.kv_scale_up and len(prefill) > 1:
            mover = min(prefill, key=lambda n: (self.sim.queued[n.index].requests, n.name))
            self.sim.begin_switch(mover.index, Role.DECODE)
            self.grace = s.grace_intervals
            return
        falling_below = queue + s.trend_intervals * trend < s.queue_scale_up
        if queue > s.queue_scale_up and len(decode) > 1 and not falling_below and self.grace == 0:
            mover = min(decode, key=lambda n: (len(n.running), n.name))
            self.sim.begin_switch(mover.index, Role.PREFILL)
        self.grace = max(0, self.grace - 1)
