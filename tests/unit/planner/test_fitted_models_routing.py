"""The router routes with each node's own fitted model once the planner pushed one (Eq. 7 with
per-node Eq. 3: own coefficients, own ``t_bar_n`` and ``f_n``); the configured model is the prior."""

from __future__ import annotations

import dataclasses

import pytest

from agentpool.models import DecodeModel, NodeModel, PrefillModel
from agentpool.router.config import NodeConfig, NodeModelConfig
from agentpool.router.nodes import NodeTable, StaleFitsError, node_model_of
from agentpool.router.policy import CachedPrefix, PolicyContext, RequestView, create_policy
from agentpool.wire.engine import LoadReport, QueuedItem

PRIOR = NodeModelConfig()
CTX = PolicyContext()
FAST = NodeModel(prefill=PrefillModel(0.01, 5e-5, 1e-10, 1e-7), decode=DecodeModel(0.01, 0.005, 1e-4))
SLOW = dataclasses.replace(FAST, prefill=PrefillModel(0.01, 2e-4, 4e-10, 1e-7))  # 4x per token


def table(*ids: str) -> NodeTable:
    t = NodeTable()
    t.configure([NodeConfig(id=i, url=f"http://{i}:8080", role="prefill") for i in ids], PRIOR)
    return t


def choose(t: NodeTable, request: RequestView) -> str:
    return create_policy("evolving").choose(request, t.snapshot(0.0), CTX).node_id


def queued(t: NodeTable, node: str, tokens: int) -> None:
    t.apply_report(
        LoadReport(node_id=node, role="prefill", queue=[QueuedItem(request_id="q", t_uc=tokens)]), 0.0
    )


# (what the planner fitted for a and b, queued tokens on a and b, request (prompt, cached on b),
#  node the router picks): with the prior both nodes are alike, so only the fits tell them apart.
CASES = [
    ("prior only: equal nodes, equal queues, tie to the smaller id", None, (0, 0), (8000, 0), "a"),
    ("a fitted 4x slower per token: its queue takes longer", (SLOW, FAST), (4000, 4000), (8000, 0), "b"),
    ("b fitted 4x slower: the same queues send it to a", (FAST, SLOW), (4000, 4000), (8000, 0), "a"),
    (
        "b restores from host (f_n = 1, c3 large): its cached prefix costs; a recomputes cheaper",
        (FAST, dataclasses.replace(FAST, prefill=PrefillModel(0.01, 5e-5, 1e-10, 1e-3), f_restore=1.0)),
        (0, 0),
        (8000, 6000),
        "a",
    ),
    (
        "same coefficients, but b's t_bar is small (many small iterations): fixed cost per token grows",
        (FAST, dataclasses.replace(FAST, prefill=PrefillModel(1.0, 5e-5, 1e-10, 1e-7), t_bar=64.0)),
        (2000, 0),
        (8000, 0),
        "a",
    ),
]


@pytest.mark.parametrize("why,fits,queues,req,expected", CASES, ids=[c[0] for c in CASES])
def test_the_router_uses_each_nodes_own_fitted_model(
    why: str,
    fits: tuple[NodeModel, NodeModel] | None,
    queues: tuple[int, int],
    req: tuple[int, int],
    expected: str,
) -> None:
    t = table("a", "b")
    if fits is not None:
        assert t.apply_fits(1, {"a": fits[0], "b": fits[1]}) == ["a", "b"]
    for node, tokens in zip("ab", queues, strict=True):
        if tokens:
            queued(t, node, tokens)
    prompt, cached_b = req
    request = RequestView(
        "r", prompt_tokens=prompt, local_prefix={"b": CachedPrefix(0, cached_b)} if cached_b else {}
    )
    assert choose(t, request) == expected, why


def test_fits_are_versioned_survive_a_config_reload_and_leave_other_nodes_on_the_prior() -> None:
    t = table("a", "b")
    prior = node_model_of(PRIOR)
    assert t.apply_fits(5, {"a": SLOW, "ghost": FAST}) == ["a"]  # ghost: not configured
    assert t.get("a").model == SLOW and t.get("b").model == prior
    assert t.fitted("a") and not t.fitted("b")
    with pytest.raises(StaleFitsError):
        t.apply_fits(5, {"a": FAST})  # not newer
    with pytest.raises(StaleFitsError):
        t.apply_fits(4, {"a": FAST})
    assert t.get("a").model == SLOW and t.fits_version == 5
    # the config file changes (a new prior, a new node): fitted nodes keep their fit
    new_prior = NodeModelConfig(c1=1e-4)
    t.configure(
        [NodeConfig(id=i, url=f"http://{i}:8080", role="prefill") for i in ("a", "b", "ghost")], new_prior
    )
    assert t.get("a").model == SLOW and t.get("b").model == node_model_of(new_prior)
    assert t.get("ghost").model == FAST  # its fit was waiting for it
    assert t.apply_fits(6, {"b": FAST}) == ["b"]  # a newer set replaces the whole set
    assert t.get("a").model == node_model_of(new_prior) and t.get("b").model == FAST
