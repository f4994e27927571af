"""Tokenization behind one interface: a Hugging Face tokenizer from a local directory, or a built-in one.

The router needs token ids (for block hashes), the prompt length, and the tokens of the newest turn.
Both implementations render chat messages to one prompt string and encode it; the newest turn is the
tokens after the prompt rendered up to (and including) the last assistant message.

- :class:`HfTokenizer` loads ``tokenizer.json`` (the ``tokenizers`` library) and the chat template
  from ``tokenizer_config.json`` (rendered with a sandboxed Jinja2 environment). Never downloads.
- :class:`BuiltinTokenizer` is deterministic and dependency-free, for simulated pools: each
  whitespace-separated word becomes one token id (xxh3 of the word, below ``vocab_size``), and chat
  messages render as ``<|role|>`` markers followed by their content.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import xxhash

Message = dict[str, Any]


GENERATION_PROMPT = "<|assistant|>"  # the built-in tokenizer's generation prompt line


class TokenizerError(ValueError):
    """A tokenizer could not be loaded, or a prompt could not be rendered."""


@dataclass(frozen=True, slots=True)
class Encoded:
    """A tokenized prompt: its ids, its turn, and how many tokens its newest turn appended;
    ``hashes``: its full pages' block hashes at ``page_size`` and ``token_ids_json`` the ids'
    JSON (``orjson.dumps(token_ids)``), when the encoder had them."""

    token_ids: list[int]
    turn: int
    new_turn_tokens: int
    hashes: list[int] | None = None
    page_size: int = 0
    token_ids_json: bytes | None = None


def turn_of(messages: Sequence[Message]) -> int:
    """The turn of a chat request: 1 + the number of assistant messages it carries."""
    return 1 + sum(1 for m in messages if m.get("role") == "assistant")


def last_assistant_index(messages: Sequence[Message]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "assistant":
            return i
    return -1


class Tokenizer(Protocol):
    @property
    def name(self) -> str: ...

    def encode_text(self, text: str) -> list[int]: ...

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool) -> str: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


def encode_chat(tokenizer: Tokenizer, messages: Sequence[Message]) -> Encoded:
    """Tokens of the chat prompt, its turn, and the tokens after its last assistant message."""
    if not messages:
        raise TokenizerError("messages must not be empty")
    ids = tokenizer.encode_text(tokenizer.render_chat(messages, add_generation_prompt=True))
    cut = last_assistant_index(messages)
    if cut < 0:
        new = len(ids)
    else:
        before = tokenizer.encode_text(
            tokenizer.render_chat(messages[: cut + 1], add_generation_prompt=False)
        )
        new = max(0, len(ids) - len(before))
    return Encoded(ids, turn_of(messages), new)


def encode_completion(tokenizer: Tokenizer, prompt: str) -> Encoded:
    ids = tokenizer.encode_text(prompt)
    return Encoded(ids, 1, len(ids))


def content_text(content: Any) -> str:
    """The text of a message's ``content``: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                parts.append(json.dumps(part, sort_keys=True))
        return "\n".join(parts)
    raise TokenizerError(f"unsupported message content of type {type(content).__name__}")


class BuiltinTokenizer:
    """Deterministic word-level tokenizer for simulated pools (no files, no downloads)."""

    def __init__(self, vocab_size: int = 150_000, cache_words: int = 200_000) -> None:
        if vocab_size < 16:
            raise TokenizerError("vocab_size must be at least 16")
        self.vocab_size = vocab_size
        self._cache_words = cache_words
        self._ids: dict[str, int] = {}  # word -> id memo, cleared when it reaches cache_words

    @property
    def name(self) -> str:
        return "builtin"

    def encode_text(self, text: str) -> list[int]:
        ids = self._ids
        words = text.split()  # the same words as the regex \S+, much faster
        try:
            return [ids[w] for w in words]
        except KeyError:
            pass
        if len(ids) + len(words) > self._cache_words:
            ids.clear()
        vocab = self.vocab_size
        digest = xxhash.xxh3_64_intdigest
        out = []
        for w in words:
            t = ids.get(w)
            if t is None:
                t = digest(w.encode()) % vocab
                if len(ids) < self._cache_words:
                    ids[w] = t
            out.append(t)
        return out

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        lines = [self.render_message(m) for m in messages]
        if add_generation_prompt:
            lines.append(GENERATION_PROMPT)
        return "\n".join(lines)

    @staticmethod
    def render_message(m: Message) -> str:
        """One message's lines: its ``<|role|>`` marker and content, then its tool calls as JSON.

        The prompt joins these with newlines, and words never span a newline, so a prompt's tokens
        are its messages' tokens one after the other (what :mod:`.prompt_cache` relies on)."""
        line = f"<|{m.get('role', 'user')}|> {content_text(m.get('content'))}"
        if m.get("tool_calls"):
            line += "\n" + json.dumps(m["tool_calls"], sort_keys=True)
        return line

    def decode(self, token_ids: Sequence[int]) -> str:
        return " ".join(f"t{t}" for t in token_ids)


class HfTokenizer:
    """A Hugging Face ``tokenizer.json`` plus chat template, loaded from a local directory."""

    def __init__(self, directory: str | Path) -> None:
        path = Path(directory)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise TokenizerError(f"no tokenizer.json in {path}")
        try:
            import jinja2.sandbox
            from tokenizers import Tokenizer as RustTokenizer
        except ImportError as e:  # an optional dependency of the router
            raise TokenizerError(f"the HF tokenizer needs 'tokenizers' and 'jinja2': {e}") from e
        self._tok = RustTokenizer.from_file(str(tok_file))
        self._name = path.name
        config: dict[str, Any] = {}
        cfg_file = path / "tokenizer_config.json"
        if cfg_file.is_file():
            config = json.loads(cfg_file.read_text())
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: use "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if not isinstance(template, str):
            raise TokenizerError(f"{cfg_file} has no chat_template")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        self._template = env.from_string(template)
        self._specials = {
            k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")
        }

    @property
    def name(self) -> str:
        return self._name

    def encode_text(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        import jinja2

        try:
            return str(
                self._template.render(
                    messages=list(messages), add_generation_prompt=add_generation_prompt, **self._specials
                )
            )
        except (
            jinja2.TemplateError,
            TypeError,
            ValueError,
            LookupError,
        ) as e:  # bad content for the template
            raise TokenizerError(f"chat template failed: {e}") from e

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(token_ids)))


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def _raise_template_error(message: str) -> None:
    raise TokenizerError(f"chat template: {message}")


def load_tokenizer(spec: str) -> Tokenizer:
    """``builtin`` or a local directory holding ``tokenizer.json`` and ``tokenizer_config.json``."""
    if spec == "builtin":
        return BuiltinTokenizer()
    return HfTokenizer(spec)
