"""Prompts synthesized from block ids share exactly the prefixes the trace says they share."""

from __future__ import annotations

from agentpool.kv import block_hashes
from agentpool.local.prompts import AgentHistory, WordCache, prompt_words
from agentpool.router.tokenizer import BuiltinTokenizer, encode_chat
from agentpool.sim.run import bundled_trace_path
from agentpool.sim.trace import load_claude_code


def common_prefix(a: list[int] | list[str], b: list[int] | list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_equal_keys_give_equal_words_and_a_new_key_diverges_at_its_block() -> None:
    cache = WordCache(64)
    a = prompt_words(cache, [1, 2, 3], [], 64 * 3, "a")
    b = prompt_words(cache, [1, 2, 9], [], 64 * 3, "b")
    assert len(a) == len(b) == 192
    assert common_prefix(a, b) == 128
    assert prompt_words(WordCache(64), [1, 2, 3], [], 192, "z") == a  # deterministic


def test_short_prompts_take_produced_blocks_then_request_unique_padding() -> None:
    cache = WordCache(64)
    with_tail = prompt_words(cache, [1], [2], 100, "x")
    assert with_tail[64:] == cache.block(2).split()[:36]  # the tail is the next turn's block
    padded = prompt_words(cache, [1], [], 100, "x")
    other = prompt_words(cache, [1], [], 100, "y")
    assert common_prefix(padded, other) == 64


def test_turns_of_one_agent_render_as_extending_token_sequences() -> None:
    tok = BuiltinTokenizer()
    cache = WordCache(64)
    history = AgentHistory()
    keys = list(range(1, 40))
    previous: list[int] = []
    for turn, (n_blocks, n_in) in enumerate([(10, 700), (20, 1300), (30, 1990)], start=1):
        words = prompt_words(cache, keys[:n_blocks], keys[n_blocks : n_blocks + 2], n_in, f"t{turn}")
        msgs = history.messages(keys[:n_blocks], words, 64)
        history.answered(100)
        enc = encode_chat(tok, msgs)
        assert enc.turn == turn
        assert len(enc.token_ids) == n_in + 2 * turn  # one marker per message + the generation prompt
        if previous:
            assert enc.token_ids[: len(previous)] == previous
        previous = enc.token_ids


def test_a_prompt_that_does_not_extend_starts_a_new_history() -> None:
    cache = WordCache(64)
    history = AgentHistory()
    history.messages([1, 2, 3], prompt_words(cache, [1, 2, 3], [], 192, "a"), 64)
    history.answered(50)
    msgs = history.messages([1, 7], prompt_words(cache, [1, 7], [], 128, "b"), 64)  # compaction
    assert [m["role"] for m in msgs] == ["user"]


def test_trace_turns_share_at_least_the_blocks_the_trace_shares() -> None:
    """Router block hashes of consecutive requests of one agent: shared as the trace's ids say."""
    conv = load_claude_code(bundled_trace_path(), limit=1)[0]
    tok = BuiltinTokenizer()
    cache = WordCache(conv.block_size)
    history = AgentHistory()
    prev_keys: list[int] = []
    prev_hashes: list[int] = []
    checked = 0
    for i, r in enumerate(conv.requests[:30]):
        if r.agent != 0:
            continue
        blocks, produced = conv.block_keys(i, 1, 15000 // 64)
        words = prompt_words(cache, blocks, produced, r.input_tokens, f"{i}")
        hashes = block_hashes(encode_chat(tok, history.messages(blocks, words, 64)).token_ids, 64)
        history.answered(r.output_tokens)
        if prev_keys:
            trace_shared = common_prefix(blocks, prev_keys)
            assert common_prefix(hashes, prev_hashes) >= trace_shared, i
            checked += 1
        prev_keys, prev_hashes = blocks, hashes
    assert checked >= 3
