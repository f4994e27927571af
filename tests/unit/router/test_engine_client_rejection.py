"""An engine's refusal becomes OpenAI's error code from the error type of its JSON body."""

from __future__ import annotations

import pytest

from agentpool.router.engine_client import rejection_code


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
