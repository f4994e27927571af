"""Replay of agent conversations into the simulator, like the papers do.

- Closed loop (evolving-infra §6.1): a fixed number of concurrent agents; a finished conversation is
  replaced by the next one. A schedule of workload periods can change the target mix over time (§6.3: 288
  Putnam, then 144 Putnam + 72 OSWorld, then 144 OSWorld): a workload above its new target is not
  replaced until it falls below it.
- Open loop (App. D.3): agents arrive in a Poisson process; at most ``max_agents`` run at once and
  the rest wait for admission, which counts toward the TTFT of their first request.

Within a conversation a request is sent when the request it depends on has completed and its
recorded pause has elapsed (optionally capped at ``max_pause_s``: the Claude Code sample's mean pause
is 189 s, median 11 s, with 6.5% of pauses above 5 min); output lengths are the recorded ones.
Sources cycle: when a list of conversations is exhausted it starts over, and every replayed instance
gets fresh block keys.
"""

from __future__ import annotations

import functools
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from agentpool.node import Request
from agentpool.sim.bounds import ActiveConversation, ReplayState
from agentpool.sim.simulator import Issue, Simulator
from agentpool.sim.trace import Conversation

ConversationSource = Callable[[], Conversation]


def cycle(conversations: Sequence[Conversation], seed: int | None = None) -> ConversationSource:
    """A source that hands out ``conversations``, starting over at the end: in the given order
    without ``seed``, else in a fresh order drawn from ``seed`` for every pass."""
    if not conversations:
        raise ValueError("no conversations to replay")
    if seed is None:
        it: Iterator[Conversation] = itertools.cycle(conversations)
    else:
        it = _shuffled_passes(conversations, np.random.default_rng(seed))
    return lambda: next(it)


def _shuffled_passes(
    conversations: Sequence[Conversation], rng: np.random.Generator
) -> Iterator[Conversation]:
    while True:
        for i in rng.permutation(len(conversations)):
            yield conversations[int(i)]


@dataclass(slots=True)
class _Instance:
    conv: Conversation
    instance: int
    workload: str
    arrived_at: float
    remaining: int
    started: bool = False
    prev_tokens: dict[int, int] = field(default_factory=dict)  # agent -> input + output of its last turn
    keys: dict[int, int] = field(default_factory=dict)  # its block keys, one int object per value
    issued_at: dict[int, float] = field(default_factory=dict)  # request -> when issued (or scheduled)
    done_at: dict[int, float] = field(default_factory=dict)  # request -> when done


@dataclass(frozen=True, slots=True)
class WorkloadPeriod:
    """From ``start_s`` on, keep ``concurrency[workload]`` agents of each workload running."""

    start_s: float
    concurrency: Mapping[str, int]


class Replay:
    """Feeds conversations into a simulator and reacts to completed requests."""

    def __init__(
        self,
        sim: Simulator,
        sources: Mapping[str, ConversationSource],
        shared_prefix_blocks: int = 0,
        group: int = 1,
        max_pause_s: float | None = None,
    ) -> None:
        self.sim = sim
        self.sources = dict(sources)
        self.shared_prefix_blocks = shared_prefix_blocks
        self.group = group
        self.max_pause_s = max_pause_s
        self._next_instance = 1
        self._next_rid = 0
        self._shared_keys: dict[int, int] = {}  # block keys of the instances that share a key space
        self.active: dict[str, int] = dict.fromkeys(self.sources, 0)
        self.target: dict[str, int] = dict.fromkeys(self.sources, 0)
        self.closed = True
        self.max_agents = 0
        self._waiting: deque[_Instance] = deque()
        self.agents_started = 0
        self.agents_finished = 0
        self._in_progress: dict[int, _Instance] = {}  # instance number -> conversation in progress

    # -- closed loop --------------------------------------------------------------------------
    def closed_loop(self, periods: Sequence[WorkloadPeriod], ramp_s: float = 0.0) -> None:
        """Run ``periods``; with ``ramp_s`` > 0 the first period's agents start evenly over ``ramp_s``."""
        if ramp_s < 0:
            raise ValueError(f"ramp must be >= 0 s, got {ramp_s}")
        if not periods or periods[0].start_s != 0.0:
            raise ValueError("a closed-loop schedule starts with a period at 0 s")
        for ph in periods:
            unknown = set(ph.concurrency) - set(self.sources)
            if unknown:
                raise ValueError(f"period at {ph.start_s} s names unknown workloads {sorted(unknown)}")
        self.closed = True
        first, *rest = periods
        if ramp_s > 0:
            for w, count in first.concurrency.items():
                for k in range(1, count + 1):
                    self.sim.call_at((k - 1) * ramp_s / count, functools.partial(self._raise_target, w, k))
        else:
            self.sim.call_at(0.0, functools.partial(self._enter_period, first))
        for ph in rest:
            self.sim.call_at(ph.start_s, functools.partial(self._enter_period, ph))

    def state(self, now: float) -> ReplayState:
        """The closed loop's state at ``now`` (what a window bound starts from: ``agentpool.sim.bounds``):
        the conversations taken from the sources so far and those in progress."""
        if not self.closed:
            raise ValueError("only a closed loop has a replay state to bound")
        active = tuple(
            ActiveConversation(
                inst.conv,
                dict(inst.done_at),
                {i: t for i, t in inst.issued_at.items() if i not in inst.done_at},
            )
            for inst in self._in_progress.values()
        )
        return ReplayState(now, self._next_instance - 1, active)

    def _raise_target(self, workload: str, target: int, now: float) -> None:
        self.target[workload] = max(self.target[workload], target)
        self._fill(now)

    def _enter_period(self, ph: WorkloadPeriod, now: float) -> None:
        self.target = {w: ph.concurrency.get(w, 0) for w in self.sources}
        self._fill(now)

    def _fill(self, now: float) -> None:
        for w in sorted(self.sources):
            while self.active[w] < self.target[w]:
                self._start(w, now, now)

    # -- open loop ----------------------------------------------------------------------------
    def open_loop(
        self, workload: str, agents_per_min: float, max_agents: int, until_s: float, seed: int
    ) -> None:
        if agents_per_min <= 0 or max_agents <= 0:
            raise ValueError("arrival rate and max agents must be positive")
        self.closed = False
        self.max_agents = max_agents
        rng = np.random.default_rng(seed)
        t = 0.0
        while True:
            t += float(rng.exponential(60.0 / agents_per_min))
            if t >= until_s:
                break
            self.sim.call_at(t, functools.partial(self._arrive, workload))

    def timed(self, workload: str, arrivals: Sequence[tuple[float, Conversation]], until_s: float) -> None:
        """Start each conversation at its recorded arrival time (Mooncake: one request each)."""
        self.closed = False
        self.max_agents = 1 << 30
        self.active.setdefault(workload, 0)
        for at, conv in arrivals:
            if at < until_s:
                self.sim.call_at(at, functools.partial(self._arrive_given, workload, conv))

    def _arrive_given(self, workload: str, conv: Conversation, now: float) -> None:
        inst = _Instance(conv, self._next_instance, workload, now, len(conv.requests))
        self._next_instance += 1
        self._launch(inst, now)

    def _arrive(self, workload: str, now: float) -> None:
        inst = self._instance(workload, now)
        if sum(self.active.values()) < self.max_agents:
            self._launch(inst, now)
        else:
            self._waiting.append(inst)

    # -- conversations ------------------------------------------------------------------------
    def _instance(self, workload: str, now: float) -> _Instance:
        conv = self.sources[workload]()
        inst = _Instance(conv, self._next_instance, workload, now, len(conv.requests))
        self._next_instance += 1
        return inst

    def _start(self, workload: str, now: float, arrived: float) -> None:
        inst = self._instance(workload, arrived)
        self._launch(inst, now)

    def _launch(self, inst: _Instance, now: float) -> None:
        self.active[inst.workload] += 1
        self.agents_started += 1
        self._in_progress[inst.instance] = inst
        inst.started = True
        for i in inst.conv.roots:
            delay = self._pause(inst.conv.requests[i].delay_s) if i else 0.0
            self._issue(inst, i, now + delay, arrived=inst.arrived_at if not self.closed and i == 0 else None)

    def _pause(self, recorded_s: float) -> float:
        return recorded_s if self.max_pause_s is None else min(recorded_s, self.max_pause_s)

    def _issue(self, inst: _Instance, i: int, at: float, arrived: float | None = None) -> None:
        tr = inst.conv.requests[i]
        instance = 1 if inst.conv.kind == "mooncake" else inst.instance
        shared = 0 if inst.conv.kind == "mooncake" else self.shared_prefix_blocks
        blocks, produced = inst.conv.block_keys(i, instance, shared, self.group)
        # Every request of an instance names a block by the same int object (not an equal new
        # one): the KV tables then find it by identity, without reading a stored key object
        keys = self._shared_keys if inst.conv.kind == "mooncake" else inst.keys
        blocks = list(map(keys.setdefault, blocks, blocks))
        produced = list(map(keys.setdefault, produced, produced))
        self._next_rid += 1
        req = Request(
            rid=self._next_rid,
            input_tokens=tr.input_tokens,
            output_tokens=tr.output_tokens,
            blocks=blocks,
            produced=produced,
            branch=f"{inst.instance}.{tr.agent}",
            issued_at=at if arrived is None else arrived,
        )
        prev = inst.prev_tokens.get(tr.agent)
        new_turn = tr.input_tokens if prev is None else max(0, tr.input_tokens - prev)
        inst.prev_tokens[tr.agent] = tr.input_tokens + tr.output_tokens
        issue = Issue(
            req=req,
            turn=tr.turn,
            new_turn_tokens=new_turn,
            last_of_branch=tr.last_of_agent,
            on_done=functools.partial(self._done, inst, i),
        )
        self.sim.metrics.issued += 1
        inst.issued_at[i] = at
        self.sim.issue_at(at, issue)

    def _done(self, inst: _Instance, i: int, req: Request, now: float) -> None:
        del req
        inst.done_at[i] = now
        for j in inst.conv.children[i]:
            self._issue(inst, j, now + self._pause(inst.conv.requests[j].delay_s))
        inst.remaining -= 1
        if inst.remaining == 0:
            del self._in_progress[inst.instance]
            self.active[inst.workload] -= 1
            self.agents_finished += 1
            if self.closed:
                self._fill(now)
            elif self._waiting and sum(self.active.values()) < self.max_agents:
                self._launch(self._waiting.popleft(), now)
