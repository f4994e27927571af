"""The router end to end over real HTTP: streaming, PD hand-over, retries, drain, back-pressure."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from router_engine_standin import StandIn
from router_harness import (
    Router,
    chat_body,
    read_sse,
    router_config,
    start_router,
    streamed_text,
    wait_until,
    write_config,
)

from agentpool.router.config import ConfigFile

pytestmark = pytest.mark.integration


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
        yield s


async def engines(*ids: str, **kw: object) -> list[StandIn]:
    return [await StandIn(i, **kw).start() for i in ids]  # type: ignore[arg-type]


async def stop_all(router: Router, standins: list[StandIn]) -> None:
    await router.stop()
    for s in standins:
        await s.kill()


async def test_streaming_chat_end_to_end(http: aiohttp.ClientSession) -> None:
    (a,) = await engines("a", tokens=4)
    router = await start_router(router_config([("a", a.url, "both")]))
    try:
        body = chat_body(stream=True, stream_options={"include_usage": True})
        async with http.post(f"{router.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            events = await read_sse(resp)
        assert events[-1] == "[DONE]"
        chunks = [e for e in events if isinstance(e, dict)]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert streamed_text(events) == "tok0 tok1 tok2 tok3 "
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == 4 and chunks[-1]["choices"] == []
        assert a.received[0].phase == "both" and a.received[0].prompt_token_ids
        async with http.get(f"{router.url}/metrics") as resp:
            text = await resp.text()
        assert 'agentpool_router_ttft_seconds_count{policy="least-loaded"} 1.0' in text
        assert 'agentpool_router_decisions_total{node="a",phase="prefill",policy="least-loaded"} 1.0' in text
        assert 'agentpool_router_queue_depth_requests{node="a"} 0.0' in text
    finally:
        await stop_all(router, [a])


async def test_non_streaming_chat_and_completion(http: aiohttp.ClientSession) -> None:
    (a,) = await engines("a", tokens=3)
    router = await start_router(router_config([("a", a.url, "both")]))
    try:
        async with http.post(f"{router.url}/v1/chat/completions", json=chat_body()) as resp:
            body = await resp.json()
        assert resp.status == 200, body
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "tok0 tok1 tok2 "}
        assert body["usage"]["completion_tokens"] == 3
        assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}  # the engine's, passed on
        comp = {"model": "test-model", "prompt": "once upon a time", "max_tokens": 2}
        async with http.post(f"{router.url}/v1/completions", json=comp) as resp:
            body = await resp.json()
        assert body["object"] == "text_completion" and body["choices"][0]["text"] == "tok0 tok1 "
        async with http.get(f"{router.url}/v1/models") as resp:
            listed = (await resp.json())["data"][0]
        assert listed["id"] == "test-model" and "max_model_len" not in listed  # no context configured
        for path in ("/health", "/ready"):
            async with http.get(router.url + path) as resp:
                assert resp.status == 200
    finally:
        await stop_all(router, [a])


async def test_a_served_request_ends_the_nodes_failure_streak(http: aiohttp.ClientSession) -> None:
    """The next failure's cool-down starts from 2 s again once the node served a request (the flow
    is closed right after its last item, streamed or not)."""
    (a,) = await engines("a", tokens=2)
    router = await start_router(router_config([("a", a.url, "both")]))
    try:
        for stream in (False, True):
            router.service.nodes.get("a").failures = 3
            async with http.post(f"{router.url}/v1/chat/completions", json=chat_body(stream=stream)) as resp:
                assert resp.status == 200
                await resp.read()
            assert router.service.nodes.get("a").failures == 0
    finally:
        await stop_all(router, [a])


async def test_disaggregated_prefill_then_decode_with_kv_handover(http: aiohttp.ClientSession) -> None:
    p, d1, d2 = await engines("p", "d1", "d2", tokens=4)
    nodes = [("p", p.url, "prefill"), ("d1", d1.url, "decode"), ("d2", d2.url, "decode")]
    router = await start_router(router_config(nodes, policy="evolving"))
    try:
        async with http.post(f"{router.url}/v1/chat/completions", json=chat_body(stream=True)) as resp:
            events = await read_sse(resp)
        assert streamed_text(events) == "first tok1 tok2 tok3 "
        assert [r.phase for r in p.received] == ["prefill"]
        decoded = d1.received + d2.received
        assert len(decoded) == 1 and decoded[0].phase == "decode"
        assert decoded[0].kv_source is not None and decoded[0].kv_source.node_id == "p"
        assert p.transfers == {}  # the decode node pulled the KV
        # the router's bookkeeping is empty again: nothing leaks
        assert all(not e.prefills and not e.decodes for e in router.service.nodes.entries())
    finally:
        await stop_all(router, [p, d1, d2])


async def test_killed_engine_mid_queue_loses_no_request(http: aiohttp.ClientSession) -> None:
    a, b = await engines("a", "b", prefill_s=1.0, tokens=2)
    router = await start_router(
        router_config([("a", a.url, "both"), ("b", b.url, "both")], policy="round-robin")
    )
    try:

        async def one(i: int) -> tuple[int, str]:
            async with http.post(f"{router.url}/v1/chat/completions", json=chat_body(f"req {i}")) as resp:
                body = await resp.json()
                return resp.status, body["choices"][0]["message"]["content"] if resp.status == 200 else str(
                    body
                )

        tasks = [asyncio.create_task(one(i)) for i in range(6)]
        await wait_until(lambda: len(a.received) == 3, what="a has one running and two queued")
        assert not a.completed
        await a.kill()
        results = await asyncio.gather(*tasks)
        assert results == [(200, "tok0 tok1 ")] * 6
        assert len(b.completed) == 6
        async with http.get(f"{router.url}/metrics") as resp:
            text = await resp.text()
        assert 'agentpool_router_retries_total{reason="engine_failure"} 3.0' in text
    finally:
        await stop_all(router, [a, b])


async def test_failure_after_first_token_ends_stream_with_error(http: aiohttp.ClientSession) -> None:
    (a,) = await engines("a", tokens=4, fail_after_tokens=2)
    router = await start_router(router_config([("a", a.url, "both")]))
    try:
        async with http.post(f"{router.url}/v1/chat/completions", json=chat_body(stream=True)) as resp:
            assert resp.status == 200
            events = await read_sse(resp)
        assert streamed_text(events) == "tok0 tok1 "
        assert events[-2]["error"]["code"] == "engine_failed"
        assert events[-1] == "[DONE]"
        async with http.post(f"{router.url}/v1/chat/completions", json=chat_body()) as resp:
            assert resp.status == 502
            assert (await resp.json())["error"]["type"] == "server_error"
    finally:
        await stop_all(router, [a])


async def test_all_engines_down_gives_502_after_bounded_retries(http: aiohttp.ClientSession) -> None:
    a, b = await engines("a", "b")
    router = await start_router(router_config([("a", a.url, "both"), ("b", b.url, "both")], maxRetries=1))
    await a.kill()
    await b.kill()
    try:
        async with http.post(f"{router.url}/v1/chat/completions", json=chat_body()) as resp:
            assert resp.status == 502
            assert (await resp.json())["error"]["code"] == "engine_failed"
    finally:
        await stop_all(router, [a, b])


async def test_back_pressure_429_with_retry_after(http: aiohttp.ClientSession) -> None:
    (a,) = await engines("a", prefill_s=1.0)
    router = await start_router(router_config([("a", a.url, "both")], maxQueuePerNode=1, retryAfter=3))
    try:
        first = asyncio.create_task(http.post(f"{router.url}/v1/chat/completions", json=chat_body()))
        await wait_until(lambda: len(a.received) == 1, what="the first request on a")
        async with http.post(f"{router.url}/v1/chat/completions", json=chat_body()) as resp:
            assert resp.status == 429
            assert resp.headers["Retry-After"] == "3"
            assert (await resp.json())["error"]["code"] == "overloaded"
        async with await first as resp:
            assert resp.status == 200
    finally:
        await stop_all(router, [a])


async def test_role_change_reloads_config_drains_and_reroutes(
    http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    a, b = await engines("a", "b", prefill_s=1.0, tokens=2)
    path = tmp_path / "router.json"
    config = router_config([("a", a.url, "both"), ("b", b.url, "both")], policy="round-robin")
    write_config(path, config)
    router = await start_router(ConfigFile(path).load(), config_file=ConfigFile(path))
    router.service.config_file.load()  # type: ignore[union-attr]
    try:

        async def one(i: int) -> int:
            async with http.post(f"{router.url}/v1/chat/completions", json=chat_body(f"r{i}")) as resp:
                await resp.read()
                return resp.status

        tasks = [asyncio.create_task(one(i)) for i in range(4)]
        await wait_until(lambda: len(a.received) == 2, what="one running, one queued on a")
        assert not a.completed
        # the planner turns a into a decode node: a gives its queued request back, the router re-routes it
        a.draining = True
        new = router_config(
            [("a", a.url, "decode"), ("b", b.url, "both")], policy="smetric", slo={"ttftBase": 7}
        )
        write_config(path, new)
        for _ in range(40):
            await asyncio.sleep(0.05)
            if router.service.routing.policy.name == "smetric":
                break
        assert router.service.routing.policy.name == "smetric"
        assert router.service.routing.ctx.slo.base == 7.0
        assert await asyncio.gather(*tasks) == [200] * 4
        assert len(a.requeued) == 1 and len(a.completed) == 1
        assert len(b.completed) == 3
        # new work does not go to the draining node
        assert await one(9) == 200
        assert len(a.received) == 2 and len(b.completed) == 4
    finally:
        await stop_all(router, [a, b])


async def test_hung_engine_times_out_and_the_request_moves_on(http: aiohttp.ClientSession) -> None:
    (slow,) = await engines("a", prefill_s=30.0)
    (fast,) = await engines("b")
    timeouts = {"connect": 1.0, "firstEvent": 5.0, "betweenEvents": 0.3, "directory": 1.0}
    nodes = [("a", slow.url, "both"), ("b", fast.url, "both")]
    router = await start_router(router_config(nodes, policy="round-robin", timeouts=timeouts))
    try:
        async with http.post(f"{router.url}/v1/chat/completions", json=chat_body()) as resp:
            assert resp.status == 200, await resp.text()
        assert len(slow.received) == 1 and len(fast.completed) == 1
    finally:
        await stop_all(router, [slow, fast])


async def test_headerless_sessions_leave_no_state_behind(http: aiohttp.ClientSession) -> None:
    a, b = await engines("a", "b", tokens=1)
    router = await start_router(router_config([("a", a.url, "both"), ("b", b.url, "both")], policy="smetric"))
    try:
        history: list[dict[str, str]] = []
        for turn in range(30):
            history += [{"role": "user", "content": f"step {turn} " * 20}]
            body = chat_body() | {"messages": history}
            async with http.post(f"{router.url}/v1/chat/completions", json=body) as resp:
                answer = (await resp.json())["choices"][0]["message"]["content"]
            history.append({"role": "assistant", "content": answer})
        view = router.service.directory
        assert len(view.directory.branches) == 0  # type: ignore[attr-defined]
        assert all(not e.prefills and not e.decodes for e in router.service.nodes.entries())
        assert len(a.completed) + len(b.completed) == 30
    finally:
        await stop_all(router, [a, b])


async def test_router_view_moves_a_request_from_queue_to_decode_at_its_first_token(
    http: aiohttp.ClientSession,
) -> None:
    (a,) = await engines("a", prefill_s=0.3, token_s=0.5, tokens=3)
    router = await start_router(router_config([("a", a.url, "both")]))
    try:
        task = asyncio.create_task(http.post(f"{router.url}/v1/chat/completions", json=chat_body()))

        def state() -> tuple[int, int]:
            (node,) = router.service.nodes.snapshot(0.0)
            return node.unreported.requests, node.running_decode

        await wait_until(lambda: len(a.received) == 1, what="the request on a")
        assert state() == (1, 0)  # queued until its first token
        await wait_until(lambda: state() != (1, 0), what="the first token")
        assert state() == (0, 1)  # prefill done, first token out, decoding
        async with await task as resp:
            assert resp.status == 200
        (done,) = router.service.nodes.snapshot(0.0)
        assert (done.unreported.requests, done.running_decode) == (0, 0)
    finally:
        await stop_all(router, [a])


async def test_front_door_uses_the_configured_hf_tokenizer(
    http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "<|user|>", "<|assistant|>", "hello", "world"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    template = "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}<|assistant|>"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    (a,) = await engines("a", tokens=1)
    router = await start_router(router_config([("a", a.url, "both")], tokenizer=str(tmp_path)))
    try:
        async with http.post(f"{router.url}/v1/chat/completions", json=chat_body("hello world")) as resp:
            assert resp.status == 200
        assert a.received[0].prompt_token_ids == [1, 3, 4, 2]
    finally:
        await stop_all(router, [a])


async def test_client_disconnect_mid_stream_stops_the_engine_stream(http: aiohttp.ClientSession) -> None:
    (a,) = await engines("a", token_s=0.2, tokens=50)
    router = await start_router(router_config([("a", a.url, "both")]))
    try:
        resp = await http.post(
            f"{router.url}/v1/chat/completions", json=chat_body(stream=True, max_tokens=50)
        )
        assert resp.status == 200
        await resp.content.readline()  # the role chunk
        resp.close()  # drop the connection
        for _ in range(40):
            await asyncio.sleep(0.05)
            if all(not e.prefills and not e.decodes for e in router.service.nodes.entries()):
                break
        assert all(not e.prefills and not e.decodes for e in router.service.nodes.entries())
        for _ in range(40):  # the router closed its engine stream: the engine's next write fails
            await asyncio.sleep(0.05)
            if a.aborted:
                break
        assert a.aborted == [a.received[0].request_id] and a.completed == []
        async with http.get(f"{router.url}/metrics") as m:
            assert 'agentpool_router_requests_total{code="499",endpoint="chat"} 1.0' in await m.text()
    finally:
        await stop_all(router, [a])


async def long_chat(http: aiohttp.ClientSession, router: Router, i: int) -> int:
    """The status of a chat completion that asks for 1,000 tokens (more than a decode node's room)."""
    body = chat_body(f"request {i}", max_tokens=1_000)
    async with http.post(f"{router.url}/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


async def test_prefilled_request_waits_for_decode_kv_room(http: aiohttp.ClientSession) -> None:
    # one decode node with room for one request at a time: the second waits for the first to finish
    p = (await engines("p", tokens=2))[0]
    d = (await engines("d", tokens=3, token_s=0.1))[0]
    config = router_config([("p", p.url, "prefill"), ("d", d.url, "decode")], policy="evolving")
    need = 2_000
    raw = config.model_dump(by_alias=True, mode="json")
    raw["nodes"][1]["kvCapacityTokens"] = need
    raw["timeouts"]["decodeWait"] = 5.0
    router = await start_router(type(config).model_validate(raw))
    try:
        assert await asyncio.gather(long_chat(http, router, 1), long_chat(http, router, 2)) == [200, 200]
        assert len(d.completed) == 2
    finally:
        await stop_all(router, [p, d])


async def test_decode_wait_max_bounds_the_wait_for_room(http: aiohttp.ClientSession) -> None:
    # room would free (the decode node has a decode running), but not within decodeWaitMax: the
    # waiting request fails with 503 before its first token, the other completes
    p = (await engines("p", tokens=2))[0]
    d = (await engines("d", tokens=20, token_s=0.1))[0]  # a decode takes ~2 s
    config = router_config([("p", p.url, "prefill"), ("d", d.url, "decode")], policy="evolving")
    raw = config.model_dump(by_alias=True, mode="json")
    raw["nodes"][1]["kvCapacityTokens"] = 2_000
    raw["timeouts"]["decodeWait"] = 5.0
    raw["timeouts"]["decodeWaitMax"] = 0.3
    router = await start_router(type(config).model_validate(raw))
    try:
        assert sorted(await asyncio.gather(long_chat(http, router, 1), long_chat(http, router, 2))) == [
            200,
            503,
        ]
        assert len(d.completed) == 1
    finally:
        await stop_all(router, [p, d])
