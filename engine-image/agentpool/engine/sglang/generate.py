"""Our generate requests in SGLang's native API, and its streamed answers back in our events (pure).

Request: ``POST /generate`` with ``{"input_ids", "sampling_params", "stream", "rid"}`` (the router
tokenized the prompt, chat template included); a P->D pair also carries ``bootstrap_host``,
``bootstrap_port`` and ``bootstrap_room``: SGLang's decode server pulls the KV from the prefill
server's bootstrap endpoint (its NIXL transfer backend), so our ``transfer_id`` names that endpoint's
port and the room, and the host is the prefill engine's (``kv_source.url``).

Answer (``stream: true``): server-sent events ``data: {json}`` with the text so far (cumulative),
``meta_info`` (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``finish_reason``:
``{"type": "length"|"stop"|"abort", ...}`` or null; on the last chunk under speculative decoding
``spec_verify_ct``) and ``data: [DONE]`` at the end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentpool.engine.errors import BadRequestError

TRANSFER_PREFIX = "sglang-bootstrap"

# OpenAI body fields -> SGLang sampling params (same meaning)
_SAME = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop",
    "ignore_eos",
)
_RENAMED = {"seed": "sampling_seed"}


def sampling_params(body: dict[str, Any], default_max_tokens: int, limit: int) -> dict[str, Any]:
    raw = body.get("max_completion_tokens")
    if raw is None:
        raw = body.get("max_tokens", default_max_tokens)
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
        raise BadRequestError("max_tokens must be a positive integer")
    n = body.get("n", 1)
    if n != 1:
        raise BadRequestError("n must be 1 (one choice per request)")
    out: dict[str, Any] = {"max_new_tokens": min(raw, limit)}
    for k in _SAME:
        if body.get(k) is not None:
            out[k] = body[k]
    for k, theirs in _RENAMED.items():
        if body.get(k) is not None:
            out[theirs] = body[k]
    return out


def transfer_id(room: int, bootstrap_port: int) -> str:
    return f"{TRANSFER_PREFIX}:{bootstrap_port}:{room}"


def parse_transfer_id(text: str) -> tuple[int, int]:
    """``(bootstrap_port, room)`` from a transfer id this backend made."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] != TRANSFER_PREFIX or not parts[1].isdigit() or not parts[2].isdigit():
        raise BadRequestError(f"not an SGLang bootstrap transfer id: {text[:100]!r}")
    port, room = int(parts[1]), int(parts[2])
    if not 0 < port < 65536:
        raise BadRequestError(f"bootstrap port out of range in transfer id: {port}")
    return port, room


@dataclass(frozen=True, slots=True)
class Chunk:
    text: str  # cumulative
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    error: str | None = None
    spec_verify_ct: int | None = None  # SGLang's verify passes (finished requests, speculative decoding)
    error_status: int | None = None
    """With ``error``: the 4xx ``code`` SGLang gives a request it refuses for its content (0.5.23's
    stream errors carry one; None when absent or not a 4xx)."""


def parse_sse_line(line: bytes) -> Chunk | None:
    """One line of the stream; ``None`` for blank lines, comments and ``[DONE]``."""
    text = line.decode("utf-8", "replace").strip()
    if not text.startswith("data:"):
        return None
    data = text[5:].strip()
    if data == "[DONE]":
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        return Chunk("", "error", 0, 0, 0, error=f"not JSON in SGLang's stream: {data[:200]!r}")
    return parse_answer(obj)


def parse_answer(obj: Any) -> Chunk:
    if not isinstance(obj, dict):
        return Chunk("", "error", 0, 0, 0, error="SGLang's answer is not a JSON object")
    if "error" in obj:
        err = obj["error"]
        msg = err.get("message", err) if isinstance(err, dict) else err
        code = err.get("code") if isinstance(err, dict) else None
        status = code if type(code) is int and 400 <= code < 500 else None
        return Chunk("", "error", 0, 0, 0, error=str(msg)[:500], error_status=status)
    meta = obj.get("meta_info")
    meta = meta if isinstance(meta, dict) else {}
    fr = meta.get("finish_reason")
    reason = fr.get("type") if isinstance(fr, dict) else fr
    text = obj.get("text", "")
    return Chunk(
        text if isinstance(text, str) else "",
        str(reason) if reason is not None else None,
        _int(meta.get("prompt_tokens")),
        _int(meta.get("completion_tokens")),
        _int(meta.get("cached_tokens")),
        spec_verify_ct=_int(meta["spec_verify_ct"]) if "spec_verify_ct" in meta else None,
    )


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0
