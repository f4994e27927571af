"""Trace loaders: dependencies, pauses, produced blocks, key spaces; synthetic generators."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from agentpool.sim.presets import preset
from agentpool.sim.run import Scenario, bundled_trace_path, load_conversations, load_trace_for
from agentpool.sim.synthetic import generator
from agentpool.sim.trace import (
    INSTANCE_STRIDE,
    Conversation,
    TraceError,
    TraceRequest,
    cap_context,
    load_claude_code,
    load_mooncake,
)


def _row(
    agent: str, parent: str | None, turn: int, t: float, inp: int, out: int, ids: list[int], **kw: float
) -> str:
    row = {
        "session_id": "s1",
        "agent_id": agent,
        "parent_agent_id": parent,
        "turn": turn,
        "t": t,
        "input_length": inp,
        "output_length": out,
        "hash_ids": ids,
        "block_size": 64,
        "api_time": kw.get("api", 1.0),
        "think_time": kw.get("think", 0.0),
    }
    return json.dumps(row)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    lines = [
        _row("s1", None, 1, 0.0, 200, 70, [1, 2, 3], api=2.0),
        # sub-agent spawned 10 s into the main agent's first request's pause
        _row("s1/SA1", "s1", 1, 12.0, 130, 10, [9, 10]),
        _row("s1", None, 2, 7.0, 330, 5, [1, 2, 3, 4, 5], api=1.0, think=5.0),
        # compaction: the prompt no longer extends the previous one
        _row("s1", None, 3, 20.0, 140, 5, [1, 6], think=12.0),
    ]
    p = tmp_path / "t.jsonl.gz"
    with gzip.open(p, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    return p


def test_claude_code_dependencies_pauses_and_produced_blocks(trace: Path) -> None:
    (conv,) = load_claude_code(trace)
    # recorded order by t: main 1 (t=0), main 2 (t=7), sub 1 (t=12), main 3 (t=20)
    assert [(r.agent, r.turn) for r in conv.requests] == [(0, 1), (0, 2), (1, 1), (0, 3)]
    assert [r.depends_on for r in conv.requests] == [-1, 0, 1, 1]
    assert conv.requests[1].delay_s == 5.0  # recorded think time
    # the sub-agent waits for its parent's latest request (main turn 2, t=7, api 1 s): 12 - 8 = 4 s
    assert conv.requests[2].delay_s == pytest.approx(4.0)
    # main turn 1's output (70 tokens) completes block 4 = (200 + 70) // 64; block 5 comes from the tool
    assert conv.requests[0].produced.tolist() == [4]
    assert conv.requests[1].produced.tolist() == []  # the next prompt was compacted
    assert [r.last_of_agent for r in conv.requests] == [False, False, True, True]
    assert conv.children == ((1,), (2, 3), (), ())


def test_block_keys_separate_instances_and_share_the_system_prefix(trace: Path) -> None:
    (conv,) = load_claude_code(trace)
    a, produced = conv.block_keys(0, instance=7, shared_prefix_blocks=2)
    b, _ = conv.block_keys(0, instance=8, shared_prefix_blocks=2)
    assert a[:2] == b[:2] == [1, 2]  # the shared prefix is the same everywhere
    assert a[2] == 7 * INSTANCE_STRIDE + 3 and b[2] == 8 * INSTANCE_STRIDE + 3
    assert produced == [7 * INSTANCE_STRIDE + 4]
    # coarse blocks: groups of 2 trace blocks keyed by their last id
    coarse, coarse_out = conv.block_keys(1, instance=7, shared_prefix_blocks=0, group=2)
    assert coarse_out == []
    assert coarse == [7 * INSTANCE_STRIDE + 2, 7 * INSTANCE_STRIDE + 4]


def test_limit_and_malformed_lines(tmp_path: Path, trace: Path) -> None:
    assert len(load_claude_code(trace, limit=1)) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session_id": "x"}\n')
    with pytest.raises(TraceError, match="missing field"):
        load_claude_code(bad)
    bad.write_text("not json\n")
    with pytest.raises(TraceError, match="not JSON"):
        load_claude_code(bad)


def test_mooncake_loader(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text(
        json.dumps({"timestamp": 1500, "input_length": 1100, "output_length": 10, "hash_ids": [1, 2]}) + "\n"
    )
    ((at, conv),) = load_mooncake(p)
    assert at == 1.5 and conv.block_size == 512 and conv.requests[0].blocks.tolist() == [1, 2]


def test_bundled_sample_loads_with_sub_agents() -> None:
    convs = load_claude_code(bundled_trace_path(), limit=40)
    assert len(convs) == 40
    assert any(r.agent > 0 for c in convs for r in c.requests)
    for c in convs:
        for i, r in enumerate(c.requests):
            assert r.depends_on < i and r.delay_s >= 0
            assert len(r.blocks) == r.input_tokens // 64 or len(r.blocks) <= r.input_tokens // 64 + 1


def test_synthetic_generators_are_seeded_and_shaped() -> None:
    a = [generator("putnam", 3)() for _ in range(3)]
    b = [generator("putnam", 3)() for _ in range(3)]
    assert [len(c.requests) for c in a] == [len(c.requests) for c in b]
    assert all(
        np.array_equal(x.blocks, y.blocks)
        for c, d in zip(a, b, strict=True)
        for x, y in zip(c.requests, d.requests, strict=True)
    )
    put = [r for c in a for r in c.requests]
    osw = [r for _ in range(5) for r in generator("osworld", 1)().requests]
    # decode-heavy vs prefill-heavy: output per input token differs by an order of magnitude
    put_ratio = sum(r.output_tokens for r in put) / sum(r.input_tokens for r in put)
    os_ratio = sum(r.output_tokens for r in osw) / sum(r.input_tokens for r in osw)
    assert put_ratio > 10 * os_ratio
    with pytest.raises(ValueError):
        generator("chess", 0)


def _tr(agent: int, inp: int, dep: int) -> TraceRequest:
    blocks = np.arange(1, inp // 64 + 1, dtype=np.int64)
    return TraceRequest(agent, 1, inp, 10, blocks, blocks[:0], dep, 1.0)


# main 0 -> main 1 -> main 3; sub-agent (agent 1) 2 spawned after main 1, its turn 4 after 2
_SHAPE = [(0, 100, -1), (0, 200, 0), (1, 300, 1), (0, 150, 1), (1, 400, 2)]


@pytest.mark.parametrize(
    ("cap", "kept", "depends", "last_of_agent"),
    [
        (10_000, [0, 1, 2, 3, 4], [-1, 0, 1, 1, 2], [False, False, False, True, True]),
        # the sub-agent's second turn is too long: it alone goes
        (400, [0, 1, 2, 3], [-1, 0, 1, 1], [False, False, True, True]),
        # the sub-agent's first turn: it and its later turn go, the main agent goes on
        (300, [0, 1, 3], [-1, 0, 1], [False, False, True]),
        # main turn 1: everything after it waits on it
        (200, [0], [-1], [True]),
    ],
)
def test_cap_context_ends_what_waits_on_a_request_over_the_context(
    cap: int, kept: list[int], depends: list[int], last_of_agent: list[bool]
) -> None:
    reqs = [_tr(a, inp, dep) for a, inp, dep in _SHAPE]
    reqs = [dataclasses.replace(r, last_of_agent=i in (3, 4)) for i, r in enumerate(reqs)]
    conv = Conversation.build("c", reqs, 64)
    (out,), removed = cap_context([conv], cap)
    assert removed == len(_SHAPE) - len(kept)
    assert [r.input_tokens for r in out.requests] == [_SHAPE[i][1] for i in kept]
    assert [r.depends_on for r in out.requests] == depends
    assert [r.last_of_agent for r in out.requests] == last_of_agent
    assert out.children == Conversation.build("c", list(out.requests), 64).children
    if removed == 0:
        assert out is conv  # untouched conversations are the same objects (runs stay identical)


def test_cap_context_drops_emptied_conversations_and_refuses_a_bad_cap() -> None:
    conv = Conversation.build("c", [_tr(a, inp, dep) for a, inp, dep in _SHAPE], 64)
    assert cap_context([conv], 100) == ([], 5)
    with pytest.raises(ValueError):
        cap_context([conv], 0)


def test_load_conversations_caps_at_the_presets_context() -> None:
    qwen = Scenario(preset="qwen3-30b-a3b-h200")
    assert preset(qwen.preset).max_request_tokens == 262_144  # the model's context, under its 700K of KV
    raw = load_claude_code(bundled_trace_path())
    capped, left_out = load_trace_for(qwen)  # (what simulate prints: the count left out)
    assert capped is not None
    assert max(r.input_tokens + r.output_tokens for c in capped for r in c.requests) <= 262_144
    over = sum(r.input_tokens + r.output_tokens > 262_144 for c in raw for r in c.requests)
    left = sum(len(c.requests) for c in capped)
    assert over > 0 and left <= sum(len(c.requests) for c in raw) - over
    assert left_out == sum(len(c.requests) for c in raw) - left
    # the GLM-5.2-class preset has no context limit below its 2.06M tokens of KV: nothing changes
    glm = load_conversations(Scenario())
    assert glm is not None and [len(c.requests) for c in glm] == [len(c.requests) for c in raw]
