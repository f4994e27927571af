"""The per-message prompt memo gives exactly the ids and block hashes of tokenizing whole prompts."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from agentpool.kv import block_hashes
from agentpool.local.prompts import AgentHistory, WordCache, prompt_words
from agentpool.router.prompt_cache import PromptCache
from agentpool.router.tokenizer import BuiltinTokenizer, Encoded, TokenizerError, encode_chat
from agentpool.sim.run import bundled_trace_path
from agentpool.sim.trace import load_claude_code

Message = dict[str, Any]


def check_same(cache: PromptCache, messages: list[Message]) -> Encoded:
    """The memo's answer equals the whole-prompt path's (ids, turn, new turn, hashes)."""
    got = cache.encode_chat(messages)
    want = encode_chat(BuiltinTokenizer(), messages)
    assert got.token_ids == want.token_ids
    assert (got.turn, got.new_turn_tokens) == (want.turn, want.new_turn_tokens)
    assert got.page_size == cache.page_size
    assert got.hashes == block_hashes(want.token_ids, cache.page_size)
    assert got.token_ids_json == orjson.dumps(want.token_ids)
    return got


def trace_prompts(which: tuple[int, ...], requests: int) -> list[list[Message]]:
    """The chat messages a harness sends for conversations ``which`` of the bundled Claude Code
    trace (their first ``requests`` requests, agents and sub-agents interleaved as recorded)."""
    out = []
    conversations = load_claude_code(bundled_trace_path(), limit=max(which) + 1)
    for n in which:
        conv = conversations[n]
        words = WordCache(conv.block_size)
        histories: dict[int, AgentHistory] = {}
        for i, r in enumerate(conv.requests[:requests]):
            blocks, produced = conv.block_keys(i, n + 1, 0)
            history = histories.setdefault(r.agent, AgentHistory())
            text = prompt_words(words, blocks, produced, r.input_tokens, f"{n}.{i}")
            out.append(history.messages(blocks, text, conv.block_size))
            history.answered(r.output_tokens)
    return out


@pytest.mark.parametrize(("page", "max_tokens"), [(64, 4_000_000), (48, 200_000)])
def test_replayed_trace_prompts_get_the_ids_and_hashes_of_the_whole_prompt(
    page: int, max_tokens: int
) -> None:
    """Real agent conversations (the bundled trace's block ids as words), one memo for all of them;
    the small memo evicts entries mid-conversation, which must not change any answer."""
    prompts = trace_prompts((1, 7), 20)  # 16-130K tokens each, a sub-agent in the second
    assert max(len(m) for m in prompts) > 20
    cache = PromptCache(BuiltinTokenizer(), page, max_tokens=max_tokens)
    for messages in prompts:
        check_same(cache, messages)
        assert cache.size <= max_tokens
    if max_tokens < 100_000:
        assert cache.size > max_tokens // 2  # it filled up and evicted


def test_a_turn_reuses_the_previous_turns_messages() -> None:
    cache = PromptCache(BuiltinTokenizer(), 4)
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "fix the bug " * 5}]
    check_same(cache, first)
    assert len(cache) == 2
    second = [*first, {"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks"}]
    found = cache.lookup(second)
    assert found.hit == 2 and found.missing_chars == len("<|assistant|> done") + len("<|user|> thanks")
    check_same(cache, second)
    assert len(cache) == 4


def test_an_edited_message_misses_from_there_on() -> None:
    cache = PromptCache(BuiltinTokenizer(), 3)
    msgs: list[Message] = [
        {"role": "user", "content": "a b c d e"},
        {"role": "assistant", "content": "f g"},
        {"role": "user", "content": "h i j k"},
    ]
    check_same(cache, msgs)
    edited = [msgs[0], {"role": "assistant", "content": "f X"}, msgs[2]]
    assert cache.lookup(edited).hit == 1
    check_same(cache, edited)
    assert cache.lookup(edited).hit == 3 and cache.lookup(msgs).hit == 3


def test_every_kind_of_message_renders_as_the_whole_prompt_does() -> None:
    cache = PromptCache(BuiltinTokenizer(), 2)
    msgs: list[Message] = [
        {"role": "system", "content": "  leading and trailing  \n"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {}}],
        },
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "ls"}}]},
        {"role": "tool", "content": "", "tool_call_id": "c1"},
        {"role": "user", "content": "é ü 中文 \t tabs\nnewlines"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "y"},
    ]
    for n in range(1, len(msgs) + 1):
        check_same(cache, msgs[:n])
    check_same(PromptCache(BuiltinTokenizer(), 2), msgs)  # cold


def test_null_fields_render_as_absent_ones() -> None:
    """The router passes validated messages with their null fields (the model's defaults)."""
    cache = PromptCache(BuiltinTokenizer(), 4)
    nulls = {"name": None, "tool_calls": None, "tool_call_id": None, "function_call": None, "refusal": None}
    msgs: list[Message] = [
        {"role": "user", "content": "a b c", **nulls},
        {"role": "assistant", "content": None, **nulls},
        {"role": "user", "content": "d", **nulls},
    ]
    got = cache.encode_chat(msgs)
    want = encode_chat(BuiltinTokenizer(), [{k: v for k, v in m.items() if v is not None} for m in msgs])
    assert (got.token_ids, got.turn, got.new_turn_tokens) == (want.token_ids, want.turn, want.new_turn_tokens)


def test_tokenizing_the_misses_in_a_thread_gives_the_same_answer() -> None:
    cache = PromptCache(BuiltinTokenizer(), 8)
    msgs = [{"role": "user", "content": "w " * 500}, {"role": "assistant", "content": "ok"}]

    async def split_steps() -> Encoded:
        found = cache.lookup(msgs)
        return cache.finish(found, await asyncio.to_thread(cache.tokenize, found))

    got = asyncio.run(split_steps())
    want = encode_chat(BuiltinTokenizer(), msgs)
    assert got.token_ids == want.token_ids and got.new_turn_tokens == want.new_turn_tokens
    check_same(cache, msgs)


def test_bad_messages_are_tokenizer_errors() -> None:
    cache = PromptCache(BuiltinTokenizer(), 64)
    with pytest.raises(TokenizerError, match="must not be empty"):
        cache.encode_chat([])
    with pytest.raises(TokenizerError, match="unsupported message content"):
        cache.encode_chat([{"role": "user", "content": 5}])
    with pytest.raises(ValueError, match="page_size"):
        PromptCache(BuiltinTokenizer(), 0)
