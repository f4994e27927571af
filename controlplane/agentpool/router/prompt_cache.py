"""Chat prompts' token ids and block hashes, memoized per message prefix (the built-in tokenizer).

Agents resend their conversation every turn: a request's earlier messages are byte-identical to the
previous turn's. With the built-in tokenizer a prompt's tokens are its messages' tokens one after
the other (:meth:`BuiltinTokenizer.render_message`), so each message is tokenized once: the memo
maps the *chain* of a request's rendered messages up to message ``i`` (a 128-bit xxh3 of their
bytes, each followed by 0xff) to message ``i``'s token ids and the hashes of the pages that end within it.
The chain pins every token before the message, hence the page it starts in and the parent hash,
so a hit is exact: the same ids and hashes as :func:`~agentpool.router.tokenizer.encode_chat` and
:func:`~agentpool.kv.block_hashes` of the whole prompt (a test compares them on replayed traces).

Three steps, so that a big miss can be tokenized off the event loop without sharing the memo with
a thread: :meth:`PromptCache.lookup` (render and walk the hits, on the loop), :meth:`PromptCache.tokenize`
(the messages after the first miss: pure, may run in a worker thread), :meth:`PromptCache.finish`
(store them, on the loop). The memo holds at most ``max_tokens`` tokens (least recently used out).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import xxhash

from agentpool.kv.hashing import ROOT_HASH, block_hashes
from agentpool.router.tokenizer import (
    GENERATION_PROMPT,
    BuiltinTokenizer,
    Encoded,
    Message,
    TokenizerError,
    last_assistant_index,
    turn_of,
)

DEFAULT_MAX_TOKENS = 4_000_000  # about 60-180 MB: 8 bytes a token for the ids, about 7 for their JSON,
# up to 28 more for id objects once the built-in tokenizer's word memo churns


@dataclass(frozen=True, slots=True)
class _Entry:
    """Tuples, not lists: the cyclic GC untracks a tuple of ints, so a full memo adds nothing to a
    full collection (with lists it cost about 80 ms at 4M tokens)."""

    ids: tuple[int, ...]  # the message's tokens
    hashes: tuple[int, ...]  # hashes of the pages that end within the message (given what precedes it)
    ids_json: bytes  # the ids' JSON without its brackets (the engine's body carries the prompt's ids)


@dataclass(slots=True)
class Lookup:
    """A request after :meth:`PromptCache.lookup`: the hit messages' tokens and hashes, the rest to do."""

    lines: list[str]
    keys: list[int]  # the chain key after each message
    hit: int  # messages[:hit] came from the memo
    ids: list[int]
    hashes: list[int]
    parts: list[bytes]  # the messages' non-empty ids JSON, in order
    cut: int  # the last assistant message's index (-1: none)
    cut_end: int | None  # tokens through it (None: not reached yet, or none)
    turn: int

    @property
    def missing_chars(self) -> int:
        return sum(len(line) for line in self.lines[self.hit :])


class PromptCache:
    def __init__(
        self, tokenizer: BuiltinTokenizer, page_size: int, max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.tokenizer = tokenizer
        self.page_size = page_size
        self.max_tokens = max_tokens
        self._memo: OrderedDict[int, _Entry] = OrderedDict()
        self._size = 0  # tokens held, plus one per entry
        self._gen_ids = tokenizer.encode_text(GENERATION_PROMPT)
        self._gen_json = orjson.dumps(self._gen_ids)[1:-1]

    def __len__(self) -> int:
        return len(self._memo)

    @property
    def size(self) -> int:
        return self._size

    def encode_chat(self, messages: Sequence[Message]) -> Encoded:
        """:meth:`lookup`, :meth:`tokenize` and :meth:`finish` in one call."""
        found = self.lookup(messages)
        return self.finish(found, self.tokenize(found))

    def lookup(self, messages: Sequence[Message]) -> Lookup:
        """Render every message and take the memo's entries for the longest known message prefix."""
        if not messages:
            raise TokenizerError("messages must not be empty")
        render = self.tokenizer.render_message
        lines = [render(m) for m in messages]  # raises TokenizerError for content it cannot render
        keys: list[int] = []
        h = xxhash.xxh3_128()
        for line in lines:  # framed by a 0xff byte, which UTF-8 never contains
            h.update(line.encode("utf-8", "surrogatepass") + b"\xff")
            keys.append(h.intdigest())
        cut = last_assistant_index(messages)
        ids: list[int] = []
        hashes: list[int] = []
        parts: list[bytes] = []
        cut_end: int | None = None
        memo = self._memo
        hit = 0
        for key in keys:
            entry = memo.get(key)
            if entry is None:
                break
            memo.move_to_end(key)
            ids += entry.ids
            hashes += entry.hashes
            if entry.ids_json:
                parts.append(entry.ids_json)
            if hit == cut:
                cut_end = len(ids)
            hit += 1
        return Lookup(lines, keys, hit, ids, hashes, parts, cut, cut_end, turn_of(messages))

    def tokenize(self, found: Lookup) -> list[_Entry]:
        """Tokens and page hashes of the messages after the hits (pure: safe in a worker thread).

        Extends ``found.ids`` and ``found.hashes`` through the last message."""
        page = self.page_size
        encode = self.tokenizer.encode_text
        ids, hashes = found.ids, found.hashes
        out: list[_Entry] = []
        for i in range(found.hit, len(found.lines)):
            mine = encode(found.lines[i])
            start = len(hashes) * page  # the first token of the page the message's tokens start in
            new = block_hashes(ids[start:] + mine, page, hashes[-1] if hashes else ROOT_HASH)
            ids += mine
            hashes += new
            fragment = orjson.dumps(mine)[1:-1]
            if fragment:
                found.parts.append(fragment)
            out.append(_Entry(tuple(mine), tuple(new), fragment))
            if i == found.cut:
                found.cut_end = len(ids)
        return out

    def finish(self, found: Lookup, done: list[_Entry]) -> Encoded:
        """Store what :meth:`tokenize` computed; the prompt's :class:`Encoded` with its page hashes."""
        memo = self._memo
        for key, entry in zip(found.keys[found.hit :], done, strict=True):
            old = memo.pop(key, None)  # another request stored it meanwhile: the same values
            if old is not None:
                self._size -= len(old.ids) + 1
            memo[key] = entry
            self._size += len(entry.ids) + 1
        while self._size > self.max_tokens and memo:
            _, gone = memo.popitem(last=False)
            self._size -= len(gone.ids) + 1
        page = self.page_size
        ids = found.ids + self._gen_ids
        hashes = found.hashes
        if len(ids) // page > len(hashes):  # the generation prompt completes a page
            start = len(hashes) * page
            hashes = hashes + block_hashes(ids[start:], page, hashes[-1] if hashes else ROOT_HASH)
        new_turn = len(ids) if found.cut_end is None else len(ids) - found.cut_end
        ids_json = b"[%s]" % b",".join([*found.parts, self._gen_json] if self._gen_json else found.parts)
        return Encoded(ids, found.turn, new_turn, hashes=hashes, page_size=page, token_ids_json=ids_json)
