"""A colocated sim engine decoding past its KV capacity reports the excess as ``decode_waiting_tokens``
and the router's node state carries it to SMetric (its KV check on colocated nodes); once the decodes
end it is 0 again."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from engine_processes import PAGE, engine_config, start_engine, wait_until

sys.path.insert(0, str(Path(__file__).parents[1] / "router"))
from router_harness import chat_body, router_config, start_router

pytestmark = pytest.mark.integration


async def test_kv_over_capacity_reaches_the_routers_node_state(tmp_path: Path) -> None:
    router = await start_router(router_config([], pageSize=PAGE, policy="smetric"))
    engine = None
    try:
        # 3 requests of ~30 prompt tokens and 40 output tokens each need ~210 KV tokens; the node has 100
        sim = {"gpuKvTokens": 100, "d0": 0.05}
        engine = await start_engine(tmp_path, engine_config("e0", routers=[{"url": router.url}], sim=sim))
        nodes = router.service.nodes

        def waiting() -> int:
            if "e0" not in nodes:
                return -1
            (state,) = [s for s in nodes.snapshot(time.monotonic()) if s.node_id == "e0"]
            return state.decode_waiting_tokens

        async def reported() -> bool:
            return waiting() == 0

        await wait_until(reported, 10, "the engine's first report")
        peak = 0

        async def over() -> bool:
            nonlocal peak
            peak = max(peak, waiting())
            return peak > 0

        async with aiohttp.ClientSession() as http:

            async def one(i: int) -> None:
                body = chat_body(f"request number {i} " * 6, max_tokens=40)
                async with http.post(router.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200, await r.text()

            requests = asyncio.gather(*(one(i) for i in range(3)))
            await wait_until(over, 10, "decode_waiting_tokens > 0 in the router's node state")
            await requests
        assert peak >= 10, peak  # well over capacity, not a rounding
        await wait_until(reported, 10, "decode_waiting_tokens back to 0 after the decodes")
        assert await engine.stop() == 0
        assert "Traceback" not in engine.text(), engine.text()
    finally:
        if engine is not None:
            await engine.stop()
        await router.stop()
