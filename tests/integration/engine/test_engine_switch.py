"""Role switch in place under load, driven by the role file: nothing lost or duplicated, running
requests finish, queued ones are handed back, the host pool survives, the switch time is recorded."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from engine_processes import engine_config, gen_body, start_engine, state, wait_until
from process_helpers import ENGINE_AUTH

pytestmark = pytest.mark.integration


async def stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any], log: list[Any]) -> list[Any]:
    events: list[Any] = []
    async with http.post(url + "/agentpool/v1/generate", json=body, headers=ENGINE_AUTH) as r:
        assert r.status == 200
        async for line in r.content:
            if line.strip():
                ev = json.loads(line)
                events.append(ev)
                log.append((time.monotonic(), body["request_id"], ev["type"]))
    return events


async def test_a_switch_under_load_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    role_file = tmp_path / "role"
    role_file.write_text("both\n")
    cfg = engine_config(
        "sw",
        roleFile=str(role_file),
        sim={"c0": 0.15, "c1": 0.0, "chunkTokens": 16, "d0": 0.02},
    )
    eng = await start_engine(tmp_path, cfg)
    try:
        async with aiohttp.ClientSession() as http:
            log: list[Any] = []
            prompts = {f"r{i}": list(range(1000 * i, 1000 * i + 16)) for i in range(8)}
            tasks = {
                rid: asyncio.create_task(stream(http, eng.url, gen_body(rid, p, max_tokens=20), log))
                for rid, p in prompts.items()
            }
            await wait_until(_seen(log, "started", 2), 20, "two prefills to start")
            before = await state(http, eng.url)
            written = time.monotonic()
            role_file.write_text("prefill\n")
            results = {rid: await asyncio.wait_for(t, 30) for rid, t in tasks.items()}

            done = {rid for rid, ev in results.items() if ev[-1]["type"] == "done"}
            requeued = {rid for rid, ev in results.items() if ev[-1]["type"] == "requeue"}
            assert done | requeued == set(prompts) and not done & requeued
            assert done and requeued, results
            for rid, ev in results.items():
                kinds = [e["type"] for e in ev]
                assert sum(k in ("done", "requeue", "error") for k in kinds) == 1, (rid, kinds)
                if rid in requeued:
                    assert kinds == ["requeue"], (rid, kinds)  # handed back before it started
                else:
                    assert kinds[0] == "started" and kinds.count("token") == 20
            first_requeue = min(t for t, _, k in log if k == "requeue")
            assert first_requeue - written < 1.0  # file change to drain start (0.2 s polling)

            async def switched() -> bool:
                return bool((await state(http, eng.url))["switches"])

            await wait_until(switched, 20, "the switch")
            after = await state(http, eng.url)
            assert after["role"] == "prefill" and not after["draining"]
            (sw,) = after["switches"]
            assert sw["from"] == "both" and sw["to"] == "prefill" and 0 < sw["drain_s"] <= sw["total_s"]
            assert after["host_blocks"] >= before["host_blocks"] > 0  # the host pool survived
            # the handed-back requests are served by the new role exactly once
            for rid in sorted(requeued):
                ev = await stream(http, eng.url, gen_body(rid, prompts[rid], phase="prefill"), log)
                assert [e["type"] for e in ev] == ["started", "prefilled"]
            assert (await state(http, eng.url))["host_blocks"] == 8 * 4
            async with http.get(eng.url + "/metrics") as r:
                text = await r.text()
            assert 'agentpool_engine_switch_seconds_count{part="total"} 1.0' in text
            assert 'agentpool_engine_switches_total{from_role="both",to_role="prefill"} 1.0' in text
            assert f'agentpool_engine_requeued_requests_total{{reason="draining"}} {len(requeued)}.0' in text
    finally:
        await eng.stop()


def _seen(log: list[Any], kind: str, n: int) -> Any:
    async def check() -> bool:
        return sum(1 for _, _, k in log if k == kind) >= n

    return check
