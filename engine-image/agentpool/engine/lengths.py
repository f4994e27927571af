"""The longest request an engine takes: both backends refuse a longer one at admission, as SGLang
refuses a request over its ``--context-length`` (HTTP 400), and the router answers the client
``context_length_exceeded`` from the error's type (:class:`ContextLengthError`)."""

from __future__ import annotations

import re

from agentpool.engine.errors import ContextLengthError

# SGLang's own refusal (its tokenizer manager's length check, e.g. "The input (N tokens) is longer
# than the model's context length (M tokens)." or "... exceeds the model's maximum context length")
_SGLANG_TOO_LONG = re.compile(r"model's (maximum )?context length")


def sglang_says_too_long(message: str) -> bool:
    """Whether SGLang's error ``message`` refuses a request for its length."""
    return _SGLANG_TOO_LONG.search(message) is not None


def check_request_length(
    prompt_tokens: int, max_tokens: int, context_length: int | None, kv_tokens: int | None = None
) -> None:
    """Raise :class:`ContextLengthError` when the prompt and its most output exceed
    ``context_length`` (None: no limit set; SGLang 0.5.23 refuses the same: a prompt of the whole
    context or more, or a prompt and ``max_new_tokens`` over it) or the engine's whole KV,
    ``kv_tokens`` (a request no wait would make room for; None: not known here, as with SGLang,
    which checks it itself)."""
    total = prompt_tokens + max_tokens
    need = f"the request needs {total} tokens ({prompt_tokens} of prompt and up to {max_tokens} of output)"
    if context_length is not None and total > context_length:
        raise ContextLengthError(f"{need}, more than this engine's context length of {context_length}")
    if kv_tokens is not None and total > kv_tokens:
        raise ContextLengthError(f"{need}, more than this engine's {kv_tokens} tokens of GPU KV")
