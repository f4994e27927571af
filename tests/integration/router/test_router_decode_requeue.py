"""A decode node that gives a request back before decoding it (it began draining for a role switch
after the router bound the request to it) does not fail the request: the router binds another
decode node, which takes the KV from the prefill node as the first one would have."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from router_engine_standin import StandIn
from router_harness import chat_body, read_sse, router_config, start_router, streamed_text

from agentpool.wire.engine import GenerateRequest

pytestmark = pytest.mark.integration


class DrainingDecode(StandIn):
    """Hands every decode request back, as a decode engine draining for a switch to prefill does."""

    async def _decode(self, req: GenerateRequest, send: object) -> None:
        self.requeued.append(req.request_id)
        await send({"type": "requeue", "reason": f"{self.node_id}: draining"})  # type: ignore[operator]


async def test_a_decode_requeue_binds_another_decode_node() -> None:
    p = await StandIn("p", tokens=4).start()
    d1 = await DrainingDecode("d1", tokens=4).start()  # the first choice (lowest id on a tie)
    d2 = await StandIn("d2", tokens=4).start()
    cfg = router_config([("p", p.url, "prefill"), ("d1", d1.url, "decode"), ("d2", d2.url, "decode")])
    router = await start_router(cfg)
    try:
        url = f"{router.url}/v1/chat/completions"
        async with aiohttp.ClientSession() as s, s.post(url, json=chat_body(stream=True)) as r:
            assert r.status == 200
            events = await read_sse(r)
        assert events[-1] == "[DONE]"
        assert not any(isinstance(e, dict) and "error" in e for e in events), events
        assert streamed_text(events) == "first tok1 tok2 tok3 "
        assert len(d1.requeued) == 1 and len(d2.completed) == 1
    finally:
        await router.stop()
        for e in (p, d1, d2):
            await e.kill()


async def test_a_requeued_request_waits_for_room_longer_than_decode_wait() -> None:
    # The demo's lost requests: a switch D->P hands prefilled requests back (their first token is
    # out) and the one decode node left holds long decodes. Room frees when they end, after more
    # than decodeWait: the request waits for it instead of failing mid-stream.
    p = await StandIn("p", tokens=10).start()
    d1 = await DrainingDecode("d1", tokens=10).start()
    d2 = await StandIn("d2", tokens=10, token_s=0.1).start()  # a decode takes ~1 s
    cfg = router_config([("p", p.url, "prefill"), ("d1", d1.url, "decode"), ("d2", d2.url, "decode")])
    raw = cfg.model_dump(by_alias=True, mode="json")
    raw["nodes"][2]["kvCapacityTokens"] = 2_000  # room for one request of max_tokens 1,000 at a time
    raw["timeouts"]["decodeWait"] = 0.3
    router = await start_router(type(cfg).model_validate(raw))
    try:
        url = f"{router.url}/v1/chat/completions"

        async def one(i: int) -> list[object]:
            body = chat_body(f"request {i}", stream=True, max_tokens=1_000)
            async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
                assert r.status == 200
                return await read_sse(r)

        results = await asyncio.gather(one(1), one(2))
        for events in results:
            assert events[-1] == "[DONE]"
            assert not any(isinstance(e, dict) and "error" in e for e in events), events
        # whichever way the two bind, one is handed back by d1 and waits ~1 s for d2 to free room
        assert len(d2.completed) == 2 and len(d1.requeued) >= 1
    finally:
        await router.stop()
        for e in (p, d1, d2):
            await e.kill()


async def test_a_request_prefilled_as_the_pool_goes_colocated_decodes_on_a_colocated_node() -> None:
    # The demo's start: the planner's warmup turns every node colocated while a request is in
    # prefill; the only decode node hands it back. No decode node is left: a colocated node decodes it.
    p = await StandIn("a-p", tokens=4).start()
    d = await DrainingDecode("d", tokens=4).start()
    c = await StandIn("z-c", tokens=4).start()
    cfg = router_config([("a-p", p.url, "prefill"), ("d", d.url, "decode"), ("z-c", c.url, "both")])
    raw = cfg.model_dump(by_alias=True, mode="json")
    raw["timeouts"]["decodeWait"] = 0.3
    router = await start_router(type(cfg).model_validate(raw))
    try:
        url = f"{router.url}/v1/chat/completions"
        async with aiohttp.ClientSession() as s, s.post(url, json=chat_body(stream=True)) as r:
            assert r.status == 200
            events = await read_sse(r)
        assert not any(isinstance(e, dict) and "error" in e for e in events), events
        assert events[-1] == "[DONE]"
        assert len(d.requeued) == 1 and len(c.completed) == 1
        assert c.received[-1].phase == "decode" and c.received[-1].kv_source is not None
    finally:
        await router.stop()
        for e in (p, d, c):
            await e.kill()
