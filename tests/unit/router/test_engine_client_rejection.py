"""An engine's refusal becomes OpenAI's error code from the error type of its JSON body."""

from __future__ import annotations

import pytest

from agentpool.engine.errors import ContextLengthError
from agentpool.engine.lengths import sglang_says_too_long
from agentpool.router.engine_client import code_for_kind, rejection_code
from agentpool.wire.engine import TOO_LONG


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ('{"error": {"type": "ContextLengthError", "message": "too long"}}', "context_length_exceeded"),
        ('{"error": {"type": "BadRequestError", "message": "empty prompt"}}', "rejected_by_engine"),
        ('{"error": "bad request content"}', "rejected_by_engine"),  # no type
        ('{"detail": "x"}', "rejected_by_engine"),
        ("not json", "rejected_by_engine"),
        ("", "rejected_by_engine"),
    ],
)
def test_rejection_code(body: str, code: str) -> None:
    assert rejection_code(body) == code


def test_the_error_kind_of_a_too_long_request_is_the_engines_error_type() -> None:
    assert ContextLengthError.__name__ == TOO_LONG  # the type of the engine's 400 body
    assert code_for_kind(TOO_LONG) == "context_length_exceeded"
    assert code_for_kind("") == code_for_kind(None) == "rejected_by_engine"


@pytest.mark.parametrize(
    ("message", "too_long"),
    [
        # SGLang's tokenizer manager, for the prompt and for the prompt with max_new_tokens
        ("The input (9000 tokens) is longer than the model's context length (8192 tokens).", True),
        (
            "Requested token count exceeds the model's maximum context length of 8192 tokens. You "
            "requested a total of 9000 tokens: 8000 tokens from the input messages and 1000 tokens "
            "for the completion.",
            True,
        ),
        (
            '{"error": {"message": "The input (9000 tokens) is longer than the model\'s context length"}}',
            True,
        ),
        ("CUDA out of memory", False),
        ("bad request", False),
        ("context", False),
    ],
)
def test_sglangs_refusal_for_length_is_told_from_its_other_errors(message: str, too_long: bool) -> None:
    assert sglang_says_too_long(message) is too_long
