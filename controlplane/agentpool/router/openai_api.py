"""OpenAI-compatible request bodies, response bodies and error bodies (pydantic, at the HTTP edge).

Unknown top-level fields are rejected (OpenAI answers 400 "Unrecognized request argument"); message
objects accept the fields the Chat Completions API defines. Types are strict (``"stream": "yes"`` and
``"max_tokens": true`` are errors, not coerced). :func:`parse_json` is the one JSON reader of request
bodies: strict UTF-8 (no lone surrogates, which no engine could take), no NaN or infinite numbers
(``1e309``), integers within 64 bits, nesting within a cap. Response helpers build the JSON bodies
and the SSE chunks.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentpool.wire.engine import Usage

_I64 = 1 << 63

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
"""The error ``code`` of a request longer than the model takes (over the router's prompt cap, or
refused by an engine for its length), as OpenAI names it."""
REJECTED_BY_ENGINE = "rejected_by_engine"
"""The error ``code`` of any other refusal by an engine for the request's content."""


class BadJson(ValueError):
    """A request body that is not JSON the router accepts; the message says why."""


def parse_json(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The JSON object in ``raw``, or :class:`BadJson` (see the module docstring for the rules)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadJson(f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise BadJson("request body must be a JSON object")
    check_nesting(body, max_depth)
    return body


def check_nesting(value: dict[str, Any] | list[Any], max_depth: int) -> None:
    """Raise :class:`BadJson` when ``value`` nests deeper than ``max_depth`` or holds a float-sized int.

    orjson reads integers of 2**64 and more as floats: a float where an integer is wanted fails the
    strict models; integers in [2**63, 2**64) are caught here. Only containers are walked.
    """
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise BadJson(f"request body nests deeper than {max_depth} levels")
        for item in node.values() if isinstance(node, dict) else node:
            if type(item) is str:  # most values: nothing to check
                continue
            if isinstance(item, (dict, list)):
                stack.append((item, depth + 1))
            elif isinstance(item, int) and item >= _I64:
                raise BadJson(f"integer {item} is out of the 64-bit range")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    refusal: str | None = None
    reasoning_content: str | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int = Field(1, ge=1, le=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-_I64, lt=_I64)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    logprobs: bool | int | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    reasoning_effort: str | None = None
    service_tier: str | None = None

    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str] = Field(min_length=1)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=1)

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("exactly one prompt is supported")
        return v

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def output_limit(self) -> int | None:
        return self.max_tokens


# ---- errors -----------------------------------------------------------------------------------


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def validation_error_body(e: ValidationError) -> dict[str, Any]:
    first = e.errors()[0] if e.errors() else {"loc": (), "msg": str(e)}
    loc = ".".join(str(p) for p in first.get("loc", ()))
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        msg = f"Unrecognized request argument supplied: {loc}"
    else:
        msg = f"{loc}: {first.get('msg', 'invalid value')}" if loc else str(first.get("msg"))
    return error_body(msg, "invalid_request_error", "invalid_value", loc or None)


# ---- responses --------------------------------------------------------------------------------


def usage_dict(u: Usage) -> dict[str, Any]:
    """The engine's usage whole, with ``total_tokens`` added when the engine did not send it."""
    out: dict[str, Any] = u.model_dump()
    out.setdefault("total_tokens", u.prompt_tokens + u.completion_tokens)
    return out


def chat_response(rid: str, model: str, text: str, finish: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": None,
            }
        ],
        "usage": usage_dict(usage),
    }


def completion_response(rid: str, model: str, text: str, finish: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
        "usage": usage_dict(usage),
    }


def sse(payload: dict[str, Any] | str) -> bytes:
    if isinstance(payload, str):
        return f"data: {payload}\n\n".encode()
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def chat_chunk(
    rid: str, model: str, created: int, delta: dict[str, Any], finish: str | None
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }


def completion_chunk(rid: str, model: str, created: int, text: str, finish: str | None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
    }


_MARK = "\x00agentpool-token\x00"  # stands for a token's text while a frame's JSON is built


class TokenFrames:
    """The SSE frames of one streamed answer's token chunks (``chat_chunk`` with ``{"content": text}``
    or ``completion_chunk`` with ``text``, no finish reason): the JSON around the text is built once
    per answer, and each token only JSON-encodes its text (the same bytes as :func:`sse` of the
    chunk)."""

    __slots__ = ("_chat", "_created", "_head", "_model", "_rid", "_tail")

    def __init__(self, chat: bool, rid: str, model: str, created: int) -> None:
        self._chat, self._rid, self._model, self._created = chat, rid, model, created
        parts = sse(self._chunk(_MARK)).split(orjson.dumps(_MARK))
        self._head, self._tail = (parts[0], parts[1]) if len(parts) == 2 else (b"", b"")

    def _chunk(self, text: str) -> dict[str, Any]:
        if self._chat:
            return chat_chunk(self._rid, self._model, self._created, {"content": text}, None)
        return completion_chunk(self._rid, self._model, self._created, text, None)

    def token(self, text: str) -> bytes:
        if not self._head:  # the mark also appeared elsewhere (never for ids and model names)
            return sse(self._chunk(text))
        return self._head + orjson.dumps(text) + self._tail


def usage_chunk(rid: str, model: str, created: int, obj: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_dict(usage),
    }
