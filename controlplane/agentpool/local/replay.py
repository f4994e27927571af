"""Drive agent conversations from a trace through a live router, in real time, as harnesses would.

The schedule is the simulator's closed loop (:mod:`agentpool.sim.replay`): ``agents`` conversations
run at once and a finished one is replaced by the next from the trace (cycling). Within a
conversation a request is sent when the request it depends on has completed and its recorded
pause has elapsed; pauses are divided by ``time_scale`` and capped at ``max_pause_s``. Every
replayed conversation gets fresh block keys (``Conversation.block_keys``), with the shared
system-and-tools prefix mapped to the same keys in all of them, exactly as the simulator does.

Prompts are synthesized from the block keys (:mod:`agentpool.local.prompts`) and sent as chat
messages with ``max_tokens`` = the recorded output length (capped at ``max_output_tokens``). With
branch headers each agent of a conversation is a branch: a sub-agent names its parent in
``x-agentpool-parent-branch``, an agent's last request carries ``x-agentpool-branch-end``, and
branches still open when the replay stops are ended with ``DELETE /v1/branches/{id}``. Without
branch headers (``branch_headers=False``) the router sees only the messages (the stateless path).

New requests are sent until ``warmup_s + duration_s``; then the replay waits up to ``drain_s``
for the requests in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from agentpool.local.client import BranchHeaders, Outcome, end_branch, stream_chat
from agentpool.local.prompts import AgentHistory, WordCache, prompt_words
from agentpool.sim.metrics import Metrics
from agentpool.sim.node import SimRequest
from agentpool.sim.trace import Conversation


def trace_cached_tokens(outcome: Outcome, input_tokens: int) -> int:
    """The request's cache hits in the trace's tokens: the engines count the router's templated prompt
    (``usage.prompt_tokens``, a few tokens more than the trace's ``input_tokens``), so the hit
    fraction they report is carried over (0 when the usage had no count)."""
    if not outcome.cached_tokens or not outcome.prompt_tokens:
        return 0
    return min(input_tokens, round(outcome.cached_tokens * input_tokens / outcome.prompt_tokens))


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    url: str
    model: str
    agents: int
    duration_s: float
    warmup_s: float = 0.0
    time_scale: float = 1.0
    max_pause_s: float | None = None
    max_output_tokens: int | None = None
    branch_headers: bool = True
    shared_prefix_tokens: int = 15_000
    drain_s: float = 120.0
    ramp_s: float = 0.0
    request_timeout_s: float = 600.0
    unreachable_s: float = 30.0
    """Stop the replay early when every request for this long could not connect to the router."""

    def __post_init__(self) -> None:
        if self.agents < 1:
            raise ValueError(f"agents must be at least 1, got {self.agents}")
        if self.duration_s <= 0 or self.warmup_s < 0 or self.drain_s < 0 or self.ramp_s < 0:
            raise ValueError("duration must be positive; warmup, drain and ramp non-negative")
        if not self.unreachable_s > 0:
            raise ValueError(f"the unreachable limit must be positive, got {self.unreachable_s}")
        if self.time_scale <= 0:
            raise ValueError(f"time scale must be positive, got {self.time_scale}")
        if self.max_pause_s is not None and self.max_pause_s < 0:
            raise ValueError(f"max pause must be non-negative, got {self.max_pause_s}")
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise ValueError(f"max output tokens must be at least 1, got {self.max_output_tokens}")

    def pause(self, recorded_s: float) -> float:
        scaled = recorded_s / self.time_scale
        return scaled if self.max_pause_s is None else min(scaled, self.max_pause_s)


@dataclass(slots=True)
class RequestRecord:
    """One sent request: what the trace asked for and what the harness saw."""

    conversation: str
    instance: int
    agent: int
    turn: int
    input_tokens: int
    max_tokens: int
    ideal_cached_tokens: int
    outcome: Outcome


@dataclass(slots=True, eq=False)
class _Instance:
    conv: Conversation
    instance: int
    remaining: int
    histories: dict[int, AgentHistory] = field(default_factory=dict)
    open_branches: set[str] = field(default_factory=set)
    started_agents: set[int] = field(default_factory=set)
    done: asyncio.Event = field(default_factory=asyncio.Event)


def descendants(conv: Conversation, i: int) -> int:
    """How many requests of ``conv`` wait on request ``i``, directly or through others."""
    todo, n = list(conv.children[i]), 0
    while todo:
        n += 1
        todo.extend(conv.children[todo.pop()])
    return n


class LiveReplay:
    """One replay run; :meth:`run` returns when the duration and the drain are over."""

    def __init__(
        self, settings: ReplaySettings, conversations: Sequence[Conversation], metrics: Metrics
    ) -> None:
        if not conversations:
            raise ValueError("no conversations to replay")
        block_sizes = {c.block_size for c in conversations}
        if len(block_sizes) != 1:
            raise ValueError(f"conversations with different block sizes: {sorted(block_sizes)}")
        self.settings = settings
        self.block_size = block_sizes.pop()
        self.metrics = metrics  # also the ideal cache (h*), as in the simulator
        self.words = WordCache(self.block_size)
        self.records: list[RequestRecord] = []
        self.in_flight = 0
        self.agents_started = 0
        self.branches_ended_after = 0  # branches ended by DELETE when the replay stopped
        self.not_sent = 0  # requests left out because one they wait on was refused as too long
        self.stopped_early: str | None = None  # why the replay stopped before its end
        self._unreachable_since: float | None = None  # first of the connection failures in a row
        self._source = itertools.cycle(conversations)
        self._next_instance = 1
        self._next_rid = 0
        self._t0 = 0.0
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._failed: list[asyncio.Task[None]] = []
        self._live: set[_Instance] = set()

    # -- clock ------------------------------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the replay started."""
        return time.monotonic() - self._t0

    def elapsed(self, monotonic_s: float | None) -> float:
        """``monotonic_s`` (a ``time.monotonic()`` stamp) in seconds since the start; -inf for None."""
        return -math.inf if monotonic_s is None else monotonic_s - self._t0

    @property
    def end_s(self) -> float:
        return self.settings.warmup_s + self.settings.duration_s

    # -- run --------------------------------------------------------------------------------------
    async def run(self, session: aiohttp.ClientSession, on_tick: Callable[[], None] | None = None) -> None:
        self._t0 = time.monotonic()
        s = self.settings
        slots = [asyncio.create_task(self._slot(session, k * s.ramp_s / s.agents)) for k in range(s.agents)]
        try:
            while self.now() < self.end_s and self.stopped_early is None:
                await asyncio.sleep(min(1.0, max(0.0, self.end_s - self.now())))
                self._raise_failures(slots)
                self._check_reachable()
                if on_tick is not None:
                    on_tick()
            self._stopping = True
            deadline = time.monotonic() + s.drain_s
            while self.in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                if on_tick is not None:
                    on_tick()
        finally:
            self._stopping = True
            for t in (*slots, *self._tasks):
                t.cancel()
            await asyncio.gather(*slots, *self._tasks, return_exceptions=True)
        if s.branch_headers:
            await self._end_open_branches(session)

    def _check_reachable(self) -> None:
        """Stop early once no request could connect to the router for ``unreachable_s``: a router
        that is gone would otherwise turn the rest of the run into a stream of failures."""
        since = self._unreachable_since
        limit = self.settings.unreachable_s
        if since is not None and time.monotonic() - since >= limit:
            self.stopped_early = (
                f"the router at {self.settings.url} could not be reached for {limit:g} s "
                f"(from {self.elapsed(since):.0f} s into the replay)"
            )

    def _note_reach(self, outcome: Outcome) -> None:
        if not outcome.unreachable:
            self._unreachable_since = None
        elif self._unreachable_since is None:
            self._unreachable_since = outcome.sent_at

    def _raise_failures(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        """A bug in the replay must stop it, not leave agents silently idle."""
        for t in (*tasks, *self._failed):
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise RuntimeError("a replay task failed") from t.exception()

    async def _slot(self, session: aiohttp.ClientSession, delay_s: float) -> None:
        """One agent slot of the closed loop: conversations one after the other."""
        await asyncio.sleep(delay_s)
        while not self._stopping:
            conv = next(self._source)
            inst = _Instance(conv, self._next_instance, len(conv.requests))
            self._next_instance += 1
            self.agents_started += 1
            self._live.add(inst)
            for i in conv.roots:
                delay = self.settings.pause(conv.requests[i].delay_s) if i else 0.0
                self._spawn(self._request(session, inst, i, delay))
            await inst.done.wait()
            self._live.discard(inst)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._failed.append(task)

    async def _request(self, session: aiohttp.ClientSession, inst: _Instance, i: int, delay_s: float) -> None:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        if self._stopping:
            return
        s = self.settings
        conv = inst.conv
        tr = conv.requests[i]
        shared = s.shared_prefix_tokens // self.block_size
        blocks, produced = conv.block_keys(i, inst.instance, shared)
        words = prompt_words(self.words, blocks, produced, tr.input_tokens, f"{inst.instance}.{i}")
        history = inst.histories.setdefault(tr.agent, AgentHistory())
        messages = history.messages(blocks, words, self.block_size)
        history.answered(tr.output_tokens)
        max_tokens = tr.output_tokens
        if s.max_output_tokens is not None:
            max_tokens = min(max_tokens, s.max_output_tokens)
        body = {"model": s.model, "messages": messages, "max_tokens": max_tokens}
        branch = self._branch_headers(inst, i) if s.branch_headers else None
        cap = max(0, (tr.input_tokens - 1) // self.block_size)
        ideal = self.metrics.ideal_prefix(blocks, cap) * self.block_size
        self._next_rid += 1
        req = SimRequest(
            rid=self._next_rid,
            input_tokens=tr.input_tokens,
            output_tokens=max_tokens,
            blocks=blocks,
            produced=produced,
            branch=f"{inst.instance}.{tr.agent}",
            issued_at=self.now(),
            ideal_cached_tokens=ideal,
        )
        self.in_flight += 1
        try:
            outcome = await stream_chat(
                session,
                s.url,
                body,
                branch,
                stream_timeout_s=s.request_timeout_s,
                on_first=functools.partial(self._prompt_computed, req, cap),
            )
        finally:
            self.in_flight -= 1
        self._note_reach(outcome)
        req.issued_at = outcome.sent_at - self._t0
        req.output_tokens = max(1, outcome.tokens)
        req.cached_tokens = trace_cached_tokens(outcome, tr.input_tokens)
        if outcome.first_at is not None:
            req.first_token_at = outcome.first_at - self._t0
        if outcome.ok and outcome.done_at is not None:
            req.done_at = outcome.done_at - self._t0
            req.enqueued_at = req.prefill_start = req.issued_at  # not seen by a client
            self.metrics.ideal_add(produced)
            self.metrics.done(req)
        if branch is not None and branch.end:
            inst.open_branches.discard(branch.branch)
        self.records.append(
            RequestRecord(
                conv.name,
                inst.instance,
                tr.agent,
                tr.turn,
                tr.input_tokens,
                max_tokens,
                req.ideal_cached_tokens,
                outcome,
            )
        )
        if outcome.too_long:
            # the harness cannot go on from a request its model refused: what waits on it (the
            # agent's later turns, the sub-agents it spawns) is not sent, as the simulator's
            # replay leaves them out (agentpool.sim.trace.cap_context)
            skipped = descendants(conv, i)
            self.not_sent += skipped
            inst.remaining -= skipped
        else:
            for j in conv.children[i]:
                self._spawn(self._request(session, inst, j, s.pause(conv.requests[j].delay_s)))
        inst.remaining -= 1
        if inst.remaining == 0:
            inst.done.set()

    def _prompt_computed(self, req: SimRequest, cap: int) -> None:
        """``req``'s first token came: its prompt's KV exists now. Its ideal prefix is taken again
        here, before its own blocks join the ideal set: an engine schedules a prefill after the
        request was sent, so the KV it reuses may come from requests whose prompts were computed
        meanwhile (parallel sub-agents on one prefix), which the ideal set at send time did not hold;
        everything computed before this request's first token is an upper bound on what it could
        reuse (the simulator decides both at routing, so it needs no such step)."""
        known = self.metrics.ideal_prefix(req.blocks, cap)
        req.ideal_cached_tokens = known * self.block_size
        self.metrics.first_token(req, known)  # the known prefix is in the set already

    def _branch_headers(self, inst: _Instance, i: int) -> BranchHeaders:
        """The agent's branch; its first request names the agent that spawned it, if still open."""
        conv = inst.conv
        tr = conv.requests[i]
        name = f"c{inst.instance}-a{tr.agent}"
        parent = None
        if tr.agent not in inst.started_agents:
            inst.started_agents.add(tr.agent)
            dep = tr.depends_on
            if dep >= 0 and conv.requests[dep].agent != tr.agent:
                parent = f"c{inst.instance}-a{conv.requests[dep].agent}"
                if parent not in inst.open_branches:
                    parent = None
        inst.open_branches.add(name)
        return BranchHeaders(name, parent, end=tr.last_of_agent)

    async def _end_open_branches(self, session: aiohttp.ClientSession) -> None:
        for inst in list(self._live):
            for name in sorted(inst.open_branches):
                with contextlib.suppress(aiohttp.ClientError, ConnectionError, TimeoutError):
                    async with asyncio.timeout(10):
                        if await end_branch(session, self.settings.url, name):
                            self.branches_ended_after += 1
            inst.open_branches.clear()
