"""The live report: the progress line (terminal only), router counters, the split timeline."""

from __future__ import annotations

import asyncio
import io
import time

import numpy as np
import pytest

from agentpool.local.client import Outcome
from agentpool.local.live_report import PrefixTokens, Progress, SplitTimeline, parse_prefix_tokens
from agentpool.local.replay import LiveReplay, ReplaySettings, RequestRecord, trace_cached_tokens
from agentpool.models import TtftSlo
from agentpool.sim.metrics import Metrics
from agentpool.sim.node import SimRequest
from agentpool.sim.trace import Conversation, TraceRequest

METRICS_TEXT = """# HELP agentpool_router_prefix_tokens_total Prompt tokens
# TYPE agentpool_router_prefix_tokens_total counter
agentpool_router_prefix_tokens_total{kind="local"} 700.0
agentpool_router_prefix_tokens_total{kind="remote"} 100.0
agentpool_router_prefix_tokens_total{kind="miss"} 200.0
"""


def test_router_counters_give_the_hit_rate_of_a_window() -> None:
    end = parse_prefix_tokens(METRICS_TEXT)
    assert end == PrefixTokens(700, 100, 200) and end.hit_rate == 0.8
    window = end - PrefixTokens(300, 0, 100)
    assert window.hit_rate == 500 / 600
    assert PrefixTokens().hit_rate is None


def test_split_timeline_keeps_changes() -> None:
    splits = iter([(2, 2, 0), (2, 2, 0), (1, 2, 1), (1, 3, 0)])

    async def source() -> tuple[int, int, int]:
        return next(splits)

    timeline = SplitTimeline(source)
    for t in range(4):
        asyncio.run(timeline.sample(float(t)))
    assert timeline.rows == [(0.0, 2, 2, 0), (2.0, 1, 2, 1), (3.0, 1, 3, 0)]
    assert timeline.switches == 1
    assert timeline.switches_since(2.5) == 0 and timeline.switches_since(2.0) == 1


def test_progress_line_only_on_a_terminal() -> None:
    req = TraceRequest(0, 1, 640, 10, np.arange(10), np.zeros(0, dtype=np.int64), -1, 0.0)
    conv = Conversation.build("c", [req], 64)
    settings = ReplaySettings(url="http://x", model="m", agents=1, duration_s=60)
    replay = LiveReplay(settings, [conv], Metrics(TtftSlo(2, 1e-4), 0.1, 0, 60))
    now = time.monotonic()
    for i in range(5):
        outcome = Outcome(sent_at=now - 2, first_at=now - 2 + 0.1 * (i + 1), done_at=now - 1, tokens=10)
        replay.records.append(RequestRecord("c", 1, 0, 1, 640, 10, 320, outcome))
    replay.records.append(RequestRecord("c", 1, 0, 1, 640, 10, 0, Outcome(sent_at=now, error="HTTP 502")))
    text = Progress(enabled=True).line(replay, PrefixTokens(200, 0, 600), (2, 2, 0))
    assert "done     5 failed   1" in text
    assert "TTFT p50  0.30" in text and "split 2P2D" in text
    assert "lost KV reuse  50.0%" in text  # h = 0.25 against h* = 0.5
    quiet = io.StringIO()
    Progress(quiet).show(text)  # a StringIO is not a terminal
    assert quiet.getvalue() == ""
    shown = io.StringIO()
    Progress(shown, enabled=True).show(text)
    assert shown.getvalue().startswith("\r[")


def test_the_ideal_prefix_is_taken_when_the_prompt_is_computed() -> None:
    """A request sent while a sibling on the same prefix is still prefilling may reuse the sibling's
    KV by the time its own prefill runs: its ideal counts what was computed before its first token."""
    req = TraceRequest(0, 1, 640, 10, np.arange(10), np.zeros(0, dtype=np.int64), -1, 0.0)
    conv = Conversation.build("c", [req], 64)
    settings = ReplaySettings(url="http://x", model="m", agents=1, duration_s=60)
    metrics = Metrics(TtftSlo(2, 1e-4), 0.1, 0, 60)
    replay = LiveReplay(settings, [conv], metrics)
    sibling = SimRequest(1, 384, 1, [11, 12, 13, 14, 15, 16], [], "c1.1", 0.0)
    mine = SimRequest(2, 640, 1, [11, 12, 13, 14, 21, 22, 23, 24, 25, 26], [], "c1.2", 0.0)
    assert metrics.ideal_prefix(mine.blocks, 9) == 0  # when both were sent
    replay._prompt_computed(sibling, 5)
    replay._prompt_computed(mine, 9)
    assert mine.ideal_cached_tokens == 4 * 64  # the sibling's prompt, computed before mine
    assert sibling.ideal_cached_tokens == 0
    assert metrics.ideal_prefix([11, 12, 13, 14, 21, 22, 99], 7) == 6  # both prompts joined the set


@pytest.mark.parametrize(
    ("cached", "prompt", "trace_input", "want"),
    [
        (None, 110, 100, 0),  # no count in the usage
        (0, 110, 100, 0),
        (55, 110, 100, 50),  # half the templated prompt: half the trace's tokens
        (109, 110, 100, 99),
        (120, 110, 100, 100),  # never more than the trace's prompt
        (64, None, 100, 0),
    ],
)
def test_cache_hits_are_carried_to_the_traces_tokens(
    cached: int | None, prompt: int | None, trace_input: int, want: int
) -> None:
    outcome = Outcome(sent_at=0.0, prompt_tokens=prompt, cached_tokens=cached)
    assert trace_cached_tokens(outcome, trace_input) == want
