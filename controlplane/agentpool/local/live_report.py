"""What a live replay measured, in the simulator's report format, and its live progress line.

The summary is :class:`agentpool.sim.metrics.Metrics`' (the same code scores simulated runs):
throughput, TTFT/TPOT/E2E percentiles and SLO attainment over the requests that completed in the
measurement window, and the ideal hit rate ``h*`` of an unlimited shared cache for the same
requests at the same moments. What a client cannot see is filled in from the router:

- the hit rate ``h``: per request from ``usage.prompt_tokens_details.cached_tokens`` when the
  router passes it on; otherwise from the router's ``agentpool_router_prefix_tokens_total``
  counters (``local`` + ``remote`` over all three kinds) between the start and the end of the
  measurement window, which counts requests when they are routed (and again when re-routed);
- queueing time and prefill imbalance are engine-side: reported as not measured (NaN).

The split over time comes from a :data:`SplitSource` (the local pool reads its engines' served
roles); without one the report has no split.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from agentpool.local.replay import LiveReplay

PREFIX_METRIC = "agentpool_router_prefix_tokens"
# (prefill nodes, decode nodes, nodes serving both or switching), or None when unknown
SplitSource = Callable[[], Awaitable[tuple[int, int, int] | None]]


@dataclass(frozen=True, slots=True)
class PrefixTokens:
    """The router's routed prompt tokens by where their KV was."""

    local: float = 0.0
    remote: float = 0.0
    miss: float = 0.0

    def __sub__(self, other: PrefixTokens) -> PrefixTokens:
        return PrefixTokens(self.local - other.local, self.remote - other.remote, self.miss - other.miss)

    @property
    def total(self) -> float:
        return self.local + self.remote + self.miss

    @property
    def hit_rate(self) -> float | None:
        return (self.local + self.remote) / self.total if self.total > 0 else None


def parse_prefix_tokens(text: str) -> PrefixTokens:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != PREFIX_METRIC:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                kind = sample.labels.get("kind", "")
                values[kind] = values.get(kind, 0.0) + float(sample.value)
    return PrefixTokens(values.get("local", 0.0), values.get("remote", 0.0), values.get("miss", 0.0))


async def scrape_prefix_tokens(session: aiohttp.ClientSession, url: str) -> PrefixTokens | None:
    """The router's counters now, or None when its /metrics cannot be read."""
    try:
        async with session.get(url.rstrip("/") + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
            if r.status != 200:
                return None
            return parse_prefix_tokens(await r.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


class EngineRoles:
    """The split the engines serve: ``GET <engine>/agentpool/v1/state`` of each (a :data:`SplitSource`).

    An engine that is draining for a switch, serves ``both`` or does not answer counts in the third
    number."""

    def __init__(self, engines: Mapping[str, str], session: aiohttp.ClientSession) -> None:
        self.engines = dict(engines)
        self._session = session

    async def _role(self, url: str) -> str | None:
        try:
            async with self._session.get(
                url + "/agentpool/v1/state", timeout=aiohttp.ClientTimeout(total=2)
            ) as r:
                state = await r.json() if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        if not isinstance(state, dict) or state.get("draining"):
            return None
        role = state.get("role")
        return role if isinstance(role, str) else None

    async def __call__(self) -> tuple[int, int, int] | None:
        roles = await asyncio.gather(*(self._role(u) for u in self.engines.values()))
        p, d = roles.count("prefill"), roles.count("decode")
        return (p, d, len(roles) - p - d)


class SplitTimeline:
    """Samples a :data:`SplitSource` and keeps the changes, as the simulator's ``split_timeline``."""

    def __init__(self, source: SplitSource | None) -> None:
        self.source = source
        self.rows: list[tuple[float, int, int, int]] = []

        self.last: tuple[int, int, int] | None = None

    async def sample(self, at: float) -> tuple[int, int, int] | None:
        split = await self.source() if self.source is not None else None
        if split is not None and (not self.rows or self.rows[-1][1:] != split):
            self.rows.append((at, *split))
        self.last = split
        return split

    @property
    def switches(self) -> int:
        """Node moves between consecutive distinct splits (prefill count changes)."""
        return self.switches_since(-math.inf)

    def switches_since(self, at: float) -> int:
        """Node moves into splits first seen at ``at`` or later."""
        pairs = zip(self.rows, self.rows[1:], strict=False)
        return sum(abs(b[1] - a[1]) for a, b in pairs if b[0] >= at)


def live_result(
    name: str,
    replay: LiveReplay,
    window_hits: PrefixTokens | None,
    splits: SplitTimeline,
    wall_s: float,
) -> dict[str, Any]:
    """The replay's result in the shape :mod:`agentpool.sim.report` renders (``run_system``'s)."""
    m = replay.metrics
    summary = m.summary()
    rows = m.rows
    per_request = [r.outcome.cached_tokens for r in replay.records if r.outcome.ok]
    if rows and all(c is not None for c in per_request):
        source = "usage.cached_tokens"
    else:
        source = "router counters"
        h = window_hits.hit_rate if window_hits is not None else None
        h_star = summary["ideal_hit_rate"]
        inp = sum(r[0] for r in rows)
        summary["hit_rate"] = h if h is not None else math.nan
        summary["lost_kv_reuse"] = (1.0 - h / h_star) if h is not None and h_star > 0 else math.nan
        summary["uncached_tokens_per_request"] = (
            (1.0 - h) * inp / len(rows) if h is not None and rows else math.nan
        )
    summary["hit_rate_source"] = source
    summary["mean_queue_s"] = math.nan
    summary["prefill_imbalance"] = math.nan
    summary["switches"] = splits.switches_since(replay.settings.warmup_s)
    summary["switches_total"] = splits.switches
    summary["switch_mean_s"] = math.nan
    summary["switch_downtime_s"] = math.nan
    summary["final_split"] = list(splits.rows[-1][1:]) if splits.rows else []
    records = replay.records
    done_at = [replay.elapsed(r.outcome.done_at) for r in records if r.outcome.ok]
    per_minute = [0] * (int(max(done_at, default=0.0) // 60.0) + 1)
    for t in done_at:
        per_minute[int(max(0.0, t) // 60.0)] += 1
    summary["sent"] = len(records)
    summary["completed"] = sum(1 for r in records if r.outcome.ok)
    summary["too_long"] = sum(1 for r in records if r.outcome.too_long)
    summary["not_sent_after_too_long"] = replay.not_sent
    summary["failed"] = sum(1 for r in records if r.outcome.failed)
    summary["failed_after_first_token"] = sum(1 for r in records if not r.outcome.ok and r.outcome.streamed)
    summary["retries"] = sum(r.outcome.retries for r in records)
    summary["branches_ended_at_stop"] = replay.branches_ended_after
    summary["stopped_early"] = replay.stopped_early
    errors = {r.outcome.error for r in records if r.outcome.error and not r.outcome.too_long}
    return {
        "system": name,
        "description": "live pool: real processes, measured by the replay client",
        "summary": summary,
        "split_timeline": [list(x) for x in splits.rows],
        "switches": [],
        "planner_log": [],
        "ttft_samples": m.ttfts(),
        "completed_per_minute": per_minute,
        "requests_simulated": summary["completed"],
        "agents_started": replay.agents_started,
        "wall_s": wall_s,
        "sim_requests_per_wall_s": math.nan,
        "errors": sorted(errors)[:20],
    }


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else math.nan


class Progress:
    """One status line, rewritten in place about once a second; only on a terminal."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._done_at: list[float] = []

    def line(self, replay: LiveReplay, hits: PrefixTokens | None, split: tuple[int, int, int] | None) -> str:
        now = replay.now()
        done = [r for r in replay.records if r.outcome.ok]
        recent = sum(1 for r in done[-5000:] if replay.elapsed(r.outcome.done_at) >= now - 10.0)
        rate = recent / min(10.0, max(now, 1e-9))
        ttft = [r.outcome.first_at - r.outcome.sent_at for r in done[-500:] if r.outcome.first_at is not None]
        failed = sum(1 for r in replay.records if r.outcome.failed)
        h = hits.hit_rate if hits is not None else None
        inp = sum(r.input_tokens for r in done)
        h_star = sum(r.ideal_cached_tokens for r in done) / inp if inp else 0.0
        lost = f"{1 - h / h_star:6.1%}" if h is not None and h_star > 0 else "   -  "
        split_text = f"{split[0]}P{split[1]}D" + (f"+{split[2]}" if split[2] else "") if split else "-"
        phase = "warmup" if now < replay.settings.warmup_s else ("run" if now < replay.end_s else "drain")
        return (
            f"[{now:6.0f}s {phase:6s}] done {len(done):5d} failed {failed:3d} in flight {replay.in_flight:3d}"
            f" | {rate:5.2f} req/s | TTFT p50 {_pct(ttft, 50):5.2f} p95 {_pct(ttft, 95):5.2f} s"
            f" | split {split_text} | lost KV reuse {lost}"
        )

    def show(self, text: str) -> None:
        if self.enabled:
            self.stream.write("\r" + text[:200].ljust(120))
            self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
