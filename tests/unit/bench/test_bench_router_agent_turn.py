"""bench_router's agent prompts: the same history every turn, a new last message each time."""

from __future__ import annotations

import json

from bench.bench_router import agent_turn


def test_an_agent_resends_its_history_and_adds_one_new_message() -> None:
    a, b = (json.loads(agent_turn(3, turn, 6)) for turn in (10, 11))
    assert len(a["messages"]) == len(b["messages"]) == 7
    assert a["messages"][:6] == b["messages"][:6]
    assert a["messages"][6] != b["messages"][6] and a["messages"][6]["role"] == "user"
    assert [m["role"] for m in a["messages"][:3]] == ["user", "assistant", "user"]
    assert len(a["messages"][0]["content"].split()) == 300
    other = json.loads(agent_turn(4, 10, 6))
    assert other["messages"][0] != a["messages"][0]  # each worker is its own agent
