"""``evolving``: table of predicted-TTFT choices, and the sub-agent spread against cache-aware."""

from __future__ import annotations

import dataclasses

import pytest
from router_policy_builders import MODEL, node, request, send, uncached

from agentpool.models import FetchModel, Work
from agentpool.router.policy import NodeState, PolicyContext, PolicyError, RequestView, create_policy
from agentpool.router.policy.evolving import predict

CTX = PolicyContext()
SLOW_FETCH = dataclasses.replace(CTX, fetch=FetchModel(base_s=0.0, per_token_s=1e-4, min_tokens=512))
NO_COPY = dataclasses.replace(CTX, kappa_s_per_token=0.0)
BUSY = [uncached(8192)] * 3  # about 1.27 s of queued prefill

CASES: list[tuple[str, list[NodeState], RequestView, PolicyContext, str]] = [
    ("idle nodes: the local prefix wins", [node("a"), node("b")], request(8000, local={"b": 6000}), CTX, "b"),
    (
        "queue on the prefix holder, cheap fetch: go elsewhere and fetch",
        [node("a", queue=BUSY), node("b")],
        request(24_000, local={"a": 20_000}),
        CTX,
        "b",
    ),
    (
        "same, but the fetch costs 2 s: stay with the prefix",
        [node("a", queue=BUSY), node("b")],
        request(24_000, local={"a": 20_000}),
        SLOW_FETCH,
        "a",
    ),
    (
        "requests sent but not reported count as queue",
        [node("a", unreported=BUSY), node("b")],
        request(24_000, local={"a": 20_000}),
        CTX,
        "b",
    ),
    (
        "a stale report (6 s) is ignored: the prefix holder looks idle",
        [node("a", queue=BUSY, remaining=1.0, age=6.0), node("b")],
        request(24_000, local={"a": 20_000}),
        CTX,
        "a",
    ),
    (
        "remaining time of the running batch counts",
        [node("a", remaining=2.0), node("b", remaining=0.1)],
        request(4000),
        CTX,
        "b",
    ),
    (
        "exact tie goes to the longest local prefix, not the smaller id",
        [node("a"), node("z", remaining=CTX.fetch.tau(1000))],
        request(2000, local={"z": 1000}),
        NO_COPY,
        "z",
    ),
]


@pytest.mark.parametrize(
    ("nodes", "req", "ctx", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_evolving_table(nodes: list[NodeState], req: RequestView, ctx: PolicyContext, expected: str) -> None:
    assert create_policy("evolving").choose(req, nodes, ctx).node_id == expected


def test_prediction_matches_algorithm_e3_by_hand() -> None:
    n = node("b", queue=[uncached(4096)], remaining=0.05)
    req = request(24_000, local={"a": 20_000}, out=7)
    p = predict(req, n, CTX)
    wait = 0.05 + MODEL.prefill_request_time(Work(t_uc=4096))
    service = MODEL.prefill_request_time(Work(t_uc=4000, t_c=20_000))
    tau = 0.45e-3 + 20_000e-6
    assert p.fetch_tokens == 20_000 and p.cached_tokens == 20_000
    assert p.wait_s == pytest.approx(wait)
    assert p.service_s == pytest.approx(service)
    assert p.exposed_fetch_s == pytest.approx(max(0.0, tau - wait))
    assert p.copy_s == pytest.approx(1e-7 * 20_000)
    assert p.ttft_s == pytest.approx(wait + service + max(0.0, tau - wait) + 2e-3)


def test_fetch_hidden_by_the_wait_and_no_fetch_below_min_tokens() -> None:
    waiting = node("b", remaining=0.5)
    p = predict(request(24_000, local={"a": 20_000}), waiting, CTX)
    assert p.exposed_fetch_s == 0.0 and p.fetch_tokens == 20_000
    small = predict(request(2000, local={"a": 400}), node("b"), CTX)
    assert small.fetch_tokens == 0 and small.cached_tokens == 0


def route_sub_agents(policy_name: str, count: int) -> list[str]:
    """Sub-agents of one conversation share a 32K-token prefix that node a holds."""
    policy = create_policy(policy_name)
    nodes = {nid: node(nid) for nid in ("a", "b", "c", "d")}
    chosen = []
    for i in range(count):
        req = request(34_000, local={"a": 32_000}, turn=1, rid=f"sub{i}")
        d = policy.choose(req, list(nodes.values()), CTX)
        chosen.append(d.node_id)
        nodes[d.node_id] = send(
            nodes[d.node_id], Work(t_uc=34_000.0 - d.cached_tokens, t_c=float(d.cached_tokens))
        )
    return chosen


def test_cache_aware_piles_sub_agents_while_evolving_spreads_them() -> None:
    piled = route_sub_agents("cache-aware", 8)
    spread = route_sub_agents("evolving", 8)
    assert set(piled) == {"a"}
    assert spread[0] == "a"
    assert set(spread) == {"a", "b", "c", "d"}


def test_duplicate_candidate_ids_are_rejected() -> None:
    policy = create_policy("evolving")
    with pytest.raises(PolicyError, match="distinct"):
        policy.choose(request(8000), [node("a"), node("a", queue=BUSY)], CTX)
