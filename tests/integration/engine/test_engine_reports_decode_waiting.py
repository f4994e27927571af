"""``decode_waiting_tokens`` from engines to the router's node state (SMetric's KV check on colocated
nodes): a colocated sim engine decoding past its KV capacity reports the excess; a colocated sglang
agent whose SGLang (the stand-in) retracted decodes reports their prompt and output so far. Once the
decodes go on or end it is 0 again."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from engine_processes import PAGE, engine_config, start_engine, wait_until
from process_helpers import free_port

from agentpool.router.nodes import NodeTable

sys.path.insert(0, str(Path(__file__).parents[1] / "router"))
from router_harness import chat_body, router_config, start_router

pytestmark = pytest.mark.integration


def decode_waiting(nodes: NodeTable, node: str) -> int:
    """The router's ``decode_waiting_tokens`` for ``node`` (-1 before the node registers)."""
    if node not in nodes:
        return -1
    (state,) = [s for s in nodes.snapshot(time.monotonic()) if s.node_id == node]
    return int(state.decode_waiting_tokens)


async def test_kv_over_capacity_reaches_the_routers_node_state(tmp_path: Path) -> None:
    router = await start_router(router_config([], pageSize=PAGE, policy="smetric"))
    engine = None
    try:
        # 3 requests of ~30 prompt tokens and 40 output tokens each need ~210 KV tokens; the node has 100
        sim = {"gpuKvTokens": 100, "d0": 0.05}
        engine = await start_engine(tmp_path, engine_config("e0", routers=[{"url": router.url}], sim=sim))
        nodes = router.service.nodes

        def waiting() -> int:
            return decode_waiting(nodes, "e0")

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


STANDIN = str(Path(__file__).with_name("sglang_standin.py"))


async def test_sglang_retracted_decodes_reach_the_routers_node_state(tmp_path: Path) -> None:
    router = await start_router(router_config([], pageSize=PAGE, policy="smetric"))
    engine = None
    sglang = {
        "model": "stand-in/model",
        "port": free_port(),
        "kvEventsEndpoint": f"tcp://127.0.0.1:{free_port()}",
        "bootstrapPort": free_port(),
        "launcher": [
            sys.executable, STANDIN, "--record", str(tmp_path / "argv.json"), "--load-s", "0.2",
            "--standin-decode-s", "0.1,0",  # 60 tokens take 6 s
        ],
        "requireGpu": False,
        "loadPollS": 0.2,
    }  # fmt: skip
    standin = f"http://127.0.0.1:{sglang['port']}"
    try:
        cfg = engine_config("e0", backend="sglang", routers=[{"url": router.url}], sglang=sglang)
        engine = await start_engine(tmp_path, cfg)
        nodes = router.service.nodes

        def waiting() -> int:
            return decode_waiting(nodes, "e0")

        async with aiohttp.ClientSession() as http:

            async def registered() -> bool:
                async with http.get(engine.url + "/ready") as r:
                    return r.status == 200 and waiting() == 0

            await wait_until(registered, 30, "the agent ready and registered with the router", alive=[engine])

            async def running() -> int:
                async with http.get(standin + "/v1/loads") as r:
                    return int((await r.json())["loads"][0]["num_running_reqs"])

            async def one(i: int) -> str:
                body = chat_body(f"request number {i} " * 6, max_tokens=60)
                async with http.post(router.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    return str((await r.json())["choices"][0]["message"]["content"])

            requests = asyncio.gather(*(one(i) for i in range(3)))

            async def three_decoding() -> bool:
                return await running() == 3

            await wait_until(three_decoding, 10, "three requests decoding in SGLang")
            for _ in range(25):  # decoding requests get a chunk every pass: none is taken as waiting
                assert waiting() == 0, waiting()
                await asyncio.sleep(0.1)
            async with http.post(standin + "/standin/retract", json={"running": 1}) as r:
                assert r.status == 200  # SGLang's KV now holds one: two decodes go back to waiting

            async def reported() -> bool:
                return waiting() > 0

            await wait_until(reported, 10, "decode_waiting_tokens > 0 in the router's node state")
            assert waiting() >= 2 * 20, waiting()  # two prompts of 30-odd tokens and their output
            async with http.post(standin + "/standin/retract", json={"running": None}) as r:
                assert r.status == 200
            answers = await requests
        assert answers == ["".join(f"w{i} " for i in range(60))] * 3  # every token once, in order

        async def zero() -> bool:
            return waiting() == 0

        await wait_until(zero, 10, "decode_waiting_tokens back to 0")
        assert "Traceback" not in engine.text(), engine.text()
    finally:
        if engine is not None:
            await engine.stop()
        await router.stop()
