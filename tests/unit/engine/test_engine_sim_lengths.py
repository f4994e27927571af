"""The ``sim`` backend refuses a request no wait would serve, as SGLang does (400).

Without it a prompt larger than the modelled GPU KV was admitted, prefilled up to the KV and then
waited for room forever, with every request queued behind it (``agentpool replay`` of the bundled
trace on a colocated pool: a 784K-token prompt on a 700K-token node; the router timed it out on
three engines in turn and answered 502).
"""

from __future__ import annotations

import pytest

from agentpool.engine.config import EngineConfig
from agentpool.engine.errors import BadRequestError, ContextLengthError
from agentpool.engine.hostpool import HostPool
from agentpool.engine.kvstate import KvLedger, NoSink
from agentpool.engine.lengths import check_request_length
from agentpool.engine.metrics import EngineMetrics
from agentpool.engine.simbackend import SimBackend
from agentpool.node import GpuCache
from agentpool.wire.engine import GenerateRequest


def backend(**sim: int) -> SimBackend:
    cfg = EngineConfig.model_validate(
        {"nodeId": "n0", "role": "both", "insecureAllowUnauthenticated": True, "hostKvBytes": 1 << 22,
         "blockBytes": 4096, "sim": sim}
    )  # fmt: skip
    pool = HostPool(cfg.host_slots, cfg.block_bytes, None)
    return SimBackend(cfg, KvLedger(GpuCache(4096), pool, NoSink()), pool, None, None, EngineMetrics())  # type: ignore[arg-type]


def request(prompt: int, output: int) -> GenerateRequest:
    return GenerateRequest(
        request_id="r1",
        dispatch_seq=1,
        phase="both",
        endpoint="chat",
        body={"max_tokens": output},
        prompt_token_ids=list(range(prompt)),
    )


@pytest.mark.parametrize(
    ("sim", "prompt", "output", "refused"),
    [
        ({"gpuKvTokens": 10_000}, 9_000, 1_000, None),  # exactly the KV: served
        ({"gpuKvTokens": 10_000}, 9_000, 1_001, "more than this engine's 10000 tokens of GPU KV"),
        ({"gpuKvTokens": 10_000}, 10_001, 1, "more than this engine's 10000 tokens of GPU KV"),
        ({"gpuKvTokens": 10_000, "contextLength": 4_096}, 4_000, 96, None),
        ({"gpuKvTokens": 10_000, "contextLength": 4_096}, 4_000, 97, "context length of 4096"),
    ],
)
def test_a_request_over_the_context_or_the_whole_kv_is_refused(
    sim: dict[str, int], prompt: int, output: int, refused: str | None
) -> None:
    b = backend(**sim)
    if refused is None:
        assert b.admit(request(prompt, output)) is not None
        return
    with pytest.raises(BadRequestError, match=refused):
        b.admit(request(prompt, output))
    assert not b.node.queue  # nothing queued


@pytest.mark.parametrize(
    ("prompt", "output", "context", "kv", "refused"),
    [
        (100, 28, 128, None, None),
        (100, 29, 128, None, "context length of 128"),
        (100, 29, None, None, None),  # no limit known: SGLang checks its KV itself
        (100, 29, None, 128, "128 tokens of GPU KV"),
        (100, 29, 4096, 128, "128 tokens of GPU KV"),
    ],
)
def test_check_request_length(
    prompt: int, output: int, context: int | None, kv: int | None, refused: str | None
) -> None:
    if refused is None:
        check_request_length(prompt, output, context, kv)
        return
    with pytest.raises(ContextLengthError, match=refused):
        check_request_length(prompt, output, context, kv)
