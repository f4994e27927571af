"""``smetric`` ties: equal seconds of load go to the node with fewer requests, then less KV in use,
then a rendezvous hash of (request, node): never all to the smallest node id."""

from __future__ import annotations

import collections

import pytest
from router_policy_builders import node, request, uncached

from agentpool.router.policy import NodeState, PolicyContext, RequestView, Role, create_policy

CTX = PolicyContext()
IDLE = [node(n) for n in "abcd"]
FOLLOW_UP = request(24_000, local={"a": 22_000, "b": 22_000}, turn=5, new_turn=2_000)

CASES: list[tuple[str, list[NodeState], RequestView, str]] = [
    (
        "equal seconds of load: the node without running decodes",
        [node("a", role=Role.PREFILL, running_decode=3), node("b")],
        request(4000),
        "b",
    ),
    (
        "equal seconds and requests: the node with less KV in use",
        [node("a", kv_used=50_000), node("b", kv_used=10_000)],
        request(4000),
        "b",
    ),
    (
        "a session cached on two nodes: the one with fewer decodes, not the smaller id",
        [node("a", running_decode=2), node("b", running_decode=1)],
        FOLLOW_UP,
        "b",
    ),
    (
        "seconds of load still decide first",
        [node("a", queue=[uncached(1000)]), node("b", running_decode=5, kv_used=90_000)],
        request(4000),
        "b",
    ),
]


@pytest.mark.parametrize("why,nodes,req,expected", CASES, ids=[c[0] for c in CASES])
def test_ties_are_broken_by_load(why: str, nodes: list[NodeState], req: RequestView, expected: str) -> None:
    assert create_policy("smetric").choose(req, nodes, CTX).node_id == expected, why
    # the order of the candidates does not matter
    assert create_policy("smetric").choose(req, nodes[::-1], CTX).node_id == expected, why


def test_first_turns_on_idle_nodes_spread_and_each_request_keeps_its_choice() -> None:
    policy = create_policy("smetric")
    picks = collections.Counter(
        policy.choose(request(2000, rid=f"agent-{i}-turn-1"), IDLE, CTX).node_id for i in range(1000)
    )
    assert sorted(picks) == ["a", "b", "c", "d"]
    assert all(200 <= c <= 300 for c in picks.values()), picks  # about 250 each
    again = request(2000, rid="agent-7-turn-1")
    assert (
        len({policy.choose(again, nodes, CTX).node_id for nodes in (IDLE, IDLE[::-1], IDLE[1:] + IDLE[:1])})
        == 1
    )


def test_eight_agents_at_concurrency_one_do_not_all_land_on_one_engine() -> None:
    """Disaggregated prefill engines: each first turn is prefilled before the next agent's
    arrives, so every first turn sees four idle, equal engines (the reported bug: all 8 on "a")."""
    policy = create_policy("smetric")
    picks = collections.Counter(
        policy.choose(request(3000, rid=f"chatcmpl-agent-{i}"), IDLE, CTX).node_id for i in range(8)
    )
    assert len(picks) >= 3 and max(picks.values()) <= 4, picks
