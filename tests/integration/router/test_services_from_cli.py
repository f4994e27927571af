"""The directory, the router and the planner, each started from its command line as users start them.

Real Redis (a unique namespace on the shared server), real gRPC between router and directory, real
HTTP to stand-in engines (our own seam), the planner against KMock: a streamed chat completion goes
through all of them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from process_helpers import (
    engine_token_file,
    kubeconfig,
    launch,
    redis_namespace,
    running,
    start_directory,
    start_router,
)
from router_engine_standin import StandIn
from router_harness import chat_body, read_sse, streamed_text, wait_until

from agentpool.directory.client import DirectoryClient
from agentpool.secret_file.local_tokens import TOKEN_DIR_ENV

pytestmark = pytest.mark.integration
NS = "agents"
PODS = ("engine-0", "engine-1")


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    async with redis_namespace("agentpool-router-cli-test") as ns:
        yield ns


def secret(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def add_pods(kmock: Any) -> None:
    for name, role in zip(PODS, ("prefill", "decode"), strict=True):
        notes = {"agentpool.io/role": role, "agentpool.io/observed-role": role}
        meta = {"name": name, "namespace": NS, "labels": {"agentpool.io/pool": "demo"}, "annotations": notes}
        meta |= {"uid": f"uid-{name}", "resourceVersion": "1"}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": []}}
        kmock.objects[kmock.resource("v1", "pods"), NS, name] = body
    kmock.resources["v1/events"] = {}


def pod_role(kmock: Any, name: str) -> str:
    raw = kmock.objects[kmock.resource("v1", "pods"), NS, name].raw
    return str(raw["metadata"]["annotations"]["agentpool.io/role"])


async def get_json(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as resp:
        return resp.status, await resp.json()


async def ready_unavailable(http: aiohttp.ClientSession, url: str) -> Any:
    """The router's ``/ready`` body once it answers 503 (within 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        status, body = await get_json(http, url + "/ready")
        if status == 503:
            return body
        assert time.monotonic() < deadline, body


async def test_a_streamed_completion_through_directory_router_and_planner_started_from_their_clis(
    tmp_path: Path, namespace: str, kmock: Any
) -> None:
    engines = [await StandIn(f"n{i}", tokens=3).start() for i in range(2)]
    dir_token = secret(tmp_path / "directory-token", "d" * 40)
    report_token = secret(tmp_path / "report-token", "r" * 40)
    config = tmp_path / "router.json"
    nodes = [{"id": e.node_id, "url": e.url, "role": "both"} for e in engines]
    raw = {"model": "test-model", "policy": "smetric", "pageSize": 16, "nodes": nodes}
    config.write_text(json.dumps(raw))
    add_pods(kmock)
    directory, address = await start_directory(namespace, dir_token, 16)
    try:
        router, url = await start_router(
            config,
            "--directory", address, "--directory-token-file", str(dir_token),
            "--report-token-file", str(report_token), "--engine-token-file", str(engine_token_file()),
        )  # fmt: skip
        async with (
            running(
                "planner",
                "agentpool.planner",
                "--namespace",
                NS,
                "--pool",
                "demo",
                "--pool-uid",
                "pool-uid",
                "--router",
                url,
                "--kubeconfig",
                str(kubeconfig(tmp_path / "kubeconfig", str(kmock.url))),
                "--poll-interval-s",
                "0.2",
                "--warmup-s",
                "3600",
                "--state-configmap",
                "",
            ) as planner,  # fmt: skip
            aiohttp.ClientSession() as http,
        ):
            status, body = await get_json(http, url + "/ready")
            assert status == 200 and body["checks"] == {"nodes": "ok", "directory": "ok"}, body

            # a streamed chat completion of a branch: the gRPC directory learns the branch
            messages = [{"role": "user", "content": "tell me about the weather in a long sentence " * 4}]
            request = chat_body(stream=True, max_tokens=3, stream_options={"include_usage": True})
            request["messages"] = messages
            headers = {"x-agentpool-branch": "agent-1"}
            async with http.post(url + "/v1/chat/completions", json=request, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                events = await read_sse(resp)
            assert streamed_text(events) == "tok0 tok1 tok2 "
            assert events[-1] == "[DONE]"
            usage = events[-2]["usage"]
            assert usage["completion_tokens"] == 3 and usage["total_tokens"] == usage["prompt_tokens"] + 3
            assert usage["prompt_tokens_details"] == {"cached_tokens": 0}  # the engine's usage, whole
            served = [e for e in engines if e.completed]
            assert len(served) == 1
            async with DirectoryClient(address, token="d" * 40) as client:
                for _ in range(100):  # the router's Place is sent, not waited for by the request
                    resolved = await client.resolve([1, 2, 3], branch="agent-1")
                    if resolved.branch is not None and not resolved.branch.is_new:
                        break
                    await asyncio.sleep(0.05)
            assert resolved.branch is not None and not resolved.branch.is_new  # placed by the router

            # load reports need the token from the file
            report = {"node_id": engines[0].node_id, "role": "both"}
            async with http.post(url + "/agentpool/v1/report", json=report) as resp:
                assert resp.status == 401 and (await resp.json())["error"]["code"] == "invalid_token"
            auth = {"authorization": "Bearer " + "r" * 40}
            async with http.post(url + "/agentpool/v1/report", json=report, headers=auth) as resp:
                assert resp.status == 200, await resp.text()

            # the planner runs against the cluster and reads the router's work log
            await wait_until(lambda: all(pod_role(kmock, p) == "both" for p in PODS), 30, "warmup roles")
            status, work = await get_json(http, url + "/agentpool/v1/work")
            assert status == 200 and len(work["requests"]) == 1, work
            assert "not read" not in planner.text(), planner.text()

            # the directory goes away: /ready says so, requests are still served without prefixes
            assert await directory.stop() == 0
            body = await ready_unavailable(http, url)
            assert body["checks"]["nodes"] == "ok" and body["checks"]["directory"].startswith("unavailable")
            plain = chat_body(max_tokens=2)
            async with http.post(url + "/v1/chat/completions", json=plain) as resp:
                assert resp.status == 200, await resp.text()
        assert await router.stop() == 0, router.text()
        assert "router stopped" in router.text()
        assert "Traceback" not in router.text(), router.text()
    finally:
        await directory.stop()
        for e in engines:
            await e.kill()


async def test_the_router_refuses_bad_tokens_and_clashing_options(tmp_path: Path) -> None:
    config = tmp_path / "router.yaml"
    config.write_text("model: m\nnodes: [{id: a, url: 'http://127.0.0.1:9'}]\n")
    engine = ("--engine-token-file", str(engine_token_file()))

    async def refused(*args: str, env: dict[str, str] | None = None) -> str:
        router = await launch(
            "router", "agentpool.router", "--config", str(config), "--port", "0", *args, env=env
        )
        assert await router.proc.wait() == 2, router.text()
        await router.stop()
        assert "Traceback" not in router.text(), router.text()
        return router.text()

    short = secret(tmp_path / "short", "abc")
    assert "at least 16 characters" in await refused("--report-token-file", str(short), *engine)
    report = ("--report-token-file", str(secret(tmp_path / "report-token", "r" * 40)))
    text = await refused(*report, *engine, "--insecure-engines-without-token")
    assert "not both" in text, text
    text = await refused(*engine, *report, "--insecure-allow-unauthenticated-reports")
    assert "not both" in text, text
    # without a token file: the per-user one, which must be private
    open_folder = tmp_path / "open-tokens"
    open_folder.mkdir(mode=0o755)
    open_folder.chmod(0o755)
    text = await refused(*report, env={TOKEN_DIR_ENV: str(open_folder)})
    assert "open to other users" in text and "chmod 700" in text, text
    assert "at least 16 characters" in await refused(*report, "--engine-token-file", str(short))


async def test_the_router_on_the_directory_link_started_from_their_clis(
    tmp_path: Path, namespace: str
) -> None:
    """``--link-port`` on the directory and ``--directory link://HOST:PORT`` on the router: a branch's
    completion is placed over the link, /ready follows the link, the wrong token is refused."""
    engines = [await StandIn(f"n{i}", tokens=2).start() for i in range(2)]
    dir_token = secret(tmp_path / "directory-token", "d" * 40)
    wrong = secret(tmp_path / "wrong-token", "w" * 40)
    config = tmp_path / "router.json"
    nodes = [{"id": e.node_id, "url": e.url, "role": "both"} for e in engines]
    config.write_text(
        json.dumps({"model": "test-model", "policy": "smetric", "pageSize": 16, "nodes": nodes})
    )
    directory, address = await start_directory(namespace, dir_token, 16, 0, "--link-port", "0")
    link = (await directory.wait_for(r"directory link listening on (\S+)")).group(1)
    routers = []
    try:
        router, url = await start_router(
            config, "--directory", f"link://{link}", "--directory-token-file", str(dir_token),
            "--insecure-allow-unauthenticated-reports", "--engine-token-file", str(engine_token_file()),
        )  # fmt: skip
        routers.append(router)
        refused, refused_url = await start_router(
            config, "--directory", f"link://{link}", "--directory-token-file", str(wrong),
            "--insecure-allow-unauthenticated-reports", "--engine-token-file", str(engine_token_file()),
        )  # fmt: skip
        routers.append(refused)
        async with aiohttp.ClientSession() as http:
            status, body = await get_json(http, url + "/ready")
            assert status == 200 and body["checks"] == {"nodes": "ok", "directory": "ok"}, body
            status, body = await get_json(http, refused_url + "/ready")
            assert status == 503 and "UNAUTHENTICATED" in body["checks"]["directory"], body

            request = chat_body(stream=True, max_tokens=2)
            request["messages"] = [{"role": "user", "content": "the weather in a long sentence " * 6}]
            headers = {"x-agentpool-branch": "agent-7"}
            async with http.post(url + "/v1/chat/completions", json=request, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                assert streamed_text(await read_sse(resp)) == "tok0 tok1 "
            async with DirectoryClient(address, token="d" * 40) as client:
                for _ in range(100):  # the Place is not waited for by the request
                    resolved = await client.resolve([1, 2, 3], branch="agent-7")
                    if resolved.branch is not None and not resolved.branch.is_new:
                        break
                    await asyncio.sleep(0.05)
            assert resolved.branch is not None and not resolved.branch.is_new  # placed over the link

            assert await directory.stop() == 0
            body = await ready_unavailable(http, url)
            assert body["checks"]["directory"].startswith("unavailable"), body
            async with http.post(url + "/v1/chat/completions", json=chat_body(max_tokens=2)) as resp:
                assert resp.status == 200, await resp.text()  # served without prefix knowledge
        for r in routers:
            assert await r.stop() == 0, r.text()
            assert "Traceback" not in r.text(), r.text()
    finally:
        for r in routers:
            await r.stop()
        await directory.stop()
        for e in engines:
            await e.kill()
