"""Config reload off the event loop: a bad file or tokenizer keeps the running config and the loop."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from router_harness import router_config, start_router, write_config

from agentpool.router.config import ConfigFile


async def _wait_for(predicate: object, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.05)
    return False


async def test_bad_tokenizer_keeps_config_and_later_reload_applies(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    nodes = [("a", "http://127.0.0.1:9", "both")]
    write_config(path, router_config(nodes, policy="round-robin"))
    router = await start_router(ConfigFile(path).load(), config_file=ConfigFile(path))
    errors = router.service.metrics.config_reloads.labels("error")
    try:
        before = errors._value.get()
        write_config(path, router_config(nodes, policy="smetric", tokenizer=str(tmp_path / "missing")))
        assert await _wait_for(lambda: errors._value.get() > before)
        assert router.service.routing.policy.name == "round-robin"  # previous config kept
        write_config(path, router_config(nodes, policy="smetric"))  # the loop is still alive
        assert await _wait_for(lambda: router.service.routing.policy.name == "smetric")
    finally:
        await router.stop()
