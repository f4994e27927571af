"""Which settings generation the router and the planner run reaches the planner's ConfigMap (what
the operator's status shows): a real router on loopback, its work batches polled, its config
reloaded; the planner's settings file re-read; the report written to a ConfigMap on KMock."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client as k8s
from planner_link_harness import router_config, start_router

from agentpool.planner.inbox import PlannerInbox
from agentpool.planner.process import report_loaded
from agentpool.planner.router_source import RouterWorkSource
from agentpool.planner.settings_file import PlannerSettings
from agentpool.planner.state import ConfigMapStateStore, LoadedGenerations

pytestmark = pytest.mark.integration

NS = "gen"


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    (line,) = [x for x in text.splitlines() if x.startswith(name + " ")]
    return float(line.split()[1])


async def test_routers_report_the_generation_of_the_config_they_run() -> None:
    nodes = [("e0", "http://127.0.0.1:9", "both")]
    routers = [await start_router(router_config(nodes, generation=4)) for _ in range(2)]
    unnamed = await start_router(router_config(nodes))  # a config that names no generation
    try:
        async with aiohttp.ClientSession() as session:
            source = RouterWorkSource([*(r.url for r in routers), unnamed.url], PlannerInbox(), session)
            assert source.config_generations() == {}  # none heard from yet
            await source.poll_once()
            assert source.config_generations() == {routers[0].url: 4, routers[1].url: 4, unnamed.url: None}
            assert await metric(session, routers[0].url, "agentpool_router_config_generation") == 4
            assert await metric(session, unnamed.url, "agentpool_router_config_generation") == -1
            # one replica reloads generation 5 (the operator's ConfigMap changed); the other lags
            routers[1].service.apply_config(router_config(nodes, generation=5))
            await source.poll_once()
            assert source.config_generations()[routers[0].url] == 4
            assert source.config_generations()[routers[1].url] == 5
            assert await metric(session, routers[1].url, "agentpool_router_config_generation") == 5
    finally:
        for r in [*routers, unnamed]:
            await r.stop()


async def test_the_planner_settings_generation_follows_the_file(tmp_path: Path) -> None:
    path = tmp_path / "planner.json"
    path.write_text(json.dumps({"window_s": 600, "generation": 2}))
    settings = PlannerSettings({}, path)
    assert settings.generation == 2 and settings().window_s == 600
    path.write_text(json.dumps({"window_s": 600, "generation": 3}))  # only the generation changed
    assert not await settings.reload()  # the configuration is the same ...
    assert settings.generation == 3  # ... and the file of generation 3 is the one in force
    path.write_text(json.dumps({"window_s": 600, "generation": "three"}))
    assert not await settings.reload()
    assert settings.generation == 3  # a bad file keeps the last good one, and its generation
    path.write_text(json.dumps({"window_s": 600}))
    assert not await settings.reload() and settings.generation is None


async def test_report_loaded_writes_only_changes(kmock: Any, tmp_path: Path) -> None:
    kmock.resources["v1/configmaps"] = {}
    api = k8s.ApiClient(k8s.Configuration(host=str(kmock.url).rstrip("/")))
    path = tmp_path / "planner.json"
    path.write_text(json.dumps({"generation": 6}))
    settings = PlannerSettings({}, path)
    router = await start_router(router_config([("e0", "http://127.0.0.1:9", "both")], generation=6))
    stop = asyncio.Event()
    try:
        async with aiohttp.ClientSession() as session:
            source = RouterWorkSource([router.url], PlannerInbox(), session)
            await source.poll_once()
            store = ConfigMapStateStore(api, NS, "pool-planner-state")
            task = asyncio.create_task(report_loaded(store, settings, source, stop, 0.05))

            def writes() -> list[Any]:
                return [r for r in kmock if r.method in ("PATCH", "POST") and "configmaps" in r.url.path]

            def loaded() -> LoadedGenerations | None:
                key = (kmock.resource("v1", "configmaps"), NS, "pool-planner-state")
                if key not in kmock.objects:
                    return None
                return LoadedGenerations.model_validate_json(kmock.objects[key].raw["data"]["loaded.json"])

            for _ in range(100):
                if loaded() is not None:
                    break
                await asyncio.sleep(0.05)
            assert loaded() == LoadedGenerations(planner=6, routers={router.url: 6})
            await asyncio.sleep(0.3)  # six more rounds, nothing changed
            assert len(writes()) == 2  # the failed patch of a missing ConfigMap, then its creation
            path.write_text(json.dumps({"generation": 7}))
            await settings.reload()
            for _ in range(100):
                if (got := loaded()) is not None and got.planner == 7:
                    break
                await asyncio.sleep(0.05)
            assert loaded() == LoadedGenerations(planner=7, routers={router.url: 6})
            assert len(writes()) == 3
            stop.set()
            await asyncio.wait_for(task, timeout=5.0)
    finally:
        stop.set()
        await router.stop()
        await asyncio.to_thread(api.close)
