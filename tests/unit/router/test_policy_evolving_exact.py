"""``evolving`` computes the request's part once per (local prefix, model): bit-identical to Eq. 7 per node.

The reference below is Eq. 7 evaluated from scratch for each node (the policy's previous loop);
the policy must give the same floats, the same pick (lowest score, then longest local prefix,
then smallest id) and the same reason, for shared and per-node models, fresh, stale and missing
reports, and exact ties.
"""

from __future__ import annotations

import dataclasses
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from router_policy_builders import MODEL, node, request

from agentpool.models import FetchModel, NodeModel, PrefillModel, attention_pairs, copy_price
from agentpool.router.policy import (
    EMPTY_QUEUE,
    CachedPrefix,
    NodeState,
    PolicyContext,
    QueuedPrefill,
    RequestView,
    create_policy,
)
from agentpool.router.policy.contract import effective_service_s, eq3_of_sums, pick_min
from agentpool.router.policy.evolving import predict


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def reference_wait(n: NodeState, ctx: PolicyContext) -> float:
    m = n.model
    if n.report_age_s is not None and n.report_age_s <= ctx.max_report_age_s:
        return n.remaining_batch_s + n.queue.service_time(m) + n.unreported.service_time(m)
    return n.unreported.service_time(m)


def reference_scores(req: RequestView, nodes: list[NodeState], ctx: PolicyContext) -> dict[str, float]:
    scores = {}
    for n in nodes:
        local = req.prefix_on(n.node_id).total
        missing = max(0, max(req.cluster_prefix, local) - local)
        x = missing if ctx.fetch.fetches(missing) else 0
        t_c = local + x
        t_uc = req.prompt_tokens - t_c
        wait = reference_wait(n, ctx)
        service = eq3_of_sums(n.model, t_uc, t_c, attention_pairs(t_uc, t_c))
        exposed = max(0.0, ctx.fetch.tau(x) - wait)
        scores[n.node_id] = wait + service + exposed + copy_price(ctx.kappa_s_per_token, x)
    return scores


OTHER_MODEL = dataclasses.replace(
    MODEL, prefill=PrefillModel(c0=0.02, c1=4e-5, c2=3e-10, c3=2e-7), f_restore=0.5
)
EQUAL_COPY = dataclasses.replace(MODEL)  # equal to MODEL, another object

# few distinct values, so that exact ties and shared (local, model) pairs are common
queues = st.one_of(
    st.just(EMPTY_QUEUE),
    st.builds(
        QueuedPrefill,
        st.integers(0, 3),
        st.sampled_from([0.0, 512.0, 4096.5, 1e5]),
        st.sampled_from([0.0, 1024.0, 3e4]),
        st.sampled_from([0.0, 1e6, 2.5e9]),
    ),
)
node_parts = st.tuples(
    st.sampled_from([0.0, 0.0, 0.125, 0.3, 1.7]),  # remaining batch
    queues,
    queues,
    st.sampled_from([None, 0.0, 0.1, 5.0, 6.0]),  # report age (5 s is the limit)
    st.sampled_from([MODEL, MODEL, OTHER_MODEL, EQUAL_COPY]),
    st.sampled_from([0, 0, 512, 1024, 20_000]),  # local prefix
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[RequestView, list[NodeState], PolicyContext]:
    parts = draw(st.lists(node_parts, min_size=1, max_size=12))
    shared_model = draw(st.booleans())
    nodes = []
    local = {}
    for i, (remaining, queue, unreported, age, model, held) in enumerate(parts):
        nid = f"n{(i * 7) % 13}"  # ids not in candidate order
        nodes.append(
            NodeState(
                node_id=nid,
                role=node("x").role,
                model=MODEL if shared_model else model,
                remaining_batch_s=remaining,
                queue=queue,
                unreported=unreported,
                report_age_s=age,
            )
        )
        if held:
            local[nid] = CachedPrefix(gpu=held // 2, total=held)
    prompt = draw(st.sampled_from([20_001, 24_000, 40_000]))
    cluster = max([draw(st.sampled_from([0, 600, 20_000])), *(p.total for p in local.values())])
    req = RequestView(request_id="r", prompt_tokens=prompt, local_prefix=local, cluster_prefix=cluster)
    fetch = draw(
        st.sampled_from(
            [FetchModel(), FetchModel(base_s=0.0, per_token_s=1e-4, min_tokens=512), FetchModel(min_tokens=0)]
        )
    )
    ctx = PolicyContext(fetch=fetch, kappa_s_per_token=draw(st.sampled_from([0.0, 1e-7])))
    return req, nodes, ctx


@settings(max_examples=400, deadline=None)
@given(cases())
def test_scores_equal_eq7_per_node(
    case: tuple[RequestView, list[NodeState], PolicyContext],
) -> None:
    req, nodes, ctx = case
    expected = reference_scores(req, nodes, ctx)
    longest = {nid: -float(req.prefix_on(nid).total) for nid in expected}
    d = create_policy("evolving").choose(req, nodes, ctx)
    assert {k: bits(v) for k, v in d.scores.items()} == {k: bits(v) for k, v in expected.items()}
    assert list(d.scores) == list(expected)
    assert d.node_id == pick_min(expected, longest)
    chosen = next(n for n in nodes if n.node_id == d.node_id)
    p = predict(req, chosen, ctx)
    assert bits(p.ttft_s) == bits(expected[d.node_id])
    assert bits(p.wait_s) == bits(reference_wait(chosen, ctx))
    assert (d.cached_tokens, d.fetch_tokens) == (p.cached_tokens, p.fetch_tokens)
    assert d.reason.startswith(f"predicted ttft {p.ttft_s:.4f}s = wait {p.wait_s:.4f} + ")
    assert [bits(effective_service_s(n, ctx)) for n in nodes] == [bits(reference_wait(n, ctx)) for n in nodes]


def test_exact_tie_goes_to_the_longest_prefix_then_the_smallest_id() -> None:
    nodes = [node("b"), node("c"), node("a"), node("d")]
    req = request(8000, local={"c": 600, "d": 600})  # below the fetch minimum: a tie on the score
    ctx = PolicyContext(fetch=FetchModel(min_tokens=10_000), kappa_s_per_token=0.0)
    scores = reference_scores(req, nodes, ctx)
    assert scores["c"] == scores["d"] and scores["a"] == scores["b"]
    assert create_policy("evolving").choose(req, nodes, ctx).node_id == (
        "c" if scores["c"] <= scores["a"] else "a"
    )


def test_per_node_models_are_used() -> None:
    slow = NodeModel(prefill=PrefillModel(c0=1.0, c1=1e-3, c2=0.0, c3=0.0), decode=MODEL.decode)
    nodes = [dataclasses.replace(node("a"), model=slow), node("b")]
    d = create_policy("evolving").choose(request(4000), nodes, PolicyContext())
    assert d.node_id == "b" and d.scores["a"] > d.scores["b"]
