"""An analytic upper bound on closed-loop throughput from the ground truth.

A closed loop keeps ``N`` agents busy; each runs conversations back to back (the replay hands
them out in a seeded order, every conversation once per pass). A conversation cannot take less
than ``D_min``: the critical path through its dependency graph of recorded pauses (capped as the
replay caps them) and each request's minimal response time ``R_min`` on an idle node with every
reusable prefix cached:

    R_min = T_P(uncached tokens no other request of the conversation or the shared prefix holds)
            + ceil((output - 1) / t_acc) * T_D(1 running, its prompt as context)
    X <= N * E[requests per conversation] / E[D_min]

(Little's law over conversations: N = X_conv * E[D], X = X_conv * E[n], and D >= D_min.) Times come
from the noiseless truth scaled by the noise's floor (:func:`agentpool.node.timing.noise_floor`:
a noisy iteration is never faster than that), so no draw can beat the bound.

That bounds the long-run average, not a measurement window shortly after a common start (short
conversations are over-represented there). For a window ``[s, e)`` each run gets its own bound,
from its replay's state at ``s`` (:class:`ReplayState`: the conversations in progress, which of
their requests are done and when each other one was issued or scheduled). From there on every
request takes ``R_min`` with no queueing: a request in flight ends at ``max(s, issued + R_min)``,
one not yet issued ``R_min`` after its dependency's end and its pause, an agent is free when its
conversation's last request ends (an agent the ramp has not started yet, when it starts), and each
free agent takes the next conversation of the same seeded order (the *ideal continuation*). The
requests it completes before ``e`` bound the run's in the window: no request of the run is faster
than that, so each of its agents is free no earlier, and handing the k-th conversation to the
first free agent keeps that order (removing the smallest of a set of free times and adding it
back plus a duration leaves the sorted free times no smaller, element by element), so every
conversation starts, and every request ends, no earlier than in the continuation.

The *ideal replay* (the same from time 0, every agent started as the ramp starts it) is the
continuation of an empty state: its count in the window is reported as a reference for every run,
not a bound (a run behind it before the window can complete more inside it). Open-loop and phased
(shifting) runs get no bound here.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import takewhile

from agentpool.models import PrefillBatchItem
from agentpool.node.timing import IterationTimes, noise_floor
from agentpool.sim.trace import Conversation


@dataclass(frozen=True, slots=True)
class ActiveConversation:
    """A conversation in progress at the window's start: its done requests (when) and those issued
    or scheduled but not done (when they were, or will be, issued)."""

    conv: Conversation
    done_at: Mapping[int, float]
    issued_at: Mapping[int, float]


@dataclass(frozen=True, slots=True)
class ReplayState:
    """A closed-loop replay at ``at_s``: how many conversations it took from its order, and those in
    progress (one per started agent)."""

    at_s: float
    handed_out: int
    active: tuple[ActiveConversation, ...]


@dataclass(frozen=True, slots=True)
class ClosedLoopBound:
    little_rps: float  # long-run Little bound
    agents: int
    mean_requests: float  # per conversation
    mean_min_duration_s: float  # E[D_min]
    mean_min_response_s: float  # E[R_min] per request
    window_s: tuple[float, float] | None = None  # the measured [s, e), where the bound is per run
    ideal_window_rps: float | None = None  # the ideal replay's rate in the window: a reference
    max_pause_s: float | None = None
    ramp_s: float = 0.0
    responses: Mapping[int, Sequence[float]] = field(default_factory=dict, repr=False)  # id(conv): R_min

    @property
    def reference_rps(self) -> float:
        """The run-independent figure: the ideal replay's rate in the window, else Little's bound."""
        return self.little_rps if self.ideal_window_rps is None else self.ideal_window_rps

    def for_run(self, state: ReplayState, order: Iterator[Conversation]) -> float:
        """The bound on the window throughput of a run whose replay was in ``state`` at the window's
        start; ``order`` is the replay's conversation order from its beginning (a fresh iterator)."""
        if self.window_s is None:
            return self.little_rps
        start, end = self.window_s
        if state.at_s != start:
            raise ValueError(f"the replay's state is at {state.at_s} s, the window starts at {start} s")
        if len(state.active) > self.agents:
            raise ValueError(f"{len(state.active)} conversations in progress for {self.agents} agents")
        for _ in range(state.handed_out):  # the continuation takes the conversations after those
            next(order)
        counted = 0
        free: list[float] = []
        for active in state.active:
            ends = _lower_bound_ends(active, self.responses[id(active.conv)], self.max_pause_s, start)
            counted += sum(start <= t < end for t in ends)
            free.append(max(ends, default=start))
        # the agents the ramp has not started yet: agent k starts at k * ramp / agents
        later = range(len(state.active), self.agents)
        free.extend(max(start, k * self.ramp_s / self.agents) for k in later)
        counted += _greedy_replay(order, self.responses, free, self.max_pause_s, start, end)[1]
        return counted / (end - start)

    def as_dict(self) -> dict[str, float | None]:
        return {
            "little_rps": self.little_rps,
            "ideal_window_rps": self.ideal_window_rps,
            "window_start_s": None if self.window_s is None else self.window_s[0],
            "window_end_s": None if self.window_s is None else self.window_s[1],
            "agents": float(self.agents),
            "mean_requests_per_conversation": self.mean_requests,
            "mean_min_conversation_s": self.mean_min_duration_s,
            "mean_min_response_s": self.mean_min_response_s,
        }


def _lower_bound_ends(
    active: ActiveConversation, responses: Sequence[float], max_pause_s: float | None, start_s: float
) -> list[float]:
    """The earliest each request of ``active`` can end (its recorded end where it ended)."""
    ends: list[float] = []
    for i, r in enumerate(active.conv.requests):  # requests depend only on earlier ones
        if i in active.done_at:
            ends.append(active.done_at[i])
        elif i in active.issued_at:
            ends.append(max(start_s, active.issued_at[i] + responses[i]))
        elif r.depends_on >= 0:
            ends.append(ends[r.depends_on] + _pause(active.conv, i, max_pause_s) + responses[i])
        else:
            raise ValueError(f"{active.conv.name}: root request {i} was never issued")
    return ends


def _pause(conv: Conversation, i: int, max_pause_s: float | None) -> float:
    d = conv.requests[i].delay_s
    return d if max_pause_s is None else min(d, max_pause_s)


def _root_delay(conv: Conversation, i: int, max_pause_s: float | None) -> float:
    """When root request ``i`` is issued after its conversation starts (the first one at once)."""
    return _pause(conv, i, max_pause_s) if i else 0.0


def min_responses(
    conv: Conversation, truth: IterationTimes, t_acc: float, shared_blocks: int, group: int, block: int
) -> list[float]:
    """``R_min`` of each request of ``conv`` (see the module docstring)."""
    keys = [conv.block_keys(i, 1, shared_blocks, group) for i in range(len(conv.requests))]
    owners: Counter[int] = Counter()  # block -> how many of the requests hold it (prompt or output)
    for prompt, produced in keys:
        owners.update(set(prompt).union(produced))
    # a block of a request's prompt is held by another request where two or more hold it
    held = set(range(1, shared_blocks + 1))
    held.update(k for k, holders in owners.items() if holders > 1)
    out = []
    for (prompt, _), r in zip(keys, conv.requests, strict=True):
        # the longest prefix that the shared prefix or another request holds
        cached = len(list(takewhile(held.__contains__, prompt)))
        uncached = max(1, r.input_tokens - min(cached * block, r.input_tokens - 1))
        prefill = truth.prefill_s([PrefillBatchItem(float(uncached), float(r.input_tokens - uncached))])
        iterations = math.ceil(max(0, r.output_tokens - 1) / t_acc - 1e-9)
        decode = iterations * truth.decode_s(1, float(r.input_tokens)) if iterations else 0.0
        out.append(prefill + decode)
    return out


def min_duration(conv: Conversation, responses: Sequence[float], max_pause_s: float | None) -> float:
    """The critical path of ``conv``: pauses (capped at ``max_pause_s``) and minimal responses (the
    ends of a conversation started at 0 with nothing done yet)."""
    started = ActiveConversation(conv, {}, {i: _root_delay(conv, i, max_pause_s) for i in conv.roots})
    return max(_lower_bound_ends(started, responses, max_pause_s, 0.0), default=0.0)


def closed_loop_bound(
    conversations: Sequence[Conversation],
    agents: int,
    truth: IterationTimes,
    noise: float,
    *,
    t_acc: float,
    shared_blocks: int,
    group: int,
    block: int,
    max_pause_s: float | None,
    order: Iterator[Conversation] | None = None,
    window: tuple[float, float] | None = None,
    ramp_s: float = 0.0,
) -> ClosedLoopBound:
    """The bound for ``agents`` agents; with ``order`` (the replay's conversation order) and
    ``window`` (its measured ``[start, end)``) each run's window bound (:meth:`ClosedLoopBound.for_run`)
    and the ideal replay's rate in the window, agents started over ``ramp_s`` as the replay starts them."""
    if not conversations or agents <= 0:
        raise ValueError("a bound needs conversations and agents")
    scale = noise_floor(noise)
    n_total = 0
    d_total = 0.0
    r_total = 0.0
    responses: dict[int, list[float]] = {}
    for conv in conversations:
        rs = [scale * r for r in min_responses(conv, truth, t_acc, shared_blocks, group, block)]
        responses[id(conv)] = rs
        n_total += len(rs)
        r_total += sum(rs)
        d_total += min_duration(conv, rs, max_pause_s)
    n = len(conversations)
    mean_n, mean_d = n_total / n, d_total / n
    little = agents * mean_n / mean_d
    stats = (agents, mean_n, mean_d, r_total / max(1, n_total))
    if order is None or window is None:
        return ClosedLoopBound(little, *stats)
    start, end = window
    if not 0 <= start < end:
        raise ValueError(f"a window needs 0 <= start < end, got [{start}, {end})")
    inside = ideal_replay_count(order, responses, agents, max_pause_s, start, end, ramp_s)[1]
    return ClosedLoopBound(
        little, *stats, window, inside / (end - start), max_pause_s, ramp_s, responses=responses
    )


def ideal_replay_count(
    order: Iterator[Conversation],
    responses: Mapping[int, Sequence[float]],
    agents: int,
    max_pause_s: float | None,
    start_s: float,
    end_s: float,
    ramp_s: float = 0.0,
) -> tuple[int, int]:
    """Requests the ideal replay completes before ``start_s`` and in ``[start_s, end_s)``:
    ``agents`` agents take conversations from ``order`` (the replay's seeded cycle) back to back,
    agent ``k`` from ``k * ramp_s / agents`` (all at 0 without a ramp), each request taking
    ``responses[id(conversation)][i]``, without queueing."""
    free = [k * ramp_s / agents for k in range(agents)]
    return _greedy_replay(order, responses, free, max_pause_s, start_s, end_s)


def _greedy_replay(
    order: Iterator[Conversation],
    responses: Mapping[int, Sequence[float]],
    free_at: Sequence[float],
    max_pause_s: float | None,
    start_s: float,
    end_s: float,
) -> tuple[int, int]:
    """Requests done before ``start_s`` and in ``[start_s, end_s)`` when agents free at ``free_at``
    take conversations from ``order`` whenever they are free, each request taking its response."""
    # (time, seq, conversation, request, agent); no conversation: the agent is free
    events: list[tuple[float, int, Conversation | None, int, int]] = [
        (t, agent, None, -1, agent) for agent, t in enumerate(free_at)
    ]
    heapq.heapify(events)
    seq = len(events)
    left: dict[int, int] = {}
    before = inside = 0
    while events and events[0][0] < end_s:
        t, _, conv, i, agent = heapq.heappop(events)
        if conv is None:
            conv = next(order)
            left[agent] = len(conv.requests)
            rs = responses[id(conv)]
            for r in conv.roots:
                seq += 1
                heapq.heappush(events, (t + _root_delay(conv, r, max_pause_s) + rs[r], seq, conv, r, agent))
            continue
        if t >= start_s:
            inside += 1
        else:
            before += 1
        rs = responses[id(conv)]
        for j in conv.children[i]:
            seq += 1
            heapq.heappush(events, (t + _pause(conv, j, max_pause_s) + rs[j], seq, conv, j, agent))
        left[agent] -= 1
        if left[agent] == 0:
            seq += 1
            heapq.heappush(events, (t, seq, None, -1, agent))
    return before, inside
