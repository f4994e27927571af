"""Decode binding: KV room first, then the fewest running requests."""

from __future__ import annotations

import pytest
from router_policy_builders import node, request

from agentpool.router.policy import NodeState, PolicyContext, Role, bind_decode

D = Role.DECODE
CASES: list[tuple[str, list[NodeState], str | None]] = [
    ("fewest running", [node("a", role=D, running_decode=3), node("b", role=D, running_decode=1)], "b"),
    ("no room on the idle one", [node("a", role=D, running_decode=3), node("b", role=D, kv_room=100)], "a"),
    ("tie: most room", [node("a", role=D, kv_room=5000), node("b", role=D, kv_room=9000)], "b"),
    (
        "draining and closed are skipped",
        [
            node("a", role=D, draining=True),
            node("b", role=D, accepting=False),
            node("c", role=D, running_decode=9),
        ],
        "c",
    ),
    ("prefill nodes are not decode nodes", [node("a", role=Role.PREFILL), node("b", role=Role.BOTH)], None),
    ("nobody has room", [node("a", role=D, kv_room=1000)], None),
]


@pytest.mark.parametrize(("nodes", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decode_binding(nodes: list[NodeState], expected: str | None) -> None:
    b = bind_decode(request(1000, out=200), nodes, PolicyContext())
    assert (b.node_id if b else None) == expected
