"""An analytic upper bound on closed-loop throughput (Little's law) from the ground truth.

A closed loop keeps ``N`` agents busy; each runs conversations back to back (the replay hands
them out in a seeded order, every conversation once per pass). A conversation cannot take less
than ``D_min``: the critical path through its dependency graph of recorded pauses (capped as the
replay caps them) and each request's minimal response time ``R_min`` on an idle node with every
reusable prefix cached:

    R_min = T_P(uncached tokens no other request of the conversation or the shared prefix holds)
            + ceil((output - 1) / t_acc) * T_D(1 running, its prompt as context)
    X <= N * E[requests per conversation] / E[D_min]

(Little's law over conversations: N = X_conv * E[D], X = X_conv * E[n], and D >= D_min.) Times come
from the noiseless truth and are scaled by ``1 - 4 * noise`` so a fast noisy draw cannot beat the
bound.

That bounds the long-run average. A measurement window shorter than a few conversation lengths is
not the long run (right after a common start, short conversations are over-represented), so the
bound reported for a window is the larger of the Little bound and the *ideal replay*: the same
agents, started when the replay starts them (at once, or evenly over its ramp), running the same
conversations in the same seeded order with every request taking ``R_min``
and no queueing, counted over the same window, plus one request per agent for the requests that
finish inside the window in a real run but before its start in the ideal one. Every request of
a real run ends no earlier than in the ideal replay, so only that edge can put a real run above
the ideal count. Open-loop and phased (shifting) runs get no bound here.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from agentpool.models import PrefillBatchItem
from agentpool.node.timing import IterationTimes
from agentpool.sim.trace import Conversation


@dataclass(frozen=True, slots=True)
class ClosedLoopBound:
    throughput_rps: float  # the bound: the larger of the two below
    little_rps: float  # long-run Little bound
    ideal_window_rps: float | None  # the ideal replay over the window (+1 request per agent)
    agents: int
    mean_requests: float  # per conversation
    mean_min_duration_s: float  # E[D_min]
    mean_min_response_s: float  # E[R_min] per request

    def as_dict(self) -> dict[str, float | None]:
        return {
            "throughput_rps": self.throughput_rps,
            "little_rps": self.little_rps,
            "ideal_window_rps": self.ideal_window_rps,
            "agents": float(self.agents),
            "mean_requests_per_conversation": self.mean_requests,
            "mean_min_conversation_s": self.mean_min_duration_s,
            "mean_min_response_s": self.mean_min_response_s,
        }


def min_responses(
    conv: Conversation, truth: IterationTimes, t_acc: float, shared_blocks: int, group: int, block: int
) -> list[float]:
    """``R_min`` of each request of ``conv`` (see the module docstring)."""
    keys = [conv.block_keys(i, 1, shared_blocks, group) for i in range(len(conv.requests))]
    owners: dict[int, set[int]] = {}
    for i, (prompt, produced) in enumerate(keys):
        for k in prompt + produced:
            owners.setdefault(k, set()).add(i)
    shared = set(range(1, shared_blocks + 1))
    out = []
    for i, r in enumerate(conv.requests):
        prompt = keys[i][0]
        cached = 0
        for k in prompt:  # the longest prefix that the shared prefix or another request holds
            if k in shared or owners.get(k, set()) - {i}:
                cached += 1
            else:
                break
        uncached = max(1, r.input_tokens - min(cached * block, r.input_tokens - 1))
        prefill = truth.prefill_s([PrefillBatchItem(float(uncached), float(r.input_tokens - uncached))])
        iterations = math.ceil(max(0, r.output_tokens - 1) / t_acc - 1e-9)
        decode = iterations * truth.decode_s(1, float(r.input_tokens)) if iterations else 0.0
        out.append(prefill + decode)
    return out


def min_duration(conv: Conversation, responses: Sequence[float], max_pause_s: float | None) -> float:
    """The critical path of ``conv``: pauses (capped at ``max_pause_s``) and minimal responses."""

    def pause(i: int) -> float:
        d = conv.requests[i].delay_s
        return d if max_pause_s is None else min(d, max_pause_s)

    finish = [0.0] * len(conv.requests)
    for i, r in enumerate(conv.requests):  # requests depend only on earlier ones
        start = pause(i) if r.depends_on < 0 and i else 0.0
        if r.depends_on >= 0:
            start = finish[r.depends_on] + pause(i)
        finish[i] = start + responses[i]
    return max(finish, default=0.0)


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
    ``window`` (its measured ``[start, end)``) also the ideal replay's count over the window, its
    agents started over ``ramp_s`` as the replay starts them."""
    if not conversations or agents <= 0:
        raise ValueError("a bound needs conversations and agents")
    scale = max(0.1, 1.0 - 4.0 * noise)
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
    ideal = None
    if order is not None and window is not None:
        start, end = window
        count = ideal_replay_count(order, responses, agents, max_pause_s, start, end, ramp_s)
        ideal = (count + agents) / (end - start)
    best = little if ideal is None else max(little, ideal)
    return ClosedLoopBound(best, little, ideal, agents, mean_n, mean_d, r_total / max(1, n_total))


def ideal_replay_count(
    order: Iterator[Conversation],
    responses: Mapping[int, Sequence[float]],
    agents: int,
    max_pause_s: float | None,
    start_s: float,
    end_s: float,
    ramp_s: float = 0.0,
) -> int:
    """Requests the ideal replay completes in ``[start_s, end_s)``: ``agents`` agents take
    conversations from ``order`` (the replay's seeded cycle) back to back, agent ``k`` from
    ``k * ramp_s / agents`` (all at 0 without a ramp), each request taking
    ``responses[id(conversation)][i]``, without queueing."""

    def pause(conv: Conversation, i: int) -> float:
        d = conv.requests[i].delay_s
        return d if max_pause_s is None else min(d, max_pause_s)

    events: list[tuple[float, int, int, int, Conversation]] = []  # (finish, seq, agent, request, conv)
    left: dict[int, int] = {}
    seq = 0

    def begin(agent: int, at: float) -> None:
        nonlocal seq
        conv = next(order)
        left[agent] = len(conv.requests)
        for i in conv.roots:
            seq += 1
            t = at + (pause(conv, i) if i else 0.0) + responses[id(conv)][i]
            heapq.heappush(events, (t, seq, agent, i, conv))

    counted = 0
    started = 0  # agent k starts at k * ramp_s / agents, as the replay's ramp starts them
    while True:
        start_at = started * ramp_s / agents if started < agents else math.inf
        if start_at <= (events[0][0] if events else math.inf):
            if start_at >= end_s:
                break
            begin(started, start_at)
            started += 1
            continue
        if events[0][0] >= end_s:
            break
        t, _, agent, i, conv = heapq.heappop(events)
        counted += t >= start_s
        for j in conv.children[i]:
            seq += 1
            heapq.heappush(events, (t + pause(conv, j) + responses[id(conv)][j], seq, agent, j, conv))
        left[agent] -= 1
        if left[agent] == 0:
            begin(agent, t)
    return counted
