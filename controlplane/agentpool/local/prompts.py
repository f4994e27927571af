"""Prompts synthesized from a trace's block ids, so that prefix sharing through the router is exact.

Pure: no I/O, no clock. The router's built-in tokenizer (``agentpool.router.tokenizer``) turns each
whitespace-separated word into one token, so a prompt of ``n`` words is ``n`` tokens plus the chat
markers it renders (``<|user|>``, ``<|assistant|>``: one token each).

- A block key (``Conversation.block_keys``: chained, so equal keys mean an equal prefix) becomes
  ``block_size`` words: a head word naming the key, then filler words that vary with the key and the
  position. Two prompts share their first ``k`` words exactly when they share their first ``k //
  block_size`` keys (plus the part of the next block both hold).
- A request's words are the words of its prompt blocks followed by its produced blocks (the blocks
  the next turn of its agent adds, which cover the tail of this prompt and the start of its output),
  cut to its input length; a prompt longer than that is padded with words unique to the request.
- A harness sends the conversation so far as chat messages. :class:`AgentHistory` keeps where the
  previous turns of one agent cut its context into user and assistant messages, so that each turn's
  rendering extends the previous one token for token. Where a prompt keeps only part of the
  previous one (an edited last message, compaction, a context reset), the cuts inside the part it
  keeps stay and the rest of it becomes one user message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_FILLER = tuple(f"{a}{b}" for a in "bcdfghjklmnpqrstvwxz" for b in "aeiou")  # 100 short words


class WordCache:
    """Memoized words of block keys (a prompt repeats most keys of the previous turn)."""

    def __init__(self, block_size: int, capacity: int = 200_000) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be positive, got {block_size}")
        self.block_size = block_size
        self._capacity = capacity
        self._words: dict[int, str] = {}

    def block(self, key: int) -> str:
        """The ``block_size`` words of ``key``, space-separated."""
        text = self._words.get(key)
        if text is None:
            if len(self._words) >= self._capacity:
                self._words.clear()
            n = len(_FILLER)
            words = [f"k{key:x}"]
            words.extend(_FILLER[(key + j * 7) % n] for j in range(1, self.block_size))
            text = self._words[key] = " ".join(words)
        return text


def prompt_words(
    cache: WordCache, blocks: Sequence[int], produced: Sequence[int], input_tokens: int, pad_tag: str
) -> list[str]:
    """The ``input_tokens`` words of a request's prompt (see the module docstring)."""
    if input_tokens < 1:
        raise ValueError(f"a prompt needs at least one token, got {input_tokens}")
    size = cache.block_size
    needed = -(-input_tokens // size)  # blocks that cover the prompt
    keys = list(blocks[:needed])
    if len(keys) < needed:
        keys.extend(produced[: needed - len(keys)])
    words = " ".join(cache.block(k) for k in keys).split() if keys else []
    if len(words) < input_tokens:
        pad = input_tokens - len(words)
        words.extend(f"p{pad_tag}.{j}" for j in range(pad))
    return words[:input_tokens]


@dataclass(slots=True)
class AgentHistory:
    """Where one agent's previous turns cut its context into alternating user/assistant messages."""

    keys: list[int] = field(default_factory=list)  # prompt block keys of the previous turn
    cuts: list[int] = field(default_factory=list)  # word offsets: user | assistant | user | ...
    last_input: int = 0
    last_output: int = 0

    def messages(self, blocks: Sequence[int], words: Sequence[str], block_size: int) -> list[dict[str, Any]]:
        """Chat messages of this turn's prompt ``words`` (block keys ``blocks``); updates the history."""
        n = len(words)
        shared = 0  # leading blocks this prompt has in common with the previous one
        for old, new in zip(self.keys, blocks, strict=False):
            if old != new:
                break
            shared += 1
        same_words = shared * block_size if shared < len(self.keys) else self.last_input
        cuts = [c for c in self.cuts if c <= same_words]
        if len(cuts) % 2:  # an assistant message the prompt keeps a part of: keep that part
            if cuts[-1] < min(same_words, n):
                cuts.append(min(same_words, n))
            else:
                cuts.pop()
        if self.keys and self.last_input <= same_words and self.last_input < n:
            cuts.extend((self.last_input, min(n, self.last_input + self.last_output)))
        self.cuts = cuts
        self.keys = list(blocks)
        self.last_input = n
        bounds = [0, *self.cuts, n]
        out: list[dict[str, Any]] = []
        for i in range(len(bounds) - 1):
            role = "user" if i % 2 == 0 else "assistant"
            out.append({"role": role, "content": " ".join(words[bounds[i] : bounds[i + 1]])})
        return out

    def answered(self, output_tokens: int) -> None:
        """The turn sent last was answered with ``output_tokens`` tokens."""
        self.last_output = max(0, output_tokens)
