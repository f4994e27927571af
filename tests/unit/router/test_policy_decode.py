"""Decode binding: KV room first, then the fewest running requests."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from router_policy_builders import node, request

from agentpool.router.policy import (
    NodeState,
    PolicyContext,
    Role,
    bind_decode,
    decode_role,
    decode_room_will_free,
)

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


def reference_binding(need: int, nodes: list[NodeState]) -> NodeState | None:
    """The rule as one scan: lowest (running, -room, id) among decode nodes that take the request."""
    best: NodeState | None = None
    for n in nodes:
        if n.role is not D or not n.accepting or n.draining or n.kv_room_tokens < need:
            continue
        if best is None or (n.running_decode, -n.kv_room_tokens, n.node_id) < (
            best.running_decode,
            -best.kv_room_tokens,
            best.node_id,
        ):
            best = n
    return best


decode_nodes = st.lists(
    st.tuples(
        st.sampled_from([D, D, D, Role.PREFILL]),
        st.integers(0, 3),  # running: few values, so ties are common
        st.sampled_from([0, 1000, 1200, 5000, 9000]),  # KV room (the request needs 1200)
        st.booleans(),
        st.booleans(),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(decode_nodes)
def test_binding_equals_the_lexicographic_scan(parts: list[tuple[Role, int, int, bool, bool]]) -> None:
    nodes = [
        node(f"n{(i * 5) % 11}", role=role, running_decode=run, kv_room=room, accepting=acc, draining=dr)
        for i, (role, run, room, acc, dr) in enumerate(parts)
    ]
    b = bind_decode(request(1000, out=200), nodes, PolicyContext())
    ref = reference_binding(1200, nodes)
    assert (b.node_id if b else None) == (ref.node_id if ref else None)


# The request needs 1,200 KV tokens (1,000 prompt + 200 output).
WAIT_CASES: list[tuple[str, list[NodeState], bool]] = [
    (
        "busy decode node big enough: room frees",
        [node("a", role=D, running_decode=2, kv_used=90_000, kv_room=0)],
        True,
    ),
    ("KV held by bound requests frees too", [node("a", role=D, kv_used=5_000, kv_room=0)], True),
    (
        "down, nothing held: nothing frees",
        [node("a", role=D, kv_used=0, kv_room=90_000, accepting=False)],
        False,
    ),
    ("too small even when empty", [node("a", role=D, running_decode=1, kv_used=100, kv_room=900)], False),
    ("exactly big enough", [node("a", role=D, running_decode=1, kv_used=1100, kv_room=100)], True),
    (
        "switching into decode: it serves soon",
        [node("a", role=D, kv_used=0, kv_room=90_000, draining=True)],
        True,
    ),
    (
        "switching into decode but too small",
        [node("a", role=D, kv_used=0, kv_room=1000, draining=True)],
        False,
    ),
    (
        "prefill nodes do not count",
        [node("a", role=Role.PREFILL, running_decode=2, kv_used=90_000, kv_room=0)],
        False,
    ),
    ("no nodes", [], False),
]


@pytest.mark.parametrize(("nodes", "expected"), [c[1:] for c in WAIT_CASES], ids=[c[0] for c in WAIT_CASES])
def test_decode_room_will_free(nodes: list[NodeState], expected: bool) -> None:
    assert decode_room_will_free(request(1000, out=200), nodes) is expected


def test_a_colocated_pool_decodes_on_colocated_nodes() -> None:
    # the pool went colocated (planner warmup) while a request was in prefill: no decode node is left
    both = [node("a", role=Role.BOTH, running_decode=2), node("b", role=Role.BOTH, running_decode=1)]
    assert decode_role(both) is Role.BOTH
    assert bind_decode(request(1000, out=200), both, PolicyContext()) is None  # decode nodes only
    b = bind_decode(request(1000, out=200), both, PolicyContext(), Role.BOTH)
    assert b is not None and b.node_id == "b"
    # a node switching into decode keeps the decode role: the request waits for it
    mixed = [*both, node("c", role=D, draining=True)]
    assert decode_role(mixed) is D and bind_decode(request(1000, out=200), mixed, PolicyContext(), D) is None
    assert decode_room_will_free(request(1000, out=200), mixed, D)
