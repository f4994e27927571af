"""The policy contract: queue aggregates equal Eq. 3 sums, freshness, candidate filter, registry."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from router_policy_builders import MODEL, node, request, uncached

from agentpool.models import (
    DEFAULT_FETCH_MODEL,
    PAPER_LITERAL_FETCH_MODEL,
    FetchModel,
    LinearAttentionCost,
    Work,
)
from agentpool.router.policy import (
    CachedPrefix,
    NoCandidateError,
    PolicyContext,
    PolicyError,
    QueuedPrefill,
    RequestView,
    Role,
    create_policy,
    effective_queue,
    effective_remaining_s,
    policy_names,
    prefill_candidates,
)

works = st.lists(st.builds(Work, t_uc=st.floats(0, 1e5), t_c=st.floats(0, 1e5)), min_size=0, max_size=20)


@settings(max_examples=50, deadline=None)
@given(works)
def test_queue_aggregate_equals_sum_of_eq3(ws: list[Work]) -> None:
    q = QueuedPrefill.of(ws)
    expected = sum(MODEL.prefill_request_time(w) for w in ws)
    assert math.isclose(q.service_time(MODEL), expected, rel_tol=1e-9, abs_tol=1e-12)
    cost = LinearAttentionCost(c_linear=2e-5, c_attn=3e-10)
    expected_cost = sum(cost.cost(w.t_uc, w.t_uc + w.t_c) for w in ws)
    assert math.isclose(q.linear_attention_cost(cost), expected_cost, rel_tol=1e-9, abs_tol=1e-12)
    assert q.requests == len(ws)


@pytest.mark.parametrize(
    ("model", "tokens", "expected"),
    [
        (DEFAULT_FETCH_MODEL, 0, 0.0),
        (DEFAULT_FETCH_MODEL, 511, 0.0),
        (DEFAULT_FETCH_MODEL, 512, 0.45e-3 + 512e-6),
        (DEFAULT_FETCH_MODEL, 96_000, 0.45e-3 + 0.096),
        (PAPER_LITERAL_FETCH_MODEL, 96_000, 0.45 + 0.096),
        (FetchModel(base_s=0.0, per_token_s=2e-6, min_tokens=0), 10, 2e-5),
    ],
)
def test_fetch_time(model: FetchModel, tokens: int, expected: float) -> None:
    assert model.tau(tokens) == pytest.approx(expected)


def test_fetch_model_rejects_negative() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        FetchModel(base_s=-1.0)
    with pytest.raises(ValueError, match="non-negative"):
        DEFAULT_FETCH_MODEL.tau(-1)


def test_stale_report_counts_only_unreported_work() -> None:
    ctx = PolicyContext(max_report_age_s=5.0)
    fresh = node("a", queue=[uncached(1000)], unreported=[uncached(10)], remaining=0.3, age=4.9)
    stale = node("b", queue=[uncached(1000)], unreported=[uncached(10)], remaining=0.3, age=5.1)
    never = node("c", queue=[uncached(1000)], unreported=[uncached(10)], remaining=0.3, age=None)
    assert effective_queue(fresh, ctx).t_uc == 1010
    assert effective_remaining_s(fresh, ctx) == 0.3
    for n in (stale, never):
        assert effective_queue(n, ctx).t_uc == 10
        assert effective_remaining_s(n, ctx) == 0.0


def test_candidates_filter_role_drain_accepting_and_queue_limit() -> None:
    ctx = PolicyContext(max_queue_per_node=2)
    nodes = [
        node("p", role=Role.PREFILL),
        node("b", role=Role.BOTH),
        node("d", role=Role.DECODE),
        node("drain", draining=True),
        node("closed", accepting=False),
        node("full", queue=[uncached(1)], unreported=[uncached(1)]),
        node("stale-full", queue=[uncached(1), uncached(1)], age=9.0),
    ]
    assert [n.node_id for n in prefill_candidates(nodes, ctx)] == ["p", "b", "stale-full"]


def test_views_reject_bad_input() -> None:
    with pytest.raises(PolicyError):
        CachedPrefix(gpu=5, total=4)
    with pytest.raises(PolicyError):
        RequestView(request_id="r", prompt_tokens=10, turn=0)
    with pytest.raises(PolicyError):
        RequestView(request_id="r", prompt_tokens=10, cluster_prefix=11)
    with pytest.raises(PolicyError):
        PolicyContext(page_size=0)


def test_registry_creates_every_policy_and_rejects_bad_names_and_knobs() -> None:
    for name in policy_names():
        p = create_policy(name)
        assert p.name == name
        d = p.choose(request(100), [node("a"), node("b")], PolicyContext())
        assert d.node_id in {"a", "b"} and d.policy == name
        with pytest.raises(NoCandidateError):
            p.choose(request(100), [], PolicyContext())
    with pytest.raises(PolicyError, match="unknown routing policy"):
        create_policy("nope")
    with pytest.raises(PolicyError, match="unknown knobs"):
        create_policy("evolving", {"bogus": 1.0})


@settings(max_examples=50, deadline=None)
@given(st.floats(0, 1e5), st.floats(0, 1e5))
def test_eq3_of_sums_for_one_request_equals_the_models_eq3(t_uc: float, t_c: float) -> None:
    from agentpool.models import attention_pairs
    from agentpool.router.policy.contract import eq3_of_sums

    expected = MODEL.prefill_request_time(Work(t_uc=t_uc, t_c=t_c))
    got = eq3_of_sums(MODEL, t_uc, t_c, attention_pairs(t_uc, t_c))
    assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12)
