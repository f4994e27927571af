"""``smetric``: sticks follow-ups, migrates on a missed deadline, first turns and evicted sessions are new."""

from __future__ import annotations

import dataclasses

import pytest
from router_policy_builders import node, request, uncached

from agentpool.models import TtftSlo
from agentpool.router.policy import NodeState, PolicyContext, PolicyError, RequestView, Role, create_policy
from agentpool.router.policy.smetric import estimate, kv_shortfall, predicted_tpot

# Deadline 2 s + 0.1 ms/token: 4.4 s for a 24K-token prompt.
CTX = PolicyContext(slo=TtftSlo(base=2.0, per_token=1e-4))
FOLLOW_UP = request(24_000, local={"a": 22_000}, turn=5, new_turn=2_000)
SOME = [uncached(8192)] * 2  # about 0.84 s of queued prefill
OVERLOAD = [uncached(8192)] * 12  # about 5 s of queued prefill: misses the 4.4 s deadline
BACKLOG = [uncached(8192)] * 5  # about 2.1 s of queued prefill: meets the 4.4 s deadline
# 20 output tokens: a 2.1 s backlog spread over them is ~0.1 s per token, over the 0.1 s TPOT SLO
SHORT_ANSWER = request(24_000, local={"a": 22_000}, turn=5, new_turn=2_000, out=20)

CASES: list[tuple[str, list[NodeState], RequestView, PolicyContext, dict[str, float], str]] = [
    (
        "follow-up sticks to its session though b is idle",
        [node("a", queue=SOME), node("b")],
        FOLLOW_UP,
        CTX,
        {},
        "a",
    ),
    (
        "follow-up migrates to the least loaded when sticking misses the deadline",
        [node("a", queue=OVERLOAD), node("b", queue=SOME), node("c", queue=[uncached(8192)])],
        FOLLOW_UP,
        CTX,
        {},
        "c",
    ),
    (
        "first turn is new: least loaded, even with a local hit on a",
        [node("a", queue=SOME), node("b")],
        request(24_000, local={"a": 15_000}, turn=1),
        CTX,
        {},
        "b",
    ),
    (
        "first turn: load subtracts the local hit, so an idle tie goes to the hit",
        [node("b"), node("a")],
        request(24_000, local={"a": 15_000}, turn=1),
        CTX,
        {},
        "a",
    ),
    (
        "evicted session (hit 2K < 0.8 * 22K expected) is new",
        [node("a", queue=SOME), node("b")],
        request(24_000, local={"a": 2_000}, turn=5, new_turn=2_000),
        CTX,
        {},
        "b",
    ),
    (
        "no node meets the deadline: least added load (the session's node)",
        [node("a", queue=OVERLOAD), node("b", queue=OVERLOAD + SOME)],
        FOLLOW_UP,
        CTX,
        {},
        "a",
    ),
    (
        "SLACK 0: no node meets the deadline, least added load",
        [node("a", queue=SOME), node("b")],
        FOLLOW_UP,
        CTX,
        {"slack": 0.0},
        "a",
    ),
    (
        "HIT_RATIO 0.05 keeps a mostly-evicted session sticky",
        [node("a", queue=SOME), node("b")],
        request(24_000, local={"a": 2_000}, turn=5, new_turn=2_000),
        CTX,
        {"hit_ratio": 0.05},
        "a",
    ),
    (
        "colocated: running decodes add interference and push a follow-up away",
        [
            node("a", role=Role.BOTH, queue=[uncached(8192)] * 6, running_decode=4000),
            node("b", role=Role.BOTH),
        ],
        FOLLOW_UP,
        CTX,
        {},
        "b",
    ),
    (
        "colocated: the session's node has no KV room to decode it: migrate to one that has",
        [
            node("a", role=Role.BOTH, queue=SOME, kv_room=20_000),
            node("b", role=Role.BOTH, queue=SOME),
            node("c", role=Role.BOTH, kv_room=10_000),
        ],
        FOLLOW_UP,
        CTX,
        {},
        "b",
    ),
    (
        "colocated: a first turn goes to the least loaded node that can decode it",
        [node("a", role=Role.BOTH, kv_room=0), node("b", role=Role.BOTH, queue=SOME)],
        request(24_000, turn=1),
        CTX,
        {},
        "b",
    ),
    (
        # a: 0.95 s to its first token + 2 x 0.11 s held up; b: 1.26 s, nobody held up
        "colocated, no node has KV room: least delay added, the session's node with 2 queued",
        [node("a", role=Role.BOTH, queue=SOME, kv_room=0), node("b", role=Role.BOTH, kv_room=0)],
        FOLLOW_UP,
        CTX,
        {},
        "a",
    ),
    (
        # a: 0.96 s + 32 x 0.11 s held up; b: 1.26 s (the old rule, load x requests, agreed here)
        "colocated, no node has KV room: a session node crowded with decodes adds more delay",
        [
            node("a", role=Role.BOTH, queue=SOME, running_decode=30, kv_room=0),
            node("b", role=Role.BOTH, kv_room=0),
        ],
        FOLLOW_UP,
        CTX,
        {},
        "b",
    ),
    (
        "colocated, no node has KV room: the session's node when it stalls the fewest",
        [
            node("a", role=Role.BOTH, queue=[uncached(8192)], kv_room=0),
            node("b", role=Role.BOTH, running_decode=3, kv_room=0),
        ],
        FOLLOW_UP,
        CTX,
        {},
        "a",
    ),
    (
        "colocated: the session node's room is promised to requests prefilled and waiting there",
        [node("a", role=Role.BOTH, kv_room=60_000, waiting=40_000), node("b", role=Role.BOTH)],
        FOLLOW_UP,
        CTX,
        {},
        "b",
    ),
    (
        "colocated: the session node's room is promised to the prompts queued before it",
        [
            node("a", role=Role.BOTH, queue=[uncached(8192, 30_000)], kv_room=60_000),
            node("b", role=Role.BOTH),
        ],
        FOLLOW_UP,
        CTX,
        {},
        "b",
    ),
    (
        "colocated: room left after the waiting and queued requests: stick",
        [
            node("a", role=Role.BOTH, queue=[uncached(8192, 10_000)], kv_room=70_000, waiting=20_000),
            node("b", role=Role.BOTH),
        ],
        FOLLOW_UP,
        CTX,
        {},
        "a",
    ),
    (
        "colocated: the TTFT holds but a short decode absorbs 2 s of backlog: TPOT misses, migrate",
        [node("a", role=Role.BOTH, queue=BACKLOG), node("b", role=Role.BOTH)],
        SHORT_ANSWER,
        CTX,
        {},
        "b",
    ),
    (
        "colocated: the same backlog over a 100-token decode meets the TPOT: stick",
        [node("a", role=Role.BOTH, queue=BACKLOG), node("b", role=Role.BOTH)],
        FOLLOW_UP,
        CTX,
        {},
        "a",
    ),
    (
        "colocated: a 1 s TPOT SLO holds for the short decode: stick",
        [node("a", role=Role.BOTH, queue=BACKLOG), node("b", role=Role.BOTH)],
        SHORT_ANSWER,
        dataclasses.replace(CTX, tpot_slo_s=1.0),
        {},
        "a",
    ),
    (
        "colocated: running decodes make the iteration itself miss a 20 ms TPOT SLO: migrate",
        [node("a", role=Role.BOTH, running_decode=60), node("b", role=Role.BOTH)],
        FOLLOW_UP,
        dataclasses.replace(CTX, tpot_slo_s=0.02),
        {},
        "b",
    ),
    (
        "colocated: a first turn avoids a node whose decodes it would stall past the TPOT",
        [node("a", role=Role.BOTH, queue=BACKLOG), node("b", role=Role.BOTH, queue=SOME + SOME)],
        request(24_000, turn=1, out=20),
        CTX,
        {},
        "b",
    ),
    (
        "prefill nodes: TPOT is not theirs to meet, a backlog the TTFT allows keeps the session",
        [node("a", queue=BACKLOG), node("b")],
        SHORT_ANSWER,
        CTX,
        {},
        "a",
    ),
    (
        "prefill nodes need no KV room: the decode node is chosen after the prefill",
        [node("a", queue=SOME, kv_room=0), node("b")],
        FOLLOW_UP,
        CTX,
        {},
        "a",
    ),
]


@pytest.mark.parametrize(
    ("nodes", "req", "ctx", "knobs", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_smetric_table(
    nodes: list[NodeState], req: RequestView, ctx: PolicyContext, knobs: dict[str, float], expected: str
) -> None:
    d = create_policy("smetric", knobs).choose(req, nodes, ctx)
    assert d.node_id == expected, d.reason


def test_slack_zero_routes_every_follow_up_by_least_added_load() -> None:
    # With SLACK 0 no node meets the deadline, so Figure 13's last branch (line 7: least added load)
    # decides, which is the session's node. smetric.md §5.5 says SLACK 0 makes "every follow-up
    # migrate"; that remark does not follow from Figure 13 as §4 describes it, and we follow §4.
    d = create_policy("smetric", {"slack": 0.0}).choose(FOLLOW_UP, [node("a", queue=SOME), node("b")], CTX)
    assert "least added load" in d.reason
    assert d.node_id == "a"


def test_colocated_without_decodes_sticks() -> None:
    nodes = [node("a", role=Role.BOTH, queue=[uncached(8192)] * 6), node("b", role=Role.BOTH)]
    assert create_policy("smetric").choose(FOLLOW_UP, nodes, CTX).node_id == "a"


def test_colocated_interference_is_counted_only_on_colocated_nodes() -> None:
    disagg = estimate(FOLLOW_UP, node("a", running_decode=100), CTX)
    colo = estimate(FOLLOW_UP, dataclasses.replace(node("a", running_decode=100), role=Role.BOTH), CTX)
    assert colo.load_s == pytest.approx(disagg.load_s + 1 * 1e-4 * 100)


def test_predicted_tpot_is_the_decode_iteration_plus_the_backlog_spread_over_the_output() -> None:
    a = node("a", role=Role.BOTH, queue=BACKLOG, running_decode=3)
    e = estimate(SHORT_ANSWER, a, CTX)
    iteration = a.model.decode.iteration_time(3 + 5 + 1)  # running, queued, the request
    assert predicted_tpot(SHORT_ANSWER, a, CTX, e) == pytest.approx(iteration + e.load_s / 20)
    # a long prefill is spread over its chunks when they outnumber the output tokens
    long = request(240_000, turn=1, out=2)
    e = estimate(long, a, CTX)
    chunks = -(-(5 * 8192 + 240_000) // 8192)
    assert predicted_tpot(long, a, CTX, e) == pytest.approx(iteration + e.load_s / chunks)


def test_kv_shortfall_counts_waiting_and_queued_prompts_on_colocated_nodes_only() -> None:
    queued = [uncached(8192, 10_000)]
    both = node("a", role=Role.BOTH, queue=queued, kv_room=50_000, waiting=20_000)
    # need 24,000 + 100; claimed before it 20,000 + 18,192; room 50,000
    assert kv_shortfall(FOLLOW_UP, both, CTX) == pytest.approx(24_100 + 38_192 - 50_000)
    assert kv_shortfall(FOLLOW_UP, dataclasses.replace(both, kv_room_tokens=90_000), CTX) == 0
    assert kv_shortfall(FOLLOW_UP, dataclasses.replace(both, role=Role.PREFILL), CTX) == 0
    assert predicted_tpot(FOLLOW_UP, both, CTX, estimate(FOLLOW_UP, both, CTX)) == float("inf")


def test_negative_waiting_kv_and_non_positive_tpot_slo_are_rejected() -> None:
    with pytest.raises(PolicyError):
        node("a", waiting=-1)
    with pytest.raises(PolicyError):
        PolicyContext(tpot_slo_s=0.0)
