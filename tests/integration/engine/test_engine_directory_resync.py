"""The engine's directory link across a directory restart: the new directory process asks, the engine
reconnects and resyncs its full block list, and the index is complete again; a wrong token makes the
engine not ready, with the reason."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from engine_processes import PAGE, engine_config, gen_body, generate, start_engine, state, wait_until
from process_helpers import free_port, redis_namespace, start_directory

from agentpool.directory.client import DirectoryClient, DirectoryRpcError
from agentpool.kv import block_hashes

pytestmark = pytest.mark.integration
TOKEN = "k" * 32


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    async with redis_namespace("agentpool-engine-resync") as ns:
        yield ns


async def metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


async def test_the_engine_resyncs_a_restarted_directory(tmp_path: Path, namespace: str) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    wrong = tmp_path / "wrong"
    wrong.write_text("w" * 32)
    port = free_port()
    address = f"127.0.0.1:{port}"
    d, _ = await start_directory(namespace, token, PAGE, port)
    eng = bad = None
    try:
        good_cfg = engine_config("e", directory={"target": address, "tokenFile": str(token)})
        eng = await start_engine(tmp_path, good_cfg)
        bad = await start_engine(
            tmp_path, engine_config("x", directory={"target": address, "tokenFile": str(wrong)})
        )
        prompt = list(range(300, 340))
        hashes = block_hashes(prompt, PAGE)
        async with aiohttp.ClientSession() as http, DirectoryClient(address, token=TOKEN) as client:
            await generate(http, eng.url, gen_body("r1", prompt, max_tokens=1))

            async def indexed() -> bool:
                try:
                    res = await client.resolve(hashes)
                except DirectoryRpcError:  # the directory is restarting
                    return False
                return "e" in res.nodes and res.nodes["e"].host_blocks == len(hashes)

            await wait_until(indexed, 20, "the directory to index the engine's blocks")

            async def bad_not_ready() -> bool:
                async with http.get(bad.url + "/ready") as r:
                    return r.status == 503 and "refused the token" in await r.text()

            await wait_until(bad_not_ready, 20, "the engine with a wrong token to say it is not ready")

            d.kill()  # SIGKILL: the index is gone with the process
            await d.proc.wait()
            d, _ = await start_directory(namespace, token, PAGE, port)
            await wait_until(indexed, 30, "the engine to resync the new directory")
            assert (await state(http, eng.url))["directory_connected"]

            async def resynced_twice() -> bool:
                return await metric(http, eng.url, "agentpool_engine_directory_resyncs_total") >= 2

            await wait_until(resynced_twice, 10, "the resync count to reach 2")
    finally:
        for p in (eng, bad):
            if p is not None:
                await p.stop()
        await d.stop()


async def test_host_eviction_follows_the_directorys_branch_counts(tmp_path: Path, namespace: str) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    port = free_port()
    address = f"127.0.0.1:{port}"
    d, _ = await start_directory(namespace, token, PAGE, port)
    eng = None
    try:
        # 8 host slots of 4 tokens: two 4-block paths fill the pool
        cfg = engine_config(
            "ev", hostKvBytes=8 * 16384, directory={"target": address, "tokenFile": str(token)}
        )
        eng = await start_engine(tmp_path, cfg)
        older, newer, third = (list(range(k, k + 16)) for k in (1000, 2000, 3000))
        async with aiohttp.ClientSession() as http, DirectoryClient(address, token=TOKEN) as client:
            for rid, prompt in (("old", older), ("new", newer)):
                await generate(http, eng.url, gen_body(rid, prompt, max_tokens=1))

            async def holds(prompt: list[int], n: int) -> bool:
                res = await client.resolve(block_hashes(prompt, PAGE))
                node = res.nodes.get("ev")  # (the GPU tier still holds all three paths)
                return (node.host_blocks if node is not None else 0) == n

            await wait_until(lambda: holds(newer, 4), 20, "the directory to index both paths")
            # an agent branch still needs the older path: its blocks count 1 on the node
            await client.place("agent-1", "ev", block_hashes(older, PAGE))

            async def counted() -> bool:
                return bool((await state(http, eng.url))["host_counted"] == 4)

            await wait_until(counted, 20, "the counts to reach the engine")
            # a third path needs room: the newer but unreferenced path goes, not the older counted one
            await generate(http, eng.url, gen_body("third", third, max_tokens=1))
            await wait_until(lambda: holds(third, 4), 20, "the third path in the index")
            assert await holds(older, 4)
            assert await holds(newer, 0)
    finally:
        if eng is not None:
            await eng.stop()
        await d.stop()
