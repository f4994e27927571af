"""Synthetic agent workloads, parameterized and seeded (evolving-infra §6.1, §6.3).

- :func:`putnam` (decode-heavy math agent, mini-SWE-agent on PutnamBench-like problems): one branch,
  no context management; every step appends a long reasoning/proof output and a short tool result.
- :func:`osworld` (prefill-heavy computer-use agent, OSWorld-like): every step appends a screenshot
  (many input tokens) and a short action; some tasks spawn sub-agents with their own contexts.

Token counts are drawn from lognormal or uniform distributions whose parameters are the fields of
:class:`PutnamShape` and :class:`OSWorldShape`. Each agent's context only grows, so every prompt
extends the agent's previous prompt plus its output; block ids are per conversation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agentpool.sim.trace import Conversation, TraceRequest


@dataclass(frozen=True, slots=True)
class PutnamShape:
    system_tokens: int = 4000
    steps: tuple[int, int] = (10, 40)
    output_mean: float = 2500.0
    output_sigma: float = 0.6
    tool_tokens: tuple[int, int] = (200, 1200)
    tool_time_s: tuple[float, float] = (2.0, 15.0)


@dataclass(frozen=True, slots=True)
class OSWorldShape:
    system_tokens: int = 8000
    steps: tuple[int, int] = (15, 50)
    screenshot_tokens: tuple[int, int] = (1800, 3200)
    output_mean: float = 150.0
    output_sigma: float = 0.5
    action_time_s: tuple[float, float] = (1.0, 3.0)
    subagent_probability: float = 0.3
    subagent_steps: tuple[int, int] = (5, 15)


class _Agent:
    """One agent's growing context: token count and the ids of its full blocks."""

    def __init__(self, ids: _Ids, block: int, tokens: int) -> None:
        self.ids = ids
        self.block = block
        self.tokens = 0
        self.blocks: list[int] = []
        self.grow(tokens)

    def grow(self, tokens: int) -> None:
        self.tokens += tokens
        while len(self.blocks) < self.tokens // self.block:
            self.blocks.append(self.ids.next())


class _Ids:
    def __init__(self) -> None:
        self.last = 0

    def next(self) -> int:
        self.last += 1
        return self.last


@dataclass
class _Step:
    agent: int
    turn: int
    input_tokens: int
    output_tokens: int
    blocks: list[int]
    depends_on: int
    delay_s: float


def _finish(name: str, kind: str, steps: list[_Step], block: int) -> Conversation:
    next_of: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, s in enumerate(steps):
        if s.agent in last:
            next_of[last[s.agent]] = i
        last[s.agent] = i
    reqs = []
    for i, s in enumerate(steps):
        j = next_of.get(i)
        produced: list[int] = []
        if j is not None:
            end = min(len(steps[j].blocks), (s.input_tokens + s.output_tokens) // block)
            produced = steps[j].blocks[len(s.blocks) : end]
        reqs.append(
            TraceRequest(
                agent=s.agent,
                turn=s.turn,
                input_tokens=s.input_tokens,
                output_tokens=s.output_tokens,
                blocks=np.asarray(s.blocks, dtype=np.int64),
                produced=np.asarray(produced, dtype=np.int64),
                depends_on=s.depends_on,
                delay_s=s.delay_s,
                last_of_agent=j is None,
            )
        )
    return Conversation.build(name, reqs, block, kind=kind)


def _lognormal(rng: np.random.Generator, mean: float, sigma: float) -> int:
    mu = np.log(mean) - sigma * sigma / 2.0
    return max(1, int(rng.lognormal(mu, sigma)))


def putnam(
    rng: np.random.Generator, index: int, shape: PutnamShape = PutnamShape(), block: int = 64
) -> Conversation:
    ids = _Ids()
    agent = _Agent(ids, block, shape.system_tokens)
    steps: list[_Step] = []
    n = int(rng.integers(shape.steps[0], shape.steps[1] + 1))
    for turn in range(1, n + 1):
        out = _lognormal(rng, shape.output_mean, shape.output_sigma)
        delay = 0.0 if turn == 1 else float(rng.uniform(*shape.tool_time_s))
        steps.append(_Step(0, turn, agent.tokens, out, list(agent.blocks), len(steps) - 1, delay))
        agent.grow(out + int(rng.integers(shape.tool_tokens[0], shape.tool_tokens[1] + 1)))
    return _finish(f"putnam-{index}", "putnam", steps, block)


def osworld(
    rng: np.random.Generator, index: int, shape: OSWorldShape = OSWorldShape(), block: int = 64
) -> Conversation:
    ids = _Ids()
    main = _Agent(ids, block, shape.system_tokens)
    steps: list[_Step] = []
    n = int(rng.integers(shape.steps[0], shape.steps[1] + 1))
    spawn_at = int(rng.integers(1, n + 1)) if rng.random() < shape.subagent_probability else -1
    main_prev = -1
    for turn in range(1, n + 1):
        main.grow(int(rng.integers(shape.screenshot_tokens[0], shape.screenshot_tokens[1] + 1)))
        out = _lognormal(rng, shape.output_mean, shape.output_sigma)
        delay = 0.0 if turn == 1 else float(rng.uniform(*shape.action_time_s))
        steps.append(_Step(0, turn, main.tokens, out, list(main.blocks), main_prev, delay))
        parent_step = main_prev = len(steps) - 1
        main.grow(out)
        if turn == spawn_at:
            for a in range(1, int(rng.integers(1, 3)) + 1):
                sub = _Agent(ids, block, shape.system_tokens // 2)
                prev = parent_step
                for st in range(
                    1, int(rng.integers(shape.subagent_steps[0], shape.subagent_steps[1] + 1)) + 1
                ):
                    sub.grow(int(rng.integers(shape.screenshot_tokens[0], shape.screenshot_tokens[1] + 1)))
                    o = _lognormal(rng, shape.output_mean, shape.output_sigma)
                    steps.append(
                        _Step(
                            a,
                            st,
                            sub.tokens,
                            o,
                            list(sub.blocks),
                            prev,
                            float(rng.uniform(*shape.action_time_s)),
                        )
                    )
                    prev = len(steps) - 1
                    sub.grow(o)
    return _finish(f"osworld-{index}", "osworld", steps, block)


def generator(kind: str, seed: int, block: int = 64) -> Callable[[], Conversation]:
    """A conversation source for ``kind`` (``putnam`` or ``osworld``) drawing from one seeded rng."""
    rng = np.random.default_rng(seed)
    counter = iter(range(1 << 62))
    if kind == "putnam":
        return lambda: putnam(rng, next(counter), block=block)
    if kind == "osworld":
        return lambda: osworld(rng, next(counter), block=block)
    raise ValueError(f"unknown synthetic workload {kind!r}; known: putnam, osworld")
