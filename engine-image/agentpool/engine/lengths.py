"""The longest request an engine takes: both backends refuse a longer one at admission, as SGLang
refuses a request over its ``--context-length`` (HTTP 400), and the router answers the client
``context_length_exceeded`` from the error's type (:class:`ContextLengthError`)."""

from __future__ import annotations

from agentpool.engine.errors import ContextLengthError


def check_request_length(
    prompt_tokens: int, max_tokens: int, context_length: int | None, kv_tokens: int | None = None
) -> None:
    """Raise :class:`ContextLengthError` when the prompt and its most output exceed
    ``context_length`` (None: no limit set) or the engine's whole KV, ``kv_tokens`` (a request no
    wait would make room for; None: not known here, as with SGLang, which checks it itself)."""
    total = prompt_tokens + max_tokens
    need = f"the request needs {total} tokens ({prompt_tokens} of prompt and up to {max_tokens} of output)"
    if context_length is not None and total > context_length:
        raise ContextLengthError(f"{need}, more than this engine's context length of {context_length}")
    if kv_tokens is not None and total > kv_tokens:
        raise ContextLengthError(f"{need}, more than this engine's {kv_tokens} tokens of GPU KV")
