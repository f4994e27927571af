"""A decode node that gives a request back before decoding it (it began draining for a role switch
after the router bound the request to it) does not fail the request: the router binds another
decode node, which takes the KV from the prefill node as the first one would have."""

from __future__ import annotations

import aiohttp
import pytest
from router_engine_standin import StandIn
from router_harness import chat_body, read_sse, router_config, start_router, streamed_text

from agentpool.router.engine_protocol import GenerateRequest

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
