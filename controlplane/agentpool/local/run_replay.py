"""Run a live replay end to end: the progress line while it runs, then the reports.

Shared by ``agentpool replay`` (against any router) and ``agentpool demo`` (against the local pool,
whose engines' roles give the split).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from agentpool.local.live_report import (
    PrefixTokens,
    Progress,
    SplitSource,
    SplitTimeline,
    live_result,
    scrape_prefix_tokens,
)
from agentpool.local.replay import LiveReplay, ReplaySettings
from agentpool.models import TtftSlo
from agentpool.sim.metrics import Metrics
from agentpool.sim.report import markdown_table, summary_table, write_json, write_plots
from agentpool.sim.trace import Conversation


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_base_s: float = 2.0
    ttft_per_token_s: float = 1e-4
    tpot_s: float = 0.1


@dataclass(frozen=True, slots=True)
class ReplayOutput:
    directory: Path | None
    plots: bool = True
    title: str = "agentpool replay"
    command: str = "agentpool replay"


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What ``GET /v1/models`` says of the model a router serves."""

    id: str
    context_length: int | None  # its ``max_model_len``, where it gives one


async def served_model(session: aiohttp.ClientSession, url: str) -> ServedModel:
    """The first model the router lists at ``GET /v1/models``, with its context where it says one."""
    async with session.get(url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as r:
        if r.status != 200:
            raise ValueError(f"{url}/v1/models answered {r.status}")
        data = await r.json()
    listed = data.get("data") if isinstance(data, dict) else None
    first = listed[0] if isinstance(listed, list) and listed else None
    if not isinstance(first, dict) or not isinstance(first.get("id"), str):
        raise ValueError(f"{url}/v1/models lists no model")
    context = first.get("max_model_len")
    if context is not None and (type(context) is not int or context < 1):
        raise ValueError(f"{url}/v1/models gives max_model_len {context!r}, not a positive integer")
    return ServedModel(first["id"], context)


async def replay(
    settings: ReplaySettings,
    conversations: Sequence[Conversation],
    slo: Slo = Slo(),
    split_source: Callable[[aiohttp.ClientSession], SplitSource] | None = None,
    progress: Progress | None = None,
    name: str = "live",
) -> dict[str, Any]:
    """Replay against ``settings.url``; returns the result dict (``live_result``). ``split_source``
    makes the split source from the replay's HTTP session."""
    metrics = Metrics(
        TtftSlo(slo.ttft_base_s, slo.ttft_per_token_s), slo.tpot_s, settings.warmup_s, settings.duration_s
    )
    run = LiveReplay(settings, conversations, metrics)
    progress = progress or Progress()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        splits = SplitTimeline(split_source(session) if split_source is not None else None)
        start_hits = await scrape_prefix_tokens(session, settings.url)
        window: dict[str, PrefixTokens | None] = {"start": start_hits, "end": None, "now": None}
        scraping: asyncio.Task[None] | None = None

        async def scrape() -> None:
            await splits.sample(run.now())
            now = await scrape_prefix_tokens(session, settings.url)
            window["now"] = now
            if run.now() < settings.warmup_s:
                window["start"] = now
            elif run.now() < run.end_s:
                window["end"] = now

        def tick() -> None:
            nonlocal scraping
            if scraping is None or scraping.done():
                scraping = asyncio.create_task(scrape())
            now, base = window["now"], start_hits
            hits = now - base if now is not None and base is not None else None
            progress.show(progress.line(run, hits, splits.last))

        wall = time.monotonic()
        try:
            await run.run(session, on_tick=tick)
        finally:
            progress.finish()
            if scraping is not None:
                await asyncio.gather(scraping, return_exceptions=True)
        end = window["end"] or await scrape_prefix_tokens(session, settings.url)
        begin = window["start"]
        hits = end - begin if end is not None and begin is not None else None
        await splits.sample(run.now())
        return live_result(name, run, hits, splits, time.monotonic() - wall)


def describe(settings: ReplaySettings, extra: dict[str, Any]) -> str:
    """The live workload in words (every value is in results.json)."""
    pauses = f"recorded pauses / {settings.time_scale:g}" + (
        f", at most {settings.max_pause_s:g} s" if settings.max_pause_s is not None else ""
    )
    outputs = (
        f"outputs capped at {settings.max_output_tokens} tokens"
        if settings.max_output_tokens is not None
        else "recorded output lengths"
    )
    headers = "branch headers" if settings.branch_headers else "no branch headers (stateless)"
    where = ", ".join(f"{k}: {v}" for k, v in extra.items())
    return (
        f"Workload: {extra.get('trace', 'bundled sample')}; {settings.agents} concurrent agents "
        "(closed loop), "
        f"{pauses}, {outputs}, {settings.shared_prefix_tokens}-token shared prefix, {headers}. "
        f"Router {settings.url} (model {settings.model}). {settings.warmup_s:g} s warmup, "
        f"{settings.duration_s:g} s measured. {where}\n"
    )


NOTES = (
    "\nLive rows are measured by the replay client over HTTP (times include the router, the engines and "
    "the network); the hit rate comes from the router (its per-request usage or its prefix-token counters "
    "over the window); queueing and imbalance are engine-side (not measured: -); the split is the one the "
    "engines serve (draining or unreachable engines count as down). Lost reuse: `1 - h/h*`, h* with an "
    "unlimited cache shared by all nodes and no switches, for the same requests at the same moments.\n"
)


def write_reports(
    out: ReplayOutput, settings: ReplaySettings, results: Sequence[dict[str, Any]], extra: dict[str, Any]
) -> str:
    """Markdown (the simulator's tables; printed and written), JSON and PNG plots, as ``agentpool
    simulate`` writes them."""
    parts = [f"# {out.title}\n", f"Command: `{out.command}`\n", describe(settings, extra)]
    parts += [summary_table(results), NOTES]
    for r in results:
        s = r["summary"]
        if "sent" in s:
            parts.append(
                f"{r['system']}: {s['sent']} requests sent, {s['completed']} completed, {s['failed']} failed "
                f"({s['failed_after_first_token']} after their first token), {s['retries']} retries "
                f"after 429/503; hit rate from {s['hit_rate_source']}.\n"
            )
            if s.get("too_long"):
                parts.append(
                    f"{s['too_long']} requests refused as longer than the pool's model takes (400 "
                    f"context_length_exceeded; not failures: a harness ends the conversation there) and "
                    f"{s['not_sent_after_too_long']} that waited on them not sent.\n"
                )
            if s.get("stopped_early"):
                early = s["stopped_early"]
                parts.append(f"**Stopped early**: {early}; the figures cover the run until then.\n")
            if r.get("errors"):
                parts.append("errors: " + "; ".join(r["errors"]) + "\n")
    text = "\n".join(parts)
    if out.directory is not None:
        out.directory.mkdir(parents=True, exist_ok=True)
        (out.directory / "report.md").write_text(
            text + "\n## Every column\n\n" + markdown_table(results), encoding="utf-8"
        )
        write_json(
            out.directory / "results.json",
            {"command": out.command, "settings": asdict(settings), **extra, "results": _finite(results)},
        )
        if out.plots:
            write_plots(out.directory, results, settings.warmup_s + settings.duration_s)
    return text


def _finite(value: Any) -> Any:
    """JSON has no NaN: not-measured values become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
