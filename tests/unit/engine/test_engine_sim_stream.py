"""The ``sim`` backend streams a request's tokens as its node model decodes them.

On a node that prefills while it decodes (colocated, or a decode node recomputing a failed hand-over),
each iteration is a prefill chunk plus one decode step, so decoding slows down behind long prompts.
The stream used to send tokens at the pure decode pace: it ran ahead of the model, sent all but the
last token early, then nothing until the model caught up. Behind a queue of long prompts that silence
outlasted the router's 30 s between-event timeout: the demo's ``generation failed: ... timed out``
after the first token, for every request decoding on that node at once.
"""

from __future__ import annotations

import asyncio

from agentpool.engine.config import EngineConfig
from agentpool.engine.hostpool import HostPool
from agentpool.engine.kvstate import KvLedger, NoSink
from agentpool.engine.metrics import EngineMetrics
from agentpool.engine.simbackend import SimBackend
from agentpool.node import GpuCache
from agentpool.wire.engine import GenerateRequest

OUTPUT = 16


def request(i: int, prompt: int, output: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"r{i}",
        dispatch_seq=i,
        phase="both",
        endpoint="chat",
        body={"max_tokens": output},
        prompt_token_ids=[i * 1_000_000 + k for k in range(prompt)],
    )


async def test_tokens_never_run_ahead_of_the_decode_steps_on_a_node_busy_prefilling() -> None:
    cfg = EngineConfig.model_validate(
        {"nodeId": "n0", "role": "both", "insecureAllowUnauthenticated": True, "hostKvBytes": 1 << 22,
         "blockBytes": 4096}
    )  # fmt: skip
    pool = HostPool(cfg.host_slots, cfg.block_bytes, None)
    b = SimBackend(cfg, KvLedger(GpuCache(4096), pool, NoSink()), pool, None, None, EngineMetrics())  # type: ignore[arg-type]
    # real time (a faster clock turns the driver's wake-up delays into pure decode steps): three
    # prompts of 40k tokens: fifteen 8k-token chunks of about 0.25 s each
    long_prompts = [request(i, 40_000, 1) for i in range(1, 4)]
    driver = asyncio.create_task(b.run())
    try:
        job = b.admit(request(0, 500, OUTPUT))
        # queued behind it: once it decodes, the node prefills them chunk by chunk (mixed iterations)
        assert job is not None and all(b.admit(g) is not None for g in long_prompts)
        node = b.node
        sent = prefilling = 0
        ahead = []  # (tokens sent, tokens the model had produced) whenever the stream ran ahead
        async with asyncio.timeout(30):
            async for ev in job.stream():
                if ev["type"] != "token":
                    continue
                sent += 1
                prefilling += bool(node.batch or node.queue)
                if sent == 1:
                    start = job.req.finish_iter - job.req.decode_iterations(node.t_acc)
                    continue
                produced = 1 + (node.decode_position(b.now()) - start) * node.t_acc
                if sent > produced + 1e-6:
                    ahead.append((sent, round(produced, 1)))
        assert sent == OUTPUT
        assert ahead == []
        assert prefilling > OUTPUT // 2  # most tokens came while the node was prefilling
    finally:
        driver.cancel()
