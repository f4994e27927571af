"""The dynamo-like planner: Dynamo's load-based planner on a fixed pool of nodes.

Follows Dynamo's load-based planner (ai-dynamo/dynamo: ``docs/architecture/load_planner.md`` and the
planner component it describes; read, not copied). What it measures, every ``pull_s`` (1 s):

- the prefill load: the requests pending in the prefill queue (all prefill workers together, the
  size of Dynamo's one prefill queue);
- the decode load: each decode worker's KV-cache utilization, plus 0.02 for each request waiting
  for that worker (the planner's estimate of the KV those will take), averaged over the workers.

How it decides, every ``interval_s`` (30 s), on the interval's means: scale-downs first (prefill
if its queue is below ``queue_scale_down``, decode if its KV load is below ``kv_scale_down`` and no
decode worker was added in the last ``grace_intervals``), then scale-ups within the GPU budget
(prefill first, if its queue is above ``queue_scale_up`` and the queue's trend does not bring it
under that within ``trend_intervals`` intervals; then decode, if its KV load is above
``kv_scale_up``). At most one worker per phase and interval; nothing is sampled or decided while a
worker changes.

On a fixed pool (the paper's nine nodes, the budget) every worker is in use, so a scale-up needs a
scale-down first: the node a scale-down frees is relaunched into the other phase (the paper: while
a node relaunches, eight nodes serve). A scale-up signal alone changes nothing. Relaunches take
the preset's ``relaunch_s`` and drop the node's KV (``SwitchMode.RELAUNCH``).

Why it drifts toward decode under high decode KV use (evolving-infra §3.2): the baselines run
SGLang PD disaggregation, whose decode node reserves a request's KV when the request is dispatched,
before its prefill is queued (``SystemConfig.decode_binding = "dispatch"``; App. D.1). With long
agent contexts these reservations keep decode KV use high, so decode is never scaled down, and a
request that finds no decode room waits before the prefill queue, so the prefill queue looks short
and prefill is scaled down: each such interval moves one prefill node to decode.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentpool.node import Node, Role
from agentpool.sim.simulator import Simulator


@dataclass(frozen=True, slots=True)
class DynamoSettings:
    """Dynamo's load planner defaults (``load_planner.md``)."""

    interval_s: float = 30.0
    pull_s: float = 1.0
    kv_scale_up: float = 0.9
    kv_scale_down: float = 0.5
    queue_scale_up: float = 0.5
    queue_scale_down: float = 0.2
    kv_per_waiting: float = 0.02  # KV load the planner adds per request waiting for a decode worker
    grace_intervals: int = 3
    trend_intervals: int = 3

    def __post_init__(self) -> None:
        kv_ok = 0 <= self.kv_scale_down < self.kv_scale_up
        if not (kv_ok and 0 <= self.queue_scale_down < self.queue_scale_up):
            raise ValueError(f"scale-down thresholds must lie below scale-up thresholds: {self}")
        if self.interval_s <= 0 or self.pull_s <= 0:
            raise ValueError(f"intervals must be positive: {self}")


@dataclass(frozen=True, slots=True)
class DynamoSignals:
    """One interval's means and the queue's first and last sample."""

    queue: float
    kv: float
    queue_first: float
    queue_last: float


@dataclass(frozen=True, slots=True)
class DynamoDecision:
    to: Role | None  # the phase one node moves to, or None
    reason: str


def decide(sig: DynamoSignals, prefill: int, decode: int, grace: int, s: DynamoSettings) -> DynamoDecision:
    """What Dynamo's planner does with one interval's signals on a fixed, fully used pool.

    Dynamo's order: prefill scale-down, decode scale-down, then scale-ups, each only with a free
    GPU. The budget is full, so only a scale-down frees one, and the freed node goes to the other
    phase; a scale-up signal alone changes nothing. Both scale-downs at once would relaunch two
    nodes into each other's phase: no change."""
    prefill_down = sig.queue < s.queue_scale_down and prefill > 1
    decode_down = sig.kv < s.kv_scale_down and decode > 1 and grace == 0
    predicted = sig.queue_last + (sig.queue_last - sig.queue_first) * s.trend_intervals
    wants = [
        name
        for name, on in (
            ("prefill down", prefill_down),
            ("decode down", decode_down),
            ("prefill up", sig.queue > s.queue_scale_up and predicted > s.queue_scale_up),
            ("decode up", sig.kv > s.kv_scale_up),
        )
        if on
    ]
    fired = ", ".join(wants) or "within thresholds"
    reason = f"prefill queue {sig.queue:.2f}, decode KV load {sig.kv:.2f}: {fired}"
    if prefill_down != decode_down:
        return DynamoDecision(Role.DECODE if prefill_down else Role.PREFILL, reason)
    return DynamoDecision(None, reason)


class DynamoLoadPlanner:
    def __init__(self, sim: Simulator, s: DynamoSettings) -> None:
        self.sim = sim
        self.s = s
        self.kv: list[float] = []
        self.queue: list[float] = []
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
        waiting = self.sim.admission_waiting / len(decode)  # waiting for decode room, per worker
        used = sum(n.kv_used_tokens / n.kv_capacity_tokens for n in decode) / len(decode)
        self.kv.append(used + self.s.kv_per_waiting * waiting)
        self.queue.append(float(sum(self.sim.queued[n.index].requests for n in prefill)))

    def tick(self, now: float) -> None:
        phases = self._phases()
        if phases is None:
            self.kv.clear()
            self.queue.clear()
            return
        if not self.kv:
            self.sample(now)
        prefill, decode = phases
        sig = DynamoSignals(
            sum(self.queue) / len(self.queue), sum(self.kv) / len(self.kv), self.queue[0], self.queue[-1]
        )
        self.kv.clear()
        self.queue.clear()
        d = decide(sig, len(prefill), len(decode), self.grace, self.s)
        self.grace = max(0, self.grace - 1)
        outcome = "hold" if d.to is None else f"switch to {d.to.value}"
        self.sim.metrics.planner_log.append({"at": now, "outcome": outcome, "reason": d.reason})
        if d.to is Role.DECODE:
            mover = min(prefill, key=lambda n: (self.sim.queued[n.index].requests, n.name))
            self.sim.begin_switch(mover.index, Role.DECODE)
            self.grace = self.s.grace_intervals
        elif d.to is Role.PREFILL:
            mover = min(decode, key=lambda n: (len(n.running), n.name))
            self.sim.begin_switch(mover.index, Role.PREFILL)
