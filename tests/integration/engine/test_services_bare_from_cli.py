"""The directory, an engine agent and the router started from their command lines without a token
flag, as a user tries them first on one machine: each finds the pool's tokens in the per-user token
folder (``agentpool.secret_file.local_tokens``; the tests' own, set in ``tests/conftest.py``), so they
serve each other, and nothing is served without a token.

Real Redis (a unique namespace), real gRPC, the real engine agent with its sim backend.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from engine_processes import engine_config, gen_body, start_engine, wait_until
from process_helpers import REDIS_URL, Proc, free_port, launch, redis_namespace, stop_cleanly

from agentpool.directory.client import DirectoryClient, DirectoryRpcError
from agentpool.secret_file import read_secret_file
from agentpool.secret_file.local_tokens import LocalToken, token_dir

pytestmark = pytest.mark.integration
PAGE = 4


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    async with redis_namespace("agentpool-bare-cli-test") as ns:
        yield ns


async def streamed(resp: aiohttp.ClientResponse) -> tuple[str, str]:
    """The text of a chat completion's SSE stream, and its last event."""
    text, last = "", ""
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            last = line.removeprefix("data: ")
            if last != "[DONE]":
                for choice in json.loads(last)["choices"]:
                    text += (choice.get("delta") or {}).get("content") or ""
    return text, last


def local_token(token: LocalToken) -> str:
    path = token_dir(os.environ) / token.value
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, oct(path.stat().st_mode)
    return read_secret_file(path, token.value)


async def test_directory_engine_and_router_started_without_token_flags_serve_and_refuse_strangers(
    tmp_path: Path, namespace: str
) -> None:
    directory = await launch(
        "directory", "agentpool.directory",
        "--host", "127.0.0.1", "--port", "0", "--redis-url", REDIS_URL, "--namespace", namespace,
        "--page-size", str(PAGE),
    )  # fmt: skip
    procs: list[Proc] = [directory]
    try:
        address = (await directory.wait_for(r"directory listening on (\S+)")).group(1)
        router_url = f"http://127.0.0.1:{free_port()}"
        cfg: dict[str, Any] = engine_config(
            "e0", directory={"target": address}, routers=[{"url": router_url}]
        )
        del cfg["tokenFile"]  # the per-user engine token
        engine = await start_engine(tmp_path, cfg)
        procs.append(engine)
        config = tmp_path / "router.json"
        nodes = [{"id": "e0", "url": engine.url, "role": "both"}]
        config.write_text(json.dumps({"model": "m", "policy": "evolving", "pageSize": PAGE, "nodes": nodes}))
        router = await launch(
            "router", "agentpool.router", "--config", str(config), "--host", "127.0.0.1",
            "--port", router_url.rsplit(":", 1)[1], "--directory", address,
        )  # fmt: skip
        procs.append(router)
        await router.wait_for(r"router listening on")
        for p, said in (
            (directory, "--auth-token-file not given"),
            (router, "--report-token-file not given"),
        ):
            assert said in p.text() and "per-user" in p.text(), p.text()
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                async with http.get(engine.url + "/agentpool/v1/state") as r:
                    s = await r.json()
                if s["reports_sent"] < 1 or s["report_error"] is not None or not s["directory_connected"]:
                    return False
                async with http.get(router_url + "/ready") as r:
                    return r.status == 200

            await wait_until(ready, 30, "the engine's reports and the directory", alive=procs)
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "a prompt long enough for a few blocks " * 3}],
                "max_tokens": 3,
                "stream": True,
            }
            async with http.post(router_url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                assert await streamed(resp) == ("t0 t1 t2 ", "[DONE]")

            # nothing is open: each service wants its per-user token
            report = {"node_id": "e0", "role": "both"}
            async with http.post(router_url + "/agentpool/v1/report", json=report) as resp:
                assert resp.status == 401, await resp.text()
            auth = {"Authorization": f"Bearer {local_token(LocalToken.REPORT)}"}
            async with http.post(router_url + "/agentpool/v1/report", json=report, headers=auth) as resp:
                assert resp.status == 200, await resp.text()
            generate = gen_body("stranger", [1, 2, 3])
            async with http.post(engine.url + "/agentpool/v1/generate", json=generate) as resp:
                assert resp.status == 401, await resp.text()
            auth = {"Authorization": f"Bearer {local_token(LocalToken.ENGINE)}"}
            async with http.post(engine.url + "/agentpool/v1/generate", json=generate, headers=auth) as resp:
                assert resp.status == 200, await resp.text()
        async with DirectoryClient(address) as stranger:
            with pytest.raises(DirectoryRpcError, match=r"UNAUTHENTICATED|bearer token"):
                await stranger.resolve([1, 2, 3])
        async with DirectoryClient(address, token=local_token(LocalToken.DIRECTORY)) as client:
            assert (await client.resolve([1, 2, 3])).branch is None
        await stop_cleanly(procs)
    finally:
        for p in procs:
            await p.stop()
