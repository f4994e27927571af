"""A small trace in the Claude Code format (short prompts), written for the local-pool tests."""

from __future__ import annotations

import json
from pathlib import Path


def write_small_trace(
    path: Path, sessions: int = 4, turns: int = 5, block: int = 64, first: int = 3, per_turn: int = 3
) -> Path:
    """``sessions`` conversations: a main agent of ``turns`` turns that spawns a 2-turn sub-agent
    after its second turn; the first prompt has ``first`` blocks, each turn adds ``per_turn``;
    1-4 s recorded pauses."""
    rows = []
    for s in range(sessions):
        t = 0.0
        main: list[int] = []
        next_id = 1
        for turn in range(1, turns + 1):
            for _ in range(first if turn == 1 else per_turn):
                main.append(next_id)
                next_id += 1
            inp = len(main) * block + 20
            rows.append(_row(f"s{s}", "main", None, turn, t, inp, 40 + 10 * turn, list(main), block))
            t += 2.0 + turn % 3
            if turn == 2:
                sub = [*main[:2], next_id, next_id + 1]
                next_id += 2
                for k in range(1, 3):
                    rows.append(
                        _row(f"s{s}", "sub", "main", k, t + k, len(sub) * block + 5, 30, list(sub), block)
                    )
                    sub = [*sub, next_id]
                    next_id += 1
    with path.open("w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    return path


def _row(
    sid: str,
    agent: str,
    parent: str | None,
    turn: int,
    t: float,
    inp: int,
    out: int,
    ids: list[int],
    block: int,
) -> dict[str, object]:
    return {
        "session_id": sid,
        "agent_id": f"{sid}-{agent}",
        "parent_agent_id": None if parent is None else f"{sid}-{parent}",
        "turn": turn,
        "t": t,
        "input_length": inp,
        "output_length": out,
        "hash_ids": ids,
        "block_size": block,
        "api_time": 1.0,
        "think_time": 1.0,
    }
