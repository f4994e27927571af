"""`agentpool replay` from its command line against a router started from its own, over stand-in engines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from local_trace import write_small_trace
from process_helpers import engine_token_file, free_port
from router_engine_standin import StandIn

pytestmark = pytest.mark.integration


@pytest.fixture
async def router(tmp_path: Path) -> AsyncIterator[tuple[str, list[StandIn]]]:
    async with started_router(tmp_path, {}) as started:
        yield started


@pytest.fixture
async def capped_router(tmp_path: Path) -> AsyncIterator[tuple[str, list[StandIn]]]:
    """A router that takes prompts of at most 700 tokens (its /v1/models says so)."""
    async with started_router(tmp_path, {"contextLength": 700}) as started:
        yield started


@pytest.fixture
async def capped_engines(tmp_path: Path) -> AsyncIterator[tuple[str, list[StandIn]]]:
    """Engines that refuse prompts over 700 tokens behind a router that does not know it (as SGLang
    with its model's own context, where the pool gives no ``contextLength``)."""
    async with started_router(tmp_path, {}, engine_context=700) as started:
        yield started


@contextlib.asynccontextmanager
async def started_router(
    tmp_path: Path,
    settings: dict[str, Any],
    procs: list[asyncio.subprocess.Process] | None = None,
    engine_context: int | None = None,
) -> AsyncIterator[tuple[str, list[StandIn]]]:
    """The router from its CLI over two stand-in engines; its process is appended to ``procs``."""
    engines = [
        await StandIn(f"e{i}", prefill_s=0.01, token_s=0.002, tokens=6, context_length=engine_context).start()
        for i in range(2)
    ]
    config = tmp_path / "router.json"
    nodes = [{"id": e.node_id, "url": e.url, "role": "both"} for e in engines]
    config.write_text(
        json.dumps({"model": "replay-model", "policy": "least-loaded", "nodes": nodes, **settings})
    )
    token = tmp_path / "report-token"
    token.write_text(secrets.token_hex(16))
    token.chmod(0o600)
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentpool.router", "--config", str(config), "--host", "127.0.0.1",
        "--port", str(port), "--report-token-file", str(token),
        "--engine-token-file", str(engine_token_file()),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    if procs is not None:
        procs.append(proc)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                assert proc.returncode is None, "router exited"
                try:
                    async with session.get(url + "/v1/models") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        yield url, engines
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
        for e in engines:
            await e.kill()


async def run_replay(
    url: str, tmp_path: Path, *extra: str, while_running: Any = None
) -> tuple[int, dict[str, Any], str]:
    """``agentpool replay`` from its CLI (6 s unless ``extra`` says otherwise); ``while_running``: a
    coroutine run beside it."""
    trace = write_small_trace(tmp_path / "trace.jsonl")
    out = tmp_path / "out"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentpool.cli", "replay", "--url", url, "--trace", str(trace),
        "--agents", "3", "--duration", "6", "--time-scale", "10", "--drain", "30", "--shared-prefix", "128",
        "--out", str(out), *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    if while_running is not None:
        await while_running
    stdout, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, json.loads((out / "results.json").read_text()), stdout.decode()


async def test_replay_drives_the_trace_through_the_router_and_reports(
    router: tuple[str, list[StandIn]], tmp_path: Path
) -> None:
    url, engines = router
    code, results, text = await run_replay(url, tmp_path)
    assert code == 0, text
    summary = results["results"][0]["summary"]
    assert summary["sent"] >= 10
    assert summary["failed"] == 0 and summary["completed"] == summary["sent"]
    assert summary["requests"] > 0 and summary["throughput_rps"] > 0
    assert summary["ttft_s"]["p50"] > 0
    assert 0 < summary["ideal_hit_rate"] < 1  # later turns extend earlier ones
    received = [r for e in engines for r in e.received]
    assert len(received) >= summary["sent"]
    assert all(r.body["stream"] is True for r in received)
    # every prompt is the trace's length plus one chat marker per message (+1 generation prompt)
    lengths = sorted(len(r.prompt_token_ids) for r in received)
    assert lengths[0] >= 200
    for name in ("report.md", "split_over_time.png", "ttft_cdf.png", "throughput.png"):
        assert (tmp_path / "out" / name).is_file()
    assert "| live |" in text and "failed" in text


async def test_a_request_refused_as_too_long_ends_its_agent_and_is_no_failure(
    capped_engines: tuple[str, list[StandIn]], tmp_path: Path
) -> None:
    # the small trace's main agents: prompts of about 212, 404, 596, 788 and 980 tokens; turn 4
    # is over the engines' 700 and turn 5 waits on it; the sub-agents' prompts are short
    url, engines = capped_engines
    code, results, text = await run_replay(url, tmp_path, "--no-plots", "--quiet")
    assert code == 0, text
    assert results["context_length"] is None and results["left_out_over_context"] == 0
    summary = results["results"][0]["summary"]
    assert summary["failed"] == 0, results["results"][0]["errors"]
    assert summary["too_long"] >= 1
    assert summary["not_sent_after_too_long"] == summary["too_long"]  # each: its agent's turn 5
    assert summary["completed"] + summary["too_long"] == summary["sent"]
    assert any(len(r.prompt_token_ids) > 700 for e in engines for r in e.received)  # refused there
    assert "refused as longer than the pool's model takes" in text


async def test_replay_leaves_out_what_the_routers_context_cannot_take(
    capped_router: tuple[str, list[StandIn]], tmp_path: Path
) -> None:
    # the router's /v1/models gives max_model_len 700: each main agent's turns 4 (788 + 80 tokens)
    # and 5 (waiting on it) are left out before the replay starts, 8 of the 4 sessions' 28 requests
    url, engines = capped_router
    code, results, text = await run_replay(url, tmp_path, "--no-plots", "--quiet")
    assert code == 0, text
    assert results["context_length"] == 700 and results["left_out_over_context"] == 8
    assert "8 trace requests over the router's 700-token context" in text
    summary = results["results"][0]["summary"]
    assert summary["failed"] == 0 and summary["too_long"] == 0, results["results"][0]["errors"]
    assert summary["completed"] == summary["sent"] > 0
    assert max(len(r.prompt_token_ids) for e in engines for r in e.received) <= 700


async def test_replay_without_branch_headers(router: tuple[str, list[StandIn]], tmp_path: Path) -> None:
    url, _ = router
    code, results, text = await run_replay(url, tmp_path, "--no-branch-headers", "--no-plots", "--quiet")
    assert code == 0, text
    summary = results["results"][0]["summary"]
    assert summary["failed"] == 0 and summary["sent"] >= 10
    assert summary["branches_ended_at_stop"] == 0
    assert not (tmp_path / "out" / "ttft_cdf.png").exists()


async def test_replay_says_when_the_router_is_not_there(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentpool.cli", "replay", "--url", f"http://127.0.0.1:{free_port()}",
        "--out", str(tmp_path / "o"), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    stdout, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode != 0
    assert b"cannot reach the router" in stdout
    assert b"Traceback" not in stdout


async def test_replay_stops_early_when_the_router_goes_away(tmp_path: Path) -> None:
    """The router is stopped 3 s into a 60 s replay: the replay stops once it could not connect for
    its --unreachable-timeout, reports what it measured until then, says why, and exits 1."""
    procs: list[asyncio.subprocess.Process] = []
    async with started_router(tmp_path, {}, procs) as (url, _):

        async def stop_the_router() -> None:
            await asyncio.sleep(3)
            procs[0].terminate()
            await procs[0].wait()

        started = asyncio.get_running_loop().time()
        code, results, text = await run_replay(
            url, tmp_path, "--duration", "60", "--unreachable-timeout", "2", "--no-plots", "--quiet",
            while_running=stop_the_router(),
        )  # fmt: skip
        took = asyncio.get_running_loop().time() - started
    summary = results["results"][0]["summary"]
    assert code == 1, text
    assert took < 20, f"the replay took {took:.0f} s"
    assert summary["completed"] > 0  # what it measured before the router went
    assert summary["stopped_early"].startswith(f"the router at {url} could not be reached for 2 s"), summary
    assert "**Stopped early**" in text and "stopped early: the router at" in text
