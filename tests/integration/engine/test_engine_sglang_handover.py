"""P->D on the ``sglang`` backend with the KV transfer checked (stand-ins in prefill and decode mode,
the decode one asking the prefill one's bootstrap server for the room): a transfer that fails makes
the decode agent ask the prefill agent for the prefill again and decode with the new room
(``agentpool_engine_handover_recomputed_total``); with the prefill node gone the request goes back
to the router (``requeue``, reason ``kv_source_lost``), and the agent goes on serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from engine_processes import (
    engine_config,
    gen_body,
    generate,
    metric_value,
    sglang_checked_section,
    start_engine,
    wait_until,
)
from process_helpers import free_port

pytestmark = pytest.mark.integration


async def test_a_failed_transfer_is_prefilled_again_at_the_source(tmp_path: Path) -> None:
    p_cfg = engine_config(
        "p0", backend="sglang", role="prefill", sglang=sglang_checked_section(tmp_path, "p0")
    )
    d_cfg = engine_config(
        "d0", backend="sglang", role="decode", sglang=sglang_checked_section(tmp_path, "d0")
    )
    p = await start_engine(tmp_path, p_cfg)
    d = await start_engine(tmp_path, d_cfg)
    p_sglang = f"http://127.0.0.1:{p_cfg['sglang']['port']}"
    d_sglang = f"http://127.0.0.1:{d_cfg['sglang']['port']}"
    prompt = list(range(100, 124))
    try:
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                for url in (p.url, d.url):
                    async with http.get(url + "/ready") as r:
                        if r.status != 200:
                            return False
                return True

            await wait_until(ready, 30, "both agents ready", alive=[p, d])

            async def pd(rid: str) -> list[dict[str, Any]]:
                events = await generate(http, p.url, gen_body(rid, prompt, phase="prefill", max_tokens=3))
                assert [e["type"] for e in events] == ["started", "prefilled"], events
                kv = {"node_id": "p0", "url": p.url, "transfer_id": events[1]["transfer_id"]}
                body = gen_body(rid, prompt, phase="decode", max_tokens=3, kv_source=kv)
                return await generate(http, d.url, body)

            async def decode_requests() -> list[dict[str, Any]]:
                async with http.get(d_sglang + "/standin/requests") as r:
                    out: list[dict[str, Any]] = (await r.json())["requests"]
                    return out

            async def d_metrics() -> str:
                async with http.get(d.url + "/metrics") as r:
                    return await r.text()

            # the transfer works: the decode SGLang finds the room on the prefill side
            events = await pd("ok")
            assert [e["type"] for e in events] == ["started", "token", "token", "token", "done"], events
            assert metric_value(await d_metrics(), "agentpool_engine_handover_recomputed_total") == 0

            # the next transfer fails: the decode agent asks p0 for the prefill again, with a new room
            async with http.post(p_sglang + "/standin/fail_transfers", json={"count": 1}) as r:
                assert r.status == 200
            events = await pd("retry")
            assert [e["type"] for e in events] == ["started", "token", "token", "token", "done"], events
            assert "".join(e.get("text", "") for e in events) == "w0 w1 w2 "
            sent = [b for b in await decode_requests() if str(b["rid"]).endswith("-retry-again")]
            rooms = [b["bootstrap_room"] for b in await decode_requests()][-2:]
            assert len(sent) == 1 and rooms[0] != rooms[1] and sent[0]["bootstrap_room"] == rooms[1]
            text = await d_metrics()
            assert metric_value(text, "agentpool_engine_handover_recomputed_total") == 1
            assert metric_value(text, 'agentpool_engine_fetch_failures_total{kind="handover"}') == 1
            assert metric_value(text, "agentpool_engine_fetch_recomputed_tokens_total") == len(prompt)

            # the prefill node is gone (nothing listens at its agent's or its bootstrap port): nothing
            # can prefill it again, the request goes back to the router (kv_source_lost)
            kv = {
                "node_id": "p9",
                "url": f"http://127.0.0.1:{free_port()}",
                "transfer_id": f"sglang-bootstrap:{free_port()}:5",
            }
            body = gen_body("gone", prompt, phase="decode", max_tokens=3, kv_source=kv)
            events = await generate(http, d.url, body)
            assert [e["type"] for e in events] == ["requeue"], events  # nothing reached the client before
            assert events[0]["reason"] == "kv_source_lost" and "could not redo it" in events[0]["message"]
            text = await d_metrics()
            assert metric_value(text, "agentpool_engine_handover_recomputed_total") == 1
            assert metric_value(text, 'agentpool_engine_fetch_failures_total{kind="handover"}') == 2
            assert (
                metric_value(text, 'agentpool_engine_requeued_requests_total{reason="kv_source_lost"}') == 1
            )
            async with http.get(d.url + "/ready") as r:
                assert r.status == 200
    finally:
        await p.stop()
        await d.stop()
    assert "Traceback" not in d.text(), d.text()
