"""Baselines, one table per module: round-robin, least-loaded, cache-aware, dynamo, lmetric, linear."""

from __future__ import annotations

import pytest
from router_policy_builders import node, request, uncached

from agentpool.router.policy import NodeState, PolicyContext, RequestView, Role, create_policy

CTX = PolicyContext()
Q = uncached(1000)

Case = tuple[str, str, dict[str, float], list[NodeState], RequestView, str]

CASES: list[Case] = [
    # least-loaded: fewest requests, ties to fewer queued tokens, ignores the cache
    (
        "least-loaded",
        "fewest requests",
        {},
        [node("a", queue=[Q, Q]), node("b", queue=[Q])],
        request(10),
        "b",
    ),
    (
        "least-loaded",
        "tie on count: fewer queued tokens",
        {},
        [node("a", queue=[uncached(900)]), node("b", queue=[uncached(100)])],
        request(10, local={"a": 10}),
        "b",
    ),
    (
        "least-loaded",
        "colocated nodes count running decodes",
        {},
        [node("a", role=Role.BOTH, running_decode=5), node("b", role=Role.BOTH, queue=[Q])],
        request(10),
        "b",
    ),
    # cache-aware (SGLang): imbalance -> shortest queue; match rate > 0.3 -> longest match; else most room
    (
        "cache-aware",
        "balanced, match rate 0.5 > 0.3: longest match",
        {},
        [node("a", queue=[Q] * 10), node("b")],
        request(1000, local={"a": 500}),
        "a",
    ),
    (
        "cache-aware",
        "imbalanced (70 vs 0 requests): shortest queue",
        {},
        [node("a", queue=[Q] * 70), node("b")],
        request(1000, local={"a": 900}),
        "b",
    ),
    (
        "cache-aware",
        "match rate 0.2 <= 0.3: most KV room",
        {},
        [node("a", kv_room=10), node("b", kv_room=50)],
        request(1000, local={"a": 200}),
        "b",
    ),
    (
        "cache-aware",
        "balance_abs knob 5: imbalance triggers earlier",
        {"balance_abs": 5.0},
        [node("a", queue=[Q] * 10), node("b")],
        request(1000, local={"a": 900}),
        "b",
    ),
    # dynamo: overlap_weight * (queued blocks + blocks - credit) + active blocks; host credit 0.75
    (
        "dynamo",
        "GPU overlap beats host overlap of the same length",
        {},
        [node("a"), node("b")],
        request(6400, local={"a": 3200, "b": 3200}, gpu={"a": 0, "b": 3200}),
        "b",
    ),
    (
        "dynamo",
        "active decode blocks outweigh the overlap",
        {},
        [node("a", kv_used=640_000), node("b")],
        request(6400, local={"a": 6400}),
        "b",
    ),
    (
        "dynamo",
        "host credit 1.0: host and GPU overlap tie, smaller id",
        {"host_credit": 1.0},
        [node("b"), node("a")],
        request(6400, local={"a": 3200, "b": 3200}, gpu={"a": 0, "b": 3200}),
        "a",
    ),
    # lmetric: (q + L - c) * l ; idle ties go to the smaller work left
    (
        "lmetric",
        "idle nodes: smaller work left (the cache)",
        {},
        [node("a"), node("b")],
        request(1000, local={"b": 800}),
        "b",
    ),
    (
        "lmetric",
        "product: 1 request with big work beats 2 with small",
        {},
        [node("a", queue=[uncached(100)]), node("b", queue=[uncached(10), uncached(10)])],
        request(1000, local={"b": 900}),
        "b",
    ),
    (
        "lmetric",
        "product: 1 request with small work beats 2 with big",
        {},
        [node("a", queue=[uncached(100)]), node("b", queue=[uncached(1000), uncached(1000)])],
        request(1000, local={"b": 900}),
        "a",
    ),
    # linear: (1 - lam) * load / max load + lam * miss
    (
        "linear",
        "lam 0.8 favours the hit despite the load",
        {},
        [node("a", queue=[Q] * 4), node("b")],
        request(1000, local={"a": 900}),
        "a",
    ),
    (
        "linear",
        "lam 0.1 favours the load",
        {"lam": 0.1},
        [node("a", queue=[Q] * 4), node("b")],
        request(1000, local={"a": 900}),
        "b",
    ),
]


@pytest.mark.parametrize(
    ("policy", "knobs", "nodes", "req", "expected"),
    [(c[0], *c[2:]) for c in CASES],
    ids=[f"{c[0]}: {c[1]}" for c in CASES],
)
def test_baseline_table(
    policy: str, knobs: dict[str, float], nodes: list[NodeState], req: RequestView, expected: str
) -> None:
    d = create_policy(policy, knobs).choose(req, nodes, CTX)
    assert d.node_id == expected, d.reason
    assert d.policy == policy


def test_round_robin_cycles_in_id_order_and_skips_missing_nodes() -> None:
    p = create_policy("round-robin")
    nodes = [node("c"), node("a"), node("b")]
    picks = [p.choose(request(10), nodes, CTX).node_id for _ in range(4)]
    assert picks == ["a", "b", "c", "a"]
    assert p.choose(request(10), [node("a"), node("c")], CTX).node_id == "c"
    assert p.choose(request(10), [node("a"), node("b")], CTX).node_id == "a"


@pytest.mark.parametrize(
    ("policy", "knobs"),
    [
        ("cache-aware", {"cache_threshold": 2.0}),
        ("linear", {"lam": -0.1}),
        ("dynamo", {"host_credit": 1.5}),
        ("smetric", {"hit_ratio": 1.2}),
        ("linear", {"lam": "x"}),
    ],  # type: ignore[dict-item]
)
def test_bad_knob_values_are_rejected(policy: str, knobs: dict[str, float]) -> None:
    from agentpool.router.policy import PolicyError

    with pytest.raises(PolicyError):
        create_policy(policy, knobs)
