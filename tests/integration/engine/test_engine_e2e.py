"""A router, a directory on Redis and two sim engines, each started from its command line, serve a
streamed chat completion end to end: the prefill engine hands the KV over to the decode engine with
NIXL, engines publish KV events to the directory and post authenticated load reports to the router."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from engine_processes import PAGE, engine_config, start_engine, state, wait_until
from process_helpers import Proc, engine_token_file, free_port, launch, redis_namespace, start_directory

pytestmark = pytest.mark.integration
DIR_TOKEN = "d" * 32
REPORT_TOKEN = "r" * 32


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    async with redis_namespace("agentpool-engine-e2e") as ns:
        yield ns


def router_config(path: Path, nodes: list[dict[str, str]]) -> None:
    raw = {"model": "test-model", "policy": "evolving", "pageSize": PAGE, "nodes": nodes}
    path.write_text(json.dumps(raw))


async def read_sse(resp: aiohttp.ClientResponse) -> list[Any]:
    out: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_router_directory_and_two_engines_serve_a_streamed_chat_completion(
    tmp_path: Path, namespace: str
) -> None:
    dir_token = tmp_path / "dir-token"
    dir_token.write_text(DIR_TOKEN)
    report_token = tmp_path / "report-token"
    report_token.write_text(REPORT_TOKEN)
    directory, address = await start_directory(namespace, dir_token, PAGE)
    procs: list[Proc] = [directory]
    try:
        port = free_port()  # the engines report to the router from their start
        url = f"http://127.0.0.1:{port}"
        common: dict[str, Any] = {
            "directory": {"target": address, "tokenFile": str(dir_token)},
            "routers": [{"url": url, "tokenFile": str(report_token)}],
        }
        p0 = await start_engine(tmp_path, engine_config("p0", role="prefill", **common))
        d0 = await start_engine(tmp_path, engine_config("d0", role="decode", **common))
        procs += [p0, d0]
        config = tmp_path / "router.json"
        router_config(
            config,
            [{"id": "p0", "url": p0.url, "role": "prefill"}, {"id": "d0", "url": d0.url, "role": "decode"}],
        )
        router = await launch(
            "router", "agentpool.router", "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
            "--directory", address, "--directory-token-file", str(dir_token),
            "--report-token-file", str(report_token), "--engine-token-file", str(engine_token_file()),
        )  # fmt: skip
        procs.append(router)
        await router.wait_for(r"router listening on (http://\S+)")
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                for e in (p0, d0):  # reports fail until the router listens
                    s = await state(http, e.url)
                    if s["reports_sent"] < 2 or s["report_error"] is not None:
                        return False
                async with http.get(url + "/ready") as r:
                    return r.status == 200

            await wait_until(ready, 30, "the router to take both engines' reports", alive=[p0, d0, router])
            text = "please summarise the following long context for an agent " * 6
            body = {
                "model": "test-model",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 5,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            headers = {"x-agentpool-branch": "agent-1"}
            async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                events = await read_sse(resp)
            content = "".join(
                (e["choices"][0].get("delta") or {}).get("content") or ""
                for e in events
                if isinstance(e, dict) and e.get("choices")
            )
            assert content == "t0 t1 t2 t3 t4 ", events
            assert events[-1] == "[DONE]"
            usage = events[-2]["usage"]
            assert usage["completion_tokens"] == 5
            assert usage["prompt_tokens_details"] == {"cached_tokens": 0}  # the prefill node's, a new prompt
            sp, sd = await state(http, p0.url), await state(http, d0.url)
            assert sp["host_blocks"] > 0 and sd["host_blocks"] == sp["host_blocks"]  # the KV moved over
            assert sp["directory_connected"] and sd["directory_connected"]
            assert sp["report_error"] is None and sd["report_error"] is None
            assert sp["reports_sent"] > 0

            # the same prompt again: the prefill node's cache hits reach the client's usage
            async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                again = (await read_sse(resp))[-2]["usage"]
            cached = again["prompt_tokens_details"]["cached_tokens"]
            assert again["prompt_tokens"] == usage["prompt_tokens"], again  # at least one token computed:
            assert usage["prompt_tokens"] - PAGE <= cached < usage["prompt_tokens"], again

            # the router's work log holds the engines' iteration records for the planner
            async def iterations_logged() -> bool:
                async with http.get(url + "/agentpool/v1/work") as r:
                    work = await r.json()
                return bool(work.get("iterations"))

            await wait_until(iterations_logged, 10, "iteration records in the router's work log")
            # and, for the planner's KV-room bound, each engine's KV capacity from its reports
            async with http.get(url + "/agentpool/v1/work") as r:
                served = (await r.json())["served"]
            assert len(served) == 2 and all(s["kv_capacity_tokens"] > 0 for s in served), served
        for p in (p0, d0, router):
            assert await p.stop() == 0
            assert "Traceback" not in p.text(), p.text()
    finally:
        for p in procs:
            await p.stop()
