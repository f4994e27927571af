"""``session-id``: rendezvous-hash stickiness by the session (branch) id; least-loaded without one."""

from __future__ import annotations

import dataclasses

import pytest
from router_policy_builders import node, request

from agentpool.models import Work
from agentpool.router.policy import PolicyContext, create_policy
from agentpool.router.policy.session_id import affinity

CTX = PolicyContext()
NODES = [node("a"), node("b"), node("c"), node("d")]


def with_session(session: str | None, **kw: object) -> object:
    return dataclasses.replace(request(4096, **kw), branch_id=session)  # type: ignore[arg-type]


def pinned(session: str, ids: list[str]) -> str:
    return max(ids, key=lambda n: (affinity(session, n), n))


@pytest.mark.parametrize(
    ("name", "session", "nodes", "expected"),
    [
        ("session goes to its rendezvous node", "s-1", NODES, pinned("s-1", ["a", "b", "c", "d"])),
        ("another session may go elsewhere", "s-2", NODES, pinned("s-2", ["a", "b", "c", "d"])),
        (
            "load does not move a session",
            "s-1",
            [
                dataclasses.replace(n, running_decode=50) if n.node_id == pinned("s-1", list("abcd")) else n
                for n in NODES
            ],
            pinned("s-1", ["a", "b", "c", "d"]),
        ),
        ("no session: fewest requests", None, [node("a", queue=[Work(100)]), node("b")], "b"),
    ],
)
def test_session_id_table(name: str, session: str | None, nodes: list[object], expected: str) -> None:
    d = create_policy("session-id").choose(with_session(session), nodes, CTX)  # type: ignore[arg-type]
    assert d.node_id == expected, (name, d.reason)


def test_sessions_spread_and_only_a_removed_nodes_sessions_move() -> None:
    policy = create_policy("session-id")
    sessions = [f"s{i}" for i in range(200)]
    before = {s: policy.choose(with_session(s), NODES, CTX).node_id for s in sessions}  # type: ignore[arg-type]
    assert all(list(before.values()).count(n) > 20 for n in "abcd")  # spread over the nodes
    without_c = [n for n in NODES if n.node_id != "c"]
    after = {s: policy.choose(with_session(s), without_c, CTX).node_id for s in sessions}  # type: ignore[arg-type]
    assert all(after[s] == before[s] for s in sessions if before[s] != "c")
