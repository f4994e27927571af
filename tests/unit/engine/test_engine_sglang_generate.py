"""Our generate requests in SGLang's native API and its stream back (pure), and the KV mirror across a
role switch's AllBlocksCleared."""

from __future__ import annotations

import pytest
from sglang_frames import Recorder, cleared, message, stored

from agentpool.engine.errors import BadRequestError
from agentpool.engine.sglang.events import SglangKvMirror, decode_frames
from agentpool.engine.sglang.generate import (
    parse_sse_line,
    parse_transfer_id,
    sampling_params,
    transfer_id,
)
from agentpool.kv import ALL_TIERS, Tier, block_hashes


def test_openai_fields_become_sglang_sampling_params() -> None:
    body = {"max_tokens": 50, "temperature": 0.2, "top_p": 0.9, "stop": ["\n"], "seed": 7, "model": "x"}
    assert sampling_params(body, 16, 40) == {
        "max_new_tokens": 40,  # capped by the limit
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": ["\n"],
        "sampling_seed": 7,
    }
    assert sampling_params({"max_completion_tokens": 3, "max_tokens": 9}, 16, 100) == {"max_new_tokens": 3}
    assert sampling_params({}, 16, 100) == {"max_new_tokens": 16}
    for bad in ({"max_tokens": 0}, {"max_tokens": "5"}, {"max_tokens": True}, {"n": 2}):
        with pytest.raises(BadRequestError):
            sampling_params(bad, 16, 100)


def test_transfer_ids_name_the_bootstrap_port_and_room() -> None:
    assert parse_transfer_id(transfer_id(12345, 8998)) == (8998, 12345)
    for bad in ("a.1.x", "sglang-bootstrap:0:1", "sglang-bootstrap:8998", "sglang-bootstrap:x:1"):
        with pytest.raises(BadRequestError):
            parse_transfer_id(bad)


def test_stream_lines_parse_to_chunks() -> None:
    c = parse_sse_line(
        b'data: {"text": "a b", "meta_info": {"prompt_tokens": 4, "completion_tokens": 2, '
        b'"cached_tokens": 3, "finish_reason": {"type": "length", "length": 2}}}\n'
    )
    assert c is not None and (c.text, c.finish_reason, c.prompt_tokens, c.cached_tokens) == (
        "a b",
        "length",
        4,
        3,
    )
    assert parse_sse_line(b"data: [DONE]\n") is None and parse_sse_line(b"\n") is None
    running = parse_sse_line(b'data: {"text": "a", "meta_info": {"finish_reason": null}}')
    assert running is not None and running.finish_reason is None and running.error is None
    err = parse_sse_line(b'data: {"error": {"message": "too long"}}')
    assert err is not None and err.error == "too long" and err.error_status is None
    junk = parse_sse_line(b"data: {not json")
    assert junk is not None and junk.error is not None


@pytest.mark.parametrize(
    ("code", "status"),
    [("400", 400), ("422", 422), ("500", None), ('"400"', None), ("null", None), ("true", None)],
)
def test_a_stream_error_keeps_sglangs_4xx_code(code: str, status: int | None) -> None:
    """SGLang 0.5.23's stream errors: ``{"message", "type": "invalid_request_error", "code": 400, ...}``;
    a 4xx code says the request is at fault."""
    line = f'data: {{"error": {{"message": "m", "type": "invalid_request_error", "code": {code}}}}}'
    err = parse_sse_line(line.encode())
    assert err is not None and err.error == "m" and err.error_status == status


def test_a_switch_clear_keeps_the_host_tier_and_a_later_clear_does_not() -> None:
    rec = Recorder()
    mirror = SglangKvMirror(4, rec)
    tokens = list(range(12))
    ours = block_hashes(tokens, 4)
    mirror.apply(decode_frames(message(0, [stored([1, 2, 3], None, tokens, 4, "GPU")])))
    mirror.apply(decode_frames(message(1, [stored([1, 2], None, tokens[:8], 4, "CPU_PINNED")])))
    rec.events.clear()
    mirror.expect_switch_clear()
    mirror.apply(decode_frames(message(2, [cleared()])))
    assert rec.events == [("removed", ours, Tier.GPU)]
    assert [(b.block_hash, b.tiers) for b in mirror.held_blocks()] == [
        (ours[0], Tier.HOST),
        (ours[1], Tier.HOST),
    ]
    assert mirror.kept_across_switch == 2
    # SGLang stores the third block again after the switch: it chains onto the kept ones
    mirror.apply(decode_frames(message(3, [stored([3], 2, tokens[8:], 4, "GPU")])))
    assert rec.events[-1] == ("stored", [ours[2]], Tier.GPU)
    rec.events.clear()
    mirror.apply(decode_frames(message(4, [cleared()])))  # no switch expected: everything goes
    assert rec.events == [("removed", ours, ALL_TIERS)] and mirror.held_blocks() == []
