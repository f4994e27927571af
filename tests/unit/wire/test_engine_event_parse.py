"""parse_event: the lean path for token lines accepts and yields exactly what EngineEvent does."""

from __future__ import annotations

import pytest

from agentpool.wire.engine import EngineEvent, Event, Usage, parse_event, with_cached_tokens

FIELDS = (
    "type",
    "text",
    "transfer_id",
    "finish_reason",
    "usage",
    "cached_tokens",
    "reason",
    "message",
    "status",
)

LINES = [
    b'{"type":"token","text":"ok"}\n',
    b'{"type": "token", "text": " w\\u00e9 \\n"}',
    b'{"type":"token"}',
    b'{"type":"started"}\n',
    b'{"type":"started","text":"x"}',
    b'{"text":"ok","type":"token"}',
    b'{"type":"token","text":"ok","extra":1}',  # extra keys: pydantic ignores them
    b'{"type":"token","text":"ok","status":200}',  # a bad status: refused either way
    b'{"type":"token","text":"ok","status":404}',
    b'{"type":"token","text":5}',
    b'{"type":"token","text":null}',
    b'{"type":"token","text":["a"]}',
    b'{"type":"tok","text":"ok"}',
    b'{"type":5}',
    b'{"type":"token","text":"\\ud800"}',  # a lone surrogate
    b'{"type":"token","text":"ok"',  # truncated
    b'{"type":"token","type":"done","text":"x"}',  # duplicate key
    b"[1, 2]",
    b'"token"',
    b"",
    b'{"type":"done","finish_reason":"stop","usage":{"prompt_tokens":3,"completion_tokens":2,'
    b'"prompt_tokens_details":{"cached_tokens":1}}}',
    b'{"type":"prefilled","text":"a","transfer_id":"t1"}',
    b'{"type":"started","cached_tokens":64,"fetched_tokens":0}',
    b'{"type":"started","cached_tokens":-1}',  # refused
    b'{"type":"requeue","reason":"draining"}',
    b'{"type":"error","message":"bad","status":400}',
]


def outcome(parse: object, line: bytes) -> tuple[object, ...] | str:
    try:
        ev = parse(line)  # type: ignore[operator]
    except ValueError:
        return "refused"
    return tuple(getattr(ev, f) for f in FIELDS)


@pytest.mark.parametrize("line", LINES)
def test_the_same_lines_are_accepted_with_the_same_fields(line: bytes) -> None:
    assert outcome(parse_event, line) == outcome(EngineEvent.model_validate_json, line)


def test_token_lines_take_the_lean_path_and_others_pydantic() -> None:
    assert type(parse_event(b'{"type":"token","text":"ok"}')) is Event
    assert type(parse_event(b'{"type":"started"}')) is Event
    assert type(parse_event(b'{"type":"token","text":"ok","extra":1}')) is EngineEvent
    done = parse_event(b'{"type":"done","usage":{"prompt_tokens":1,"x":{"y":2}}}')
    assert type(done) is EngineEvent and done.usage is not None
    assert done.usage.model_dump() == {"prompt_tokens": 1, "completion_tokens": 0, "x": {"y": 2}}


@pytest.mark.parametrize(
    ("usage", "want_details"),
    [
        (Usage(prompt_tokens=9, completion_tokens=2), {"cached_tokens": 8}),
        (  # the decode node's other details are kept, its cached count replaced
            Usage.model_validate(
                {
                    "prompt_tokens": 9,
                    "completion_tokens": 2,
                    "prompt_tokens_details": {"cached_tokens": 9, "audio_tokens": 0},
                }
            ),
            {"cached_tokens": 8, "audio_tokens": 0},
        ),
    ],
)
def test_with_cached_tokens_sets_the_prefill_nodes_count(usage: Usage, want_details: dict[str, int]) -> None:
    out = with_cached_tokens(usage, 8).model_dump()
    assert out == {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": want_details}
    assert parse_event(b'{"type":"started","cached_tokens":8}').cached_tokens == 8
