"""Agent traces as conversations of dependent requests, and loaders for the shared traces.

A :class:`Conversation` is one top-level agent task: its requests in recorded order, each with
the request it depends on (the previous turn of its agent; for a sub-agent's first turn, the last
request its parent sent before it) and the pause after that dependency completes. A replay sends a
request once its dependency has completed and the pause has elapsed, with the recorded output
length (the Trie replayer's semantics, evolving-infra §6.1).

Block ids are per conversation (``hash_id_scope: local``). :meth:`Conversation.block_keys` turns
them into simulator-wide integer keys for one replayed instance, so two replays of the same
conversation never share KV, and prepends the shared system-and-tools prefix: the first
``shared_prefix_blocks`` block positions of every request map to the same global keys in every
conversation (the Claude Code trace hides that sharing; its README puts it at about 15K tokens).

Loaders:

- :func:`load_claude_code`: the Claude Code trace (``session_id``, ``agent_id``,
  ``parent_agent_id``, ``turn``, ``t``, ``api_time``, ``think_time``, 64-token ``hash_ids``).
- :func:`load_mooncake`: the Mooncake trace (``timestamp`` ms, 512-token ``hash_ids``); each line
  is an independent request (the trace has no sessions), arriving at its recorded time.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
import orjson

IntArray = npt.NDArray[np.int64]

# Keys of one replayed instance are ``instance * INSTANCE_STRIDE + local id``; instance 0 holds the
# shared prefix, so its keys (1..shared_prefix_blocks) never collide with a conversation's.
INSTANCE_STRIDE = 1 << 32


class TraceError(ValueError):
    """A trace file is malformed or does not match the expected schema."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a conversation.

    blocks: the prompt's full-block ids (local to the conversation), one per ``block_size`` tokens.
    produced: ids of the full blocks the output adds to the context (taken from the agent's next
        request when it extends this one); they exist on the decode node once the request is done.
    depends_on: index (in the conversation) of the request this one waits for, -1 for none.
    delay_s: pause after the dependency completes (tool call, user, sub-agent spawn).
    """

    agent: int
    turn: int
    input_tokens: int
    output_tokens: int
    blocks: IntArray
    produced: IntArray
    depends_on: int
    delay_s: float
    last_of_agent: bool = True


@dataclass(frozen=True, slots=True)
class Conversation:
    """A top-level agent task: requests in recorded order and who waits for whom."""

    name: str
    requests: tuple[TraceRequest, ...]
    block_size: int
    children: tuple[tuple[int, ...], ...]
    kind: str = "trace"

    @staticmethod
    def build(
        name: str, requests: Sequence[TraceRequest], block_size: int, kind: str = "trace"
    ) -> Conversation:
        children: list[list[int]] = [[] for _ in requests]
        for i, r in enumerate(requests):
            if r.depends_on >= i:
                raise TraceError(f"{name}: request {i} depends on a later request {r.depends_on}")
            if r.depends_on >= 0:
                children[r.depends_on].append(i)
        return Conversation(name, tuple(requests), block_size, tuple(tuple(c) for c in children), kind)

    @property
    def roots(self) -> list[int]:
        return [i for i, r in enumerate(self.requests) if r.depends_on < 0]

    def block_keys(
        self, index: int, instance: int, shared_prefix_blocks: int, group: int = 1
    ) -> tuple[list[int], list[int]]:
        """Simulator-wide keys of request ``index``'s prompt blocks and produced blocks.

        ``group`` > 1 coarsens the blocks: every ``group`` consecutive trace blocks become one
        simulator block, keyed by the id of its last trace block (ids are chained, so that id names
        the whole prefix). A prompt's trailing partial group is not cached, as a partial page is not.
        ``shared_prefix_blocks`` counts simulator blocks.
        """
        if group < 1:
            raise ValueError(f"group must be >= 1, got {group}")
        r = self.requests[index]
        full = np.concatenate((r.blocks, r.produced)) if len(r.produced) else r.blocks
        coarse = full[group - 1 :: group] + instance * INSTANCE_STRIDE
        k = min(shared_prefix_blocks, len(coarse))
        if k:
            coarse[:k] = np.arange(1, k + 1)
        n_prompt = len(r.blocks) // group
        keys: list[int] = coarse.tolist()
        return keys[:n_prompt], keys[n_prompt:]


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def _need(row: dict[str, Any], key: str, line: int) -> Any:
    try:
        return row[key]
    except KeyError:
        raise TraceError(f"line {line}: missing field {key!r}") from None


def _produced(prev: list[int], prev_in: int, prev_out: int, nxt: list[int], block: int) -> list[int]:
    """Blocks the output of ``prev`` adds: the next prompt's blocks after ``prev``, within its output."""
    n = len(prev)
    if len(nxt) <= n or nxt[:n] != prev:
        return []
    end = min(len(nxt), (prev_in + prev_out) // block)
    return nxt[n:end] if end > n else []


def _session_of(line: str) -> str | None:
    """The ``session_id`` of a trace line without parsing it (None if not in the compact form)."""
    key = '"session_id":"'
    i = line.find(key)
    if i < 0:
        return None
    j = line.find('"', i + len(key))
    return line[i + len(key) : j] if j > 0 else None


def load_claude_code(path: str | Path, limit: int | None = None) -> list[Conversation]:
    """Conversations of the Claude Code trace (gzipped or plain JSONL), in file order."""
    sessions: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    with _open(Path(path)) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if limit is not None and len(sessions) >= limit:
                quick = _session_of(line)
                if quick is not None and quick not in sessions:
                    continue  # skip parsing conversations past the limit
            try:
                row = orjson.loads(line)  # 2.6x json's speed on the bundled trace's 89 MB
            except orjson.JSONDecodeError as e:
                raise TraceError(f"{path}:{lineno}: not JSON: {e}") from e
            sid = str(_need(row, "session_id", lineno))
            if sid not in sessions:
                if limit is not None and len(sessions) >= limit:
                    continue
                sessions[sid] = []
            sessions[sid].append((lineno, row))
    return [_conversation(sid, rows) for sid, rows in sessions.items()]


def _conversation(sid: str, rows: list[tuple[int, dict[str, Any]]]) -> Conversation:
    rows = sorted(rows, key=lambda lr: (float(_need(lr[1], "t", lr[0])), lr[0]))
    agents: dict[str, int] = {}
    parent_of: dict[str, str | None] = {}
    block = 0
    for lineno, row in rows:
        aid = str(_need(row, "agent_id", lineno))
        parent = row.get("parent_agent_id")
        agents.setdefault(aid, len(agents))
        parent_of[aid] = None if parent is None else str(parent)
        bs = int(_need(row, "block_size", lineno))
        if block and bs != block:
            raise TraceError(f"{sid}: mixed block sizes {block} and {bs}")
        block = bs
    last_of_agent: dict[str, int] = {}
    pending: list[dict[str, Any]] = []
    for i, (lineno, row) in enumerate(rows):
        aid = str(row["agent_id"])
        t = float(row["t"])
        if aid in last_of_agent:
            dep = last_of_agent[aid]
            delay = float(row.get("think_time") or 0.0)
        else:
            parent = parent_of[aid]
            dep = -1
            delay = t
            if parent is not None and parent in last_of_agent:
                dep = last_of_agent[parent]
            elif parent is not None:
                # the parent's earliest request is after this one (clock skew): start with the conversation
                dep = -1
            if dep >= 0:
                prev = rows[dep][1]
                delay = t - (float(prev["t"]) + float(prev.get("api_time") or 0.0))
            elif i > 0:
                delay = t
        last_of_agent[aid] = i
        hashes = _need(row, "hash_ids", lineno)
        if not isinstance(hashes, list):
            raise TraceError(f"{sid}: line {lineno}: hash_ids must be a list")
        pending.append(
            {
                "agent": agents[aid],
                "turn": int(_need(row, "turn", lineno)),
                "input": int(_need(row, "input_length", lineno)),
                "output": int(_need(row, "output_length", lineno)),
                "blocks": hashes,
                "dep": dep,
                "delay": max(0.0, delay),
                "aid": aid,
            }
        )
    next_of: dict[int, int] = {}
    last_index: dict[str, int] = {}
    for i, p in enumerate(pending):
        if p["aid"] in last_index:
            next_of[last_index[p["aid"]]] = i
        last_index[p["aid"]] = i
    requests = []
    for i, p in enumerate(pending):
        nxt = next_of.get(i)
        produced = (
            _produced(p["blocks"], p["input"], p["output"], pending[nxt]["blocks"], block) if nxt else []
        )
        requests.append(
            TraceRequest(
                agent=p["agent"],
                turn=p["turn"],
                input_tokens=p["input"],
                output_tokens=max(1, p["output"]),
                blocks=np.asarray(p["blocks"], dtype=np.int64),
                produced=np.asarray(produced, dtype=np.int64),
                depends_on=p["dep"],
                delay_s=p["delay"],
                last_of_agent=nxt is None,
            )
        )
    return Conversation.build(sid, requests, block or 64, kind="claude-code")


def cap_context(conversations: Sequence[Conversation], max_tokens: int) -> tuple[list[Conversation], int]:
    """The conversations as a model with a ``max_tokens`` context sees them, and how many requests
    that removed.

    An engine refuses a request whose prompt and output do not fit its context (SGLang answers 400),
    so the agent cannot go on from it: the request, and every request that waits on it (its agent's
    later turns, the sub-agents it spawns, theirs), leave the conversation. The rest keep their
    order, dependencies and pauses; a conversation left empty is dropped. Without this a replay of
    the Claude Code trace (prompts up to 880K tokens) on a node whose KV holds less sends requests
    no node can ever decode, and the node holding one stalls for the rest of the run.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    out: list[Conversation] = []
    removed = 0
    for conv in conversations:
        reqs = conv.requests
        gone = [False] * len(reqs)
        for i, r in enumerate(reqs):  # dependencies point backwards, so one pass suffices
            too_long = r.input_tokens + r.output_tokens > max_tokens
            gone[i] = too_long or (r.depends_on >= 0 and gone[r.depends_on])
        n_gone = sum(gone)
        if not n_gone:
            out.append(conv)
            continue
        removed += n_gone
        new_index: dict[int, int] = {}
        kept: list[TraceRequest] = []
        for i, r in enumerate(reqs):
            if not gone[i]:
                new_index[i] = len(kept)
                kept.append(r)
        if not kept:
            continue
        last_kept = {r.agent: new_index[i] for i, r in enumerate(reqs) if not gone[i]}
        requests = [
            replace(
                r,
                depends_on=new_index[r.depends_on] if r.depends_on >= 0 else -1,
                last_of_agent=last_kept[r.agent] == j,
            )
            for j, r in enumerate(kept)
        ]
        out.append(Conversation.build(conv.name, requests, conv.block_size, conv.kind))
    return out, removed


def load_mooncake(path: str | Path, limit: int | None = None) -> list[tuple[float, Conversation]]:
    """Mooncake requests as single-request conversations with their arrival times (seconds).

    The trace's ids are global (shared prefixes across requests are real), so a replay must give all
    of them the same instance (the replay does for ``kind == "mooncake"``); block size 512.
    """
    out: list[tuple[float, Conversation]] = []
    with _open(Path(path)) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if limit is not None and len(out) >= limit:
                break
            row = orjson.loads(line)
            ts = float(_need(row, "timestamp", lineno)) / 1000.0
            req = TraceRequest(
                agent=0,
                turn=1,
                input_tokens=int(_need(row, "input_length", lineno)),
                output_tokens=max(1, int(_need(row, "output_length", lineno))),
                blocks=np.asarray(_need(row, "hash_ids", lineno), dtype=np.int64),
                produced=np.zeros(0, dtype=np.int64),
                depends_on=-1,
                delay_s=0.0,
            )
            out.append((ts, Conversation.build(f"mooncake-{lineno}", [req], 512, kind="mooncake")))
    return out


def iter_requests(conversations: Sequence[Conversation]) -> Iterator[TraceRequest]:
    for c in conversations:
        yield from c.requests
