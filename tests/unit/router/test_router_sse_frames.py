"""Token chunks framed from a per-answer template are the bytes of the chunk's own JSON."""

from __future__ import annotations

import pytest

from agentpool.router.openai_api import TokenFrames, chat_chunk, completion_chunk, sse

TEXTS = ["ok", " w", "", 'quote " and \\ back', "é 中文 \n\t", "\x00agentpool-token\x00", "\u2028"]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("model", ["bench", 'a"b', "\x00agentpool-token\x00"])
def test_frames_equal_the_chunks_json(text: str, model: str) -> None:
    chat = TokenFrames(True, "chatcmpl-1", model, 1700000000)
    assert chat.token(text) == sse(chat_chunk("chatcmpl-1", model, 1700000000, {"content": text}, None))
    plain = TokenFrames(False, "cmpl-1", model, 7)
    assert plain.token(text) == sse(completion_chunk("cmpl-1", model, 7, text, None))
