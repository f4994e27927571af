"""Bad input is the client's fault: a 4xx OpenAI error, never a 5xx, never an engine marked down.

Found by fuzzing a running router: lone surrogates passed validation and failed when forwarded, and
the router marked every engine down in turn; deep nesting, huge integers and ``1e309`` were plain-text
500s; ``"stream": "yes"`` was accepted. Forged load reports switched roles. A slow body held a
connection forever.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from router_engine_standin import StandIn
from router_harness import Router, chat_body, router_config, start_router

from agentpool.router.auth import ReportAuth

pytestmark = pytest.mark.integration
CHAT = "/v1/chat/completions"
LIMITS = {"maxJsonDepth": 16, "maxMessages": 8, "maxOutputTokens": 1000, "maxPromptTokens": 4000}


@pytest.fixture
async def engines() -> AsyncIterator[list[StandIn]]:
    es = [await StandIn(f"n{i}", tokens=2, reject_marker="REJECT-ME").start() for i in range(2)]
    yield es
    for e in es:
        await e.kill()


@pytest.fixture
async def router(engines: list[StandIn]) -> AsyncIterator[Router]:
    nodes = [(e.node_id, e.url, "both") for e in engines]
    r = await start_router(router_config(nodes, limits=LIMITS, maxBodyBytes=200_000))
    yield r
    await r.stop()


def no_node_down(router: Router) -> bool:
    return all(e.down_until == float("-inf") for e in router.service.nodes.entries())


def engine_failures(router: Router, cause: str) -> float:
    value = router.service.metrics.registry.get_sample_value(
        "agentpool_router_engine_failures_total", {"cause": cause}
    )
    return value or 0.0


def raw_chat(**fields: str) -> bytes:
    """A chat body with ``fields`` spliced in as raw JSON text (for what json.dumps cannot write)."""
    body = json.dumps(chat_body())
    extra = "".join(f', "{k}": {v}' for k, v in fields.items())
    return (body[:-1] + extra + "}").encode()


def nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


BAD: list[tuple[str, bytes, str | None]] = [
    ("lone surrogate in user", raw_chat(user='"\\ud800"'), "invalid_json"),
    ("lone low surrogate in content", json.dumps(chat_body("x")).replace('"x"', '"\\udc00"').encode(), None),
    ("raw surrogate bytes", raw_chat()[:-1] + b', "user": "\xed\xa0\x80"}', "invalid_json"),
    ("invalid utf-8", raw_chat()[:-1] + b', "user": "\xff"}', "invalid_json"),
    ("deep nesting", raw_chat(metadata=nested(100)), "invalid_json"),
    ("very deep nesting", raw_chat(tools="[" * 50_000 + "]" * 50_000), "invalid_json"),
    ("int over 4300 digits", raw_chat(seed="9" * 5000), "invalid_json"),
    ("int over 64 bits", raw_chat(seed=str(2**63)), None),
    (
        "max_tokens 1e309",
        json.dumps(chat_body()).replace('"max_tokens": 4', '"max_tokens": 1e309').encode(),
        None,
    ),
    ("NaN", raw_chat(temperature="NaN"), "invalid_json"),
    ("stream yes", json.dumps(chat_body(stream="yes")).encode(), "invalid_value"),
    ("max_tokens true", json.dumps(chat_body(max_tokens=True)).encode(), "invalid_value"),
    ("max_tokens float", json.dumps(chat_body(max_tokens=4.0)).encode(), "invalid_value"),
    ("temperature string", json.dumps(chat_body(temperature="0.5")).encode(), "invalid_value"),
    ("max_tokens over the cap", json.dumps(chat_body(max_tokens=1001)).encode(), "invalid_value"),
    (
        "too many messages",
        json.dumps(chat_body() | {"messages": [{"role": "user", "content": "hi"}] * 9}).encode(),
        "too_many_messages",
    ),
    ("prompt over the cap", json.dumps(chat_body("word " * 6000)).encode(), "context_length_exceeded"),
]


@pytest.mark.parametrize(("body", "code"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
async def test_bad_bodies_are_400_openai_errors_and_reach_no_engine(
    router: Router, engines: list[StandIn], body: bytes, code: str | None
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(router.url + CHAT, data=body, headers={"content-type": "application/json"}) as resp,
    ):
        payload = await resp.json(content_type=None)
    assert resp.status == 400, payload
    assert resp.content_type == "application/json"
    assert set(payload["error"]) == {"message", "type", "param", "code"}, payload
    assert payload["error"]["type"] == "invalid_request_error"
    if code is not None:
        assert payload["error"]["code"] == code, payload
    assert not any(e.received for e in engines)
    assert no_node_down(router)


@pytest.mark.parametrize("in_stream", [False, True], ids=["http-400", "error-event-400"])
async def test_an_engine_refusing_the_content_is_not_marked_down(
    router: Router, engines: list[StandIn], in_stream: bool
) -> None:
    for e in engines:
        e.reject_in_stream = in_stream
    async with aiohttp.ClientSession() as http:
        for _ in range(3):  # each would have marked one more engine down
            async with http.post(router.url + CHAT, json=chat_body("please REJECT-ME")) as resp:
                payload = await resp.json()
            assert resp.status == 400, payload
            assert payload["error"]["code"] == "rejected_by_engine"
        assert sum(len(e.received) for e in engines) == 3  # one engine each time: no retry elsewhere
        assert no_node_down(router)
        assert engine_failures(router, "request") == 3 and engine_failures(router, "engine") == 0
        for _ in range(4):
            async with http.post(router.url + CHAT, json=chat_body("a normal question")) as resp:
                assert resp.status == 200, await resp.text()


@pytest.mark.parametrize(
    ("prompt", "said"),
    [
        ("a TOO-LONG prompt", "more than this engine's context length"),  # a 400 with its error type
        ("a TOO-LONG-IN-STREAM prompt", "longer than the model's context length"),  # an error event
    ],
    ids=["refused at once", "refused in the stream"],
)
async def test_an_engine_refusing_a_request_as_too_long_answers_context_length_exceeded(
    router: Router, engines: list[StandIn], prompt: str, said: str
) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(router.url + CHAT, json=chat_body(prompt)) as resp:
                payload = await resp.json()
            assert resp.status == 400, payload
            assert payload["error"]["code"] == "context_length_exceeded", payload
            assert said in payload["error"]["message"]
        assert sum(len(e.received) for e in engines) == 3  # no retry elsewhere
        assert no_node_down(router)


async def test_a_dead_engine_is_still_marked_down_and_the_cause_is_logged(
    router: Router, engines: list[StandIn], caplog: pytest.LogCaptureFixture
) -> None:
    await engines[0].kill()
    caplog.set_level(logging.WARNING, logger="agentpool.router.flow")
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(router.url + CHAT, json=chat_body()) as resp:
                assert resp.status == 200, await resp.text()
                answered = (await resp.json())["id"]
    assert router.service.nodes.get("n0").down_until > 0
    assert engine_failures(router, "engine") >= 1
    failed = [r.getMessage() for r in caplog.records if "engine n0 failed" in r.getMessage()]
    assert failed, caplog.text
    assert failed[0].startswith("request chatcmpl-") and "sending it nothing for 2 s" in failed[0]
    assert engines[0].url.split("//")[1] in failed[0] or "refused" in failed[0].lower(), failed[0]
    assert answered.startswith("chatcmpl-")


async def test_forged_reports_are_rejected_and_change_nothing() -> None:
    a = await StandIn("a", tokens=2).start()
    token = "s3cret-" * 5
    r = await start_router(router_config([("a", a.url, "both")]), report_auth=ReportAuth.token(token))
    forged = {"node_id": "a", "role": "both", "desired_role": "decode", "accepting": False}
    try:
        async with aiohttp.ClientSession() as http:
            for auth in (
                None,
                "",
                "Bearer",
                f"bearer {token}",
                f"Bearer {token}x",
                f"Bearer {token[:-1]}",
                token,
            ):
                headers = {} if auth is None else {"authorization": auth}
                async with http.post(r.url + "/agentpool/v1/report", json=forged, headers=headers) as resp:
                    payload = await resp.json()
                assert resp.status == 401, (auth, payload)
                assert payload["error"]["type"] == "authentication_error"
                assert resp.headers["WWW-Authenticate"] == "Bearer"
            entry = r.service.nodes.get("a")
            assert entry.role.value == "both" and not entry.draining and entry.report is None
            rejected = r.service.metrics.registry.get_sample_value("agentpool_router_rejected_reports_total")
            assert rejected == 7
            async with http.post(r.url + CHAT, json=chat_body()) as resp:  # the pool still serves
                assert resp.status == 200
            honest = {"node_id": "a", "role": "both"}
            headers = {"authorization": f"Bearer {token}"}
            async with http.post(r.url + "/agentpool/v1/report", json=honest, headers=headers) as resp:
                assert resp.status == 200
            assert r.service.nodes.get("a").report is not None
    finally:
        await r.stop()
        await a.kill()


async def test_a_slow_or_partial_body_gets_408_and_the_connection_is_closed() -> None:
    a = await StandIn("a", tokens=2).start()
    timeouts = {"connect": 1.0, "firstEvent": 5.0, "betweenEvents": 5.0, "body": 0.3}
    r = await start_router(router_config([("a", a.url, "both")], timeouts=timeouts))
    host, port = r.url.removeprefix("http://").split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        head = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += "Content-Length: 1000\r\n\r\n"
        writer.write(head.encode() + b'{"model": "test-model", ')
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=5)  # read() to EOF: the router closes
        writer.close()
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line.startswith(b"HTTP/1.1 408"), answer
        body = json.loads(rest.partition(b"\r\n\r\n")[2])
        assert body["error"]["type"] == "invalid_request_error"
        assert not a.received
        async with aiohttp.ClientSession() as http, http.post(r.url + CHAT, json=chat_body()) as resp:
            assert resp.status == 200  # and the router still serves
    finally:
        await r.stop()
        await a.kill()


# ---- a bounded mutation fuzz -----------------------------------------------------------------


SEEDS: list[dict[str, Any]] = [
    chat_body("hello there, how are you?"),
    chat_body("stream me", stream=True, stream_options={"include_usage": True}),
    chat_body(
        "tools", tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    ),
    {"model": "test-model", "prompt": "once upon a time", "max_tokens": 2},
]
ODD_VALUES: list[Any] = [
    None, True, "yes", "", "\ud800", "x\udfffy", 0, -1, 2**63 - 1, 1.5, [], {}, [[[[[]]]]], "🙂", "\u0000",
]  # fmt: skip


def mutate_value(rng: random.Random, body: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(body))
    target: Any = out
    key: Any = rng.choice(list(target))
    while isinstance(target[key], dict | list) and target[key] and rng.random() < 0.6:
        target = target[key]
        key = rng.choice(list(target)) if isinstance(target, dict) else rng.randrange(len(target))
    choice = rng.random()
    if choice < 0.7:
        target[key] = rng.choice(ODD_VALUES)
    elif choice < 0.85:
        target[key] = json.loads(nested(rng.choice((5, 20, 80))))
    elif isinstance(target, dict):
        target.pop(key)
    return out


def encode_mutant(rng: random.Random, body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode("utf-8", "surrogatepass")  # keep lone surrogates as escapes or bytes
    kind = rng.random()
    if kind < 0.15 and len(raw) > 2:
        return raw[: rng.randrange(1, len(raw))]  # truncated
    if kind < 0.3:
        data = bytearray(raw)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if kind < 0.4:
        return raw.replace(b"4", b"9" * rng.choice((20, 400, 5000)), 1)  # huge integers
    if kind < 0.45:
        return raw.replace(b"4", b"1e309", 1)
    return raw


async def test_fuzzed_requests_never_get_a_5xx_nor_mark_an_engine_down(
    router: Router, engines: list[StandIn]
) -> None:
    rng = random.Random(16)
    statuses: dict[int, int] = {}
    sem = asyncio.Semaphore(8)

    async def one(http: aiohttp.ClientSession, i: int) -> None:
        seed = SEEDS[i % len(SEEDS)]
        path = "/v1/completions" if "prompt" in seed else CHAT
        body = seed
        for _ in range(rng.choice((0, 1, 1, 2))):
            body = mutate_value(rng, body)
        data = encode_mutant(rng, body)
        async with (
            sem,
            http.post(router.url + path, data=data, headers={"content-type": "application/json"}) as r,
        ):
            raw = await r.read()
        statuses[r.status] = statuses.get(r.status, 0) + 1
        assert r.status < 500, (data[:300], raw[:300])
        if r.status >= 400:
            payload = json.loads(raw)
            assert set(payload["error"]) == {"message", "type", "param", "code"}, raw

    async with aiohttp.ClientSession() as http:
        await asyncio.wait_for(asyncio.gather(*(one(http, i) for i in range(300))), timeout=120)
        assert statuses.get(400, 0) > 100 and statuses.get(200, 0) > 10, statuses  # both kinds were tried
        assert no_node_down(router), statuses
        assert engine_failures(router, "engine") == 0
        for _ in range(10):  # and the pool still serves normal requests
            async with http.post(router.url + CHAT, json=chat_body()) as resp:
                assert resp.status == 200, await resp.text()
