"""Bad input gets a 4xx with an OpenAI-style error body; a hypothesis fuzz never gets a 5xx."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from router_engine_standin import StandIn
from router_harness import Router, chat_body, router_config, start_router

from agentpool.router.auth import ReportAuth

pytestmark = pytest.mark.integration


@pytest.fixture
async def router() -> AsyncIterator[Router]:
    a = await StandIn("a", tokens=2).start()
    r = await start_router(router_config([("a", a.url, "both")], maxBodyBytes=20_000))
    yield r
    await r.stop()
    await a.kill()


def is_openai_error(body: Any) -> bool:
    return isinstance(body, dict) and isinstance(body.get("error"), dict) and "message" in body["error"]


CHAT = "/v1/chat/completions"
CASES: list[tuple[str, str, str, bytes | dict[str, Any], dict[str, str], int, str | None]] = [
    ("malformed json", "POST", CHAT, b"{not json", {}, 400, "invalid_json"),
    ("json array", "POST", CHAT, b"[1, 2]", {}, 400, "invalid_json"),
    ("unknown field", "POST", CHAT, {**chat_body(), "bogus": 1}, {}, 400, None),
    ("missing messages", "POST", CHAT, {"model": "test-model"}, {}, 400, None),
    ("empty messages", "POST", CHAT, {"model": "test-model", "messages": []}, {}, 400, None),
    (
        "bad role",
        "POST",
        CHAT,
        chat_body() | {"messages": [{"role": "wizard", "content": "x"}]},
        {},
        400,
        None,
    ),
    ("n=2", "POST", CHAT, chat_body(n=2), {}, 400, None),
    ("negative max_tokens", "POST", CHAT, chat_body(max_tokens=-1), {}, 400, None),
    ("unknown model", "POST", CHAT, chat_body() | {"model": "gpt-9"}, {}, 404, "model_not_found"),
    ("oversized body", "POST", CHAT, chat_body("x " * 20_000), {}, 413, "body_too_large"),
    ("bad branch id", "POST", CHAT, chat_body(), {"x-agentpool-branch": "a b"}, 400, "invalid_header"),
    (
        "parent without branch",
        "POST",
        CHAT,
        chat_body(),
        {"x-agentpool-parent-branch": "p"},
        400,
        "invalid_header",
    ),
    (
        "bad branch-end",
        "POST",
        CHAT,
        chat_body(),
        {"x-agentpool-branch": "b", "x-agentpool-branch-end": "yes"},
        400,
        "invalid_header",
    ),
    (
        "branch-end without branch",
        "POST",
        CHAT,
        chat_body(),
        {"x-agentpool-branch-end": "true"},
        400,
        "invalid_header",
    ),
    ("unknown route", "POST", "/v1/nope", chat_body(), {}, 404, "not_found"),
    ("wrong method", "GET", CHAT, b"", {}, 405, None),
    (
        "completion with two prompts",
        "POST",
        "/v1/completions",
        {"model": "test-model", "prompt": ["a", "b"]},
        {},
        400,
        None,
    ),
    (
        "report for unknown node",
        "POST",
        "/agentpool/v1/report",
        {"node_id": "zz", "role": "both"},
        {},
        404,
        "unknown_node",
    ),
    ("delete unknown branch", "DELETE", "/v1/branches/nobody", b"", {}, 404, "branch_not_found"),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_bad_input_is_a_4xx_with_openai_error(
    router: Router,
    method: str,
    path: str,
    body: bytes | dict[str, Any],
    headers: dict[str, str],
    status: int,
    code: str | None,
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, router.url + path, data=data, headers={"content-type": "application/json", **headers}
        ) as resp,
    ):
        payload = await resp.json(content_type=None)
    assert resp.status == status, payload
    assert is_openai_error(payload), payload
    if code is not None:
        assert payload["error"]["code"] == code


async def test_unknown_field_message_is_openai_like(router: Router) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(router.url + CHAT, json={**chat_body(), "bogus": 1}) as resp,
    ):
        payload = await resp.json()
    assert payload["error"]["message"] == "Unrecognized request argument supplied: bogus"
    assert payload["error"]["type"] == "invalid_request_error"


# ---- fuzz: the router runs in a background thread's loop, hypothesis drives it synchronously ----


class BackgroundRouter:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.router, self.standin = self._run(self._start())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def _start(self) -> tuple[Router, StandIn]:
        a = await StandIn("a", tokens=1).start()
        return await start_router(router_config([("a", a.url, "both")], maxBodyBytes=50_000)), a

    def stop(self) -> None:
        self._run(self.router.stop())
        self._run(self.standin.kill())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


@pytest.fixture(scope="module")
def background_router() -> Iterator[BackgroundRouter]:
    bg = BackgroundRouter()
    yield bg
    bg.stop()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", "x"]), "content": json_values}
    ),
    max_size=4,
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"model": st.sampled_from(["test-model", "other"]), "messages": messages},
        optional={
            "stream": json_values,
            "max_tokens": json_values,
            "temperature": json_values,
            "n": json_values,
            "stop": json_values,
            "tools": json_values,
            "extra": json_values,
        },
    ).map(lambda v: json.dumps(v).encode()),
)
header_values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30)
headers = st.dictionaries(
    st.sampled_from(["x-agentpool-branch", "x-agentpool-parent-branch", "x-agentpool-branch-end"]),
    header_values,
    max_size=3,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, hdrs=headers, path=st.sampled_from([CHAT, "/v1/completions"]))
def test_fuzz_never_5xx(
    background_router: BackgroundRouter, body: bytes, hdrs: dict[str, str], path: str
) -> None:
    host = background_router.router.url.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"content-type": "application/json", **hdrs})
        resp = conn.getresponse()
        payload = resp.read()
    finally:
        conn.close()
    assert resp.status < 500, payload
    if resp.status >= 400:
        assert is_openai_error(json.loads(payload)), payload


async def test_load_reports_need_the_report_token_when_one_is_set() -> None:
    a = await StandIn("a", tokens=2).start()
    token = "t" * 32
    r = await start_router(router_config([("a", a.url, "both")]), report_auth=ReportAuth.token(token))
    body = {"node_id": "a", "role": "both"}
    try:
        async with aiohttp.ClientSession() as http:
            for headers, status in (
                ({}, 401),
                ({"authorization": "Bearer wrong"}, 401),
                ({"authorization": f"Bearer {token}"}, 200),
            ):
                async with http.post(r.url + "/agentpool/v1/report", json=body, headers=headers) as resp:
                    payload = await resp.json()
                assert resp.status == status, payload
                if status == 401:
                    assert is_openai_error(payload) and payload["error"]["code"] == "invalid_token"
    finally:
        await r.stop()
        await a.kill()
