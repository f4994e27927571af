"""Two routers dispatch to one sim engine: each router numbers its own dispatches, and the engine's
reports to each router carry that router's last dispatch sequence number (not the other's)."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp
import pytest
from engine_processes import PAGE, engine_config, start_engine, wait_until

sys.path.insert(0, str(Path(__file__).parents[1] / "router"))
from router_harness import chat_body, router_config, start_router

pytestmark = pytest.mark.integration


async def test_each_router_gets_its_own_last_dispatch_seq(tmp_path: Path) -> None:
    ra = await start_router(router_config([], pageSize=PAGE))
    rb = await start_router(router_config([], pageSize=PAGE))
    engine = None
    try:
        cfg = engine_config("e0", routers=[{"url": ra.url}, {"url": rb.url}])
        engine = await start_engine(tmp_path, cfg)

        def last_seq(service: object) -> int | None:
            nodes = service.nodes  # type: ignore[attr-defined]
            if "e0" not in nodes or nodes.get("e0").report is None:
                return None
            return int(nodes.get("e0").report.last_dispatch_seq)

        # the engine registers with both routers through its reports
        await wait_until(lambda: _true(last_seq(ra.service) == -1 and last_seq(rb.service) == -1), 10, "reg")
        assert ra.service.router_id != rb.service.router_id
        async with aiohttp.ClientSession() as http:
            for router, n in ((ra, 5), (rb, 2)):
                for i in range(n):
                    async with http.post(router.url + "/v1/chat/completions", json=chat_body(f"q{i}")) as r:
                        assert r.status == 200, await r.text()
        # a colocated request takes two of the router's numbers (its dispatch, then its decode binding):
        # A sent seqs 0, 2, .., 8 and B 0, 2; each hears back its own last one
        await wait_until(lambda: _true(last_seq(ra.service) == 8), 10, "A's report to cover seq 8")
        await wait_until(lambda: _true(last_seq(rb.service) == 2), 10, "B's report to cover seq 2")
        assert last_seq(ra.service) == 8
        assert await engine.stop() == 0
        assert "Traceback" not in engine.text(), engine.text()
    finally:
        if engine is not None:
            await engine.stop()
        await ra.stop()
        await rb.stop()


async def _true(v: bool) -> bool:
    return v
