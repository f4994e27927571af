"""Tokenizers: a tiny Hugging Face tokenizer saved by the test and loaded from disk; the built-in one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from agentpool.router.tokenizer import (
    BuiltinTokenizer,
    HfTokenizer,
    TokenizerError,
    encode_chat,
    encode_completion,
    load_tokenizer,
    turn_of,
)

TEMPLATE = (
    "{{ bos_token }} {% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
WORDS = [
    "[UNK]",
    "<s>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|end|>",
    "hello",
    "world",
    "fix",
    "the",
    "bug",
]


@pytest.fixture
def hf_dir(tmp_path: Path) -> Path:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": TEMPLATE, "bos_token": "<s>"})
    )
    return tmp_path


def test_hf_tokenizer_renders_the_chat_template_and_encodes(hf_dir: Path) -> None:
    tok = HfTokenizer(hf_dir)
    msgs = [{"role": "user", "content": "hello world"}]
    assert (
        tok.render_chat(msgs, add_generation_prompt=True) == "<s> <|user|> hello world <|end|> <|assistant|> "
    )
    enc = encode_chat(tok, msgs)
    assert enc.token_ids == [1, 2, 6, 7, 5, 3]
    assert enc.turn == 1 and enc.new_turn_tokens == 6
    assert tok.decode([6, 7]) == "hello world"


def test_newest_turn_is_what_follows_the_last_assistant_message(hf_dir: Path) -> None:
    tok = load_tokenizer(str(hf_dir))
    msgs = [
        {"role": "user", "content": "fix the bug"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "the bug world"},
    ]
    enc = encode_chat(tok, msgs)
    # "<|user|> the bug world <|end|>" + "<|assistant|>" follow the second message
    assert enc.turn == 2 and enc.new_turn_tokens == 6
    assert len(enc.token_ids) == 1 + 5 + 3 + 6


def test_hf_tokenizer_errors_are_clear(tmp_path: Path, hf_dir: Path) -> None:
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        HfTokenizer(tmp_path / "missing")
    (hf_dir / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerError, match="no chat_template"):
        HfTokenizer(hf_dir)


def test_builtin_tokenizer_is_deterministic_and_extends_prefixes() -> None:
    tok = BuiltinTokenizer()
    first = [{"role": "user", "content": "a b c"}]
    follow = [*first, {"role": "assistant", "content": "d e"}, {"role": "user", "content": "f"}]
    a, b = encode_chat(tok, first), encode_chat(tok, follow)
    assert a.token_ids == encode_chat(BuiltinTokenizer(), first).token_ids
    assert b.token_ids[: len(a.token_ids) - 1] == a.token_ids[:-1]  # only the generation prompt differs
    assert b.turn == 2 and b.new_turn_tokens == 3  # "<|user|> f" + "<|assistant|>"
    assert encode_completion(tok, "x y z").token_ids == tok.encode_text("x y z")
    assert all(0 <= t < tok.vocab_size for t in b.token_ids)


def test_turn_counts_assistant_messages() -> None:
    assert turn_of([{"role": "user"}]) == 1
    assert turn_of([{"role": "user"}, {"role": "assistant"}, {"role": "tool"}, {"role": "assistant"}]) == 3
    with pytest.raises(TokenizerError):
        encode_chat(BuiltinTokenizer(), [])


def test_builtin_word_memo_is_bounded_and_does_not_change_ids() -> None:
    small = BuiltinTokenizer(cache_words=3)
    plain = BuiltinTokenizer()
    text = " ".join(f"w{i % 7}" for i in range(50))
    assert small.encode_text(text) == plain.encode_text(text)
    assert len(small._ids) <= 3


def test_template_errors_on_odd_content_are_tokenizer_errors(hf_dir: Path) -> None:
    (hf_dir / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}"})
    )
    with pytest.raises(TokenizerError, match="chat template failed"):
        encode_chat(HfTokenizer(hf_dir), [{"role": "user", "content": "x"}])
