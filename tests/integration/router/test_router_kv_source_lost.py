"""A decode node that cannot get the KV because its prefill node is gone or refuses answers ``requeue``
with reason ``kv_source_lost`` before any output: the router places the request again from the start
on another prefill node, once (``agentpool_router_retries_total{reason="kv_source_lost"}``); a second
loss is a 503 with Retry-After, and a loss after the first token ends the stream with an error rather
than sending the token twice. A decode node that fails (``error``) is the node marked down, not the
prefill node. (With real agents and a killed prefill node:
``tests/integration/engine/test_engine_kv_source_lost.py``.)"""

from __future__ import annotations

import re

import aiohttp
import pytest
from router_engine_standin import StandIn
from router_harness import chat_body, read_sse, router_config, start_router, streamed_text

from agentpool.wire.engine import KV_SOURCE_LOST, GenerateRequest

pytestmark = pytest.mark.integration


class LosingDecode(StandIn):
    """Answers ``kv_source_lost`` for its first ``lose`` decode requests, as an SGLang decode agent
    whose prefill node died (it cannot prefill the prompt itself)."""

    lose: int = 0

    async def _decode(self, req: GenerateRequest, send: object) -> None:
        if self.lose > 0:
            self.lose -= 1
            self.requeued.append(req.request_id)
            event = {"type": "requeue", "reason": KV_SOURCE_LOST, "message": "the prefill node is gone"}
            await send(event)  # type: ignore[operator]
            return
        await super()._decode(req, send)


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def run_case(
    lose: int, first_text: str = ""
) -> tuple[int, dict[str, str], list[object], str, list[StandIn]]:
    p1 = await StandIn("p1", tokens=4, first_text=first_text).start()
    p2 = await StandIn("p2", tokens=4, first_text=first_text).start()
    d = await LosingDecode("d", tokens=4).start()
    d.lose = lose
    cfg = router_config([("p1", p1.url, "prefill"), ("p2", p2.url, "prefill"), ("d", d.url, "decode")])
    router = await start_router(cfg)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{router.url}/v1/chat/completions", json=chat_body(stream=True)) as r:
                status, headers = r.status, dict(r.headers)
                events = await read_sse(r) if r.status == 200 else [await r.json()]
            async with s.get(f"{router.url}/metrics") as r:
                metrics = await r.text()
        return status, headers, events, metrics, [p1, p2, d]
    finally:
        await router.stop()
        for e in (p1, p2, d):
            await e.kill()


async def test_a_lost_kv_is_prefilled_again_on_another_node() -> None:
    status, _, events, metrics, (p1, p2, d) = await run_case(lose=1)
    assert status == 200
    assert events[-1] == "[DONE]"
    assert not any(isinstance(e, dict) and "error" in e for e in events), events
    assert streamed_text(events) == "tok1 tok2 tok3 "  # every token once
    assert len(p1.received) == 1 and len(p2.received) == 1  # the prefill again, on the other node
    assert [r.phase for r in d.received] == ["decode", "decode"] and len(d.completed) == 1
    assert d.received[0].kv_source is not None and d.received[1].kv_source is not None
    assert d.received[0].kv_source.node_id != d.received[1].kv_source.node_id
    assert metric(metrics, 'agentpool_router_retries_total{reason="kv_source_lost"}') == 1
    assert metric(metrics, 'agentpool_router_engine_failures_total{kind="engine"}') == 0


async def test_a_second_loss_is_a_503_with_retry_after() -> None:
    status, headers, events, metrics, (p1, p2, d) = await run_case(lose=2)
    assert status == 503, events
    assert headers.get("Retry-After") == "1"
    error = events[0]
    assert isinstance(error, dict) and error["error"]["code"] == "no_capacity", error
    assert "lost 2 times" in error["error"]["message"]
    assert len(p1.received) == 1 and len(p2.received) == 1 and len(d.requeued) == 2
    assert metric(metrics, 'agentpool_router_retries_total{reason="kv_source_lost"}') == 1


async def test_a_loss_after_the_first_token_ends_the_stream_without_repeating_it() -> None:
    # a prefill node that sends the first token with `prefilled` (as `sim` does): placing the request
    # again would send it twice, so the stream ends with an error event
    status, _, events, metrics, (p1, p2, _d) = await run_case(lose=1, first_text="first ")
    assert status == 200
    assert streamed_text(events) == "first "
    assert any(isinstance(e, dict) and "error" in e for e in events), events
    assert len(p1.received) + len(p2.received) == 1
    assert metric(metrics, 'agentpool_router_retries_total{reason="kv_source_lost"}') == 0


class FailingDecode(StandIn):
    """Fails every decode request (an ``error`` event), as a broken decode engine does."""

    async def _decode(self, req: GenerateRequest, send: object) -> None:
        self.requeued.append(req.request_id)
        await send({"type": "error", "message": f"{self.node_id} broke"})  # type: ignore[operator]


async def test_a_failed_decode_node_is_marked_down_not_the_prefill_node() -> None:
    p1 = await StandIn("p1", tokens=4, first_text="").start()
    d1 = await FailingDecode("d1", tokens=4).start()  # the first choice (lowest id on a tie)
    d2 = await StandIn("d2", tokens=4).start()
    cfg = router_config([("p1", p1.url, "prefill"), ("d1", d1.url, "decode"), ("d2", d2.url, "decode")])
    router = await start_router(cfg)
    try:
        url = f"{router.url}/v1/chat/completions"
        async with aiohttp.ClientSession() as s, s.post(url, json=chat_body(stream=True)) as r:
            assert r.status == 200, await r.text()
            events = await read_sse(r)
        assert events[-1] == "[DONE]"
        assert streamed_text(events) == "tok1 tok2 tok3 "
        # d1 failed once and is down; the one prefill node was not blamed: it prefilled again
        assert len(d1.requeued) == 1 and len(d2.completed) == 1 and len(p1.received) == 2
        nodes = router.service.nodes
        assert nodes.get("d1").failures == 1 and nodes.get("p1").failures == 0
    finally:
        await router.stop()
        for e in (p1, d1, d2):
            await e.kill()
