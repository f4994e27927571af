"""The router's node table (reports + sent-but-unreported work, drain, cool-down) and its config."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from agentpool.models import Work
from agentpool.router.config import (
    ConfigError,
    ConfigFile,
    NodeConfig,
    NodeModelConfig,
    RouterConfig,
    parse_config,
)
from agentpool.router.nodes import STATE_FIELDS, NodeTable
from agentpool.router.policy import NodeState, Role
from agentpool.wire.engine import LoadReport, QueuedItem


def table(*roles: Role) -> NodeTable:
    t = NodeTable(max_report_age_s=5.0, down_cooldown_s=2.0)
    t.configure(
        [NodeConfig(id=f"n{i}", url=f"http://h{i}", role=r) for i, r in enumerate(roles)], NodeModelConfig()
    )
    return t


def test_fresh_report_plus_dispatches_after_its_sequence() -> None:
    t = table(Role.PREFILL)
    for i in range(3):
        t.dispatch_prefill("n0", f"r{i}", Work(t_uc=100.0 * (i + 1)), 1000)
    report = LoadReport(
        node_id="n0",
        role=Role.PREFILL,
        last_dispatch_seq=1,
        remaining_batch_s=0.2,
        queue=[QueuedItem(request_id="r1", t_uc=200)],
        kv_room_tokens=5000,
    )
    t.apply_report(report, now=10.0)
    (s,) = t.snapshot(now=12.0)
    assert s.report_age_s == 2.0 and s.remaining_batch_s == 0.2
    assert s.queue.requests == 1 and s.queue.t_uc == 200
    assert s.unreported.requests == 1 and s.unreported.t_uc == 300  # r2 was sent after the report
    (stale,) = t.snapshot(now=16.0)
    assert stale.unreported.requests == 3 and stale.remaining_batch_s == 0.0  # router's own knowledge only
    t.finish_prefill("n0", "r2")
    (s,) = t.snapshot(now=12.0)
    assert s.unreported.requests == 0


def test_decode_bindings_count_until_reported() -> None:
    t = table(Role.DECODE)
    t.configure(
        [NodeConfig(id="n0", url="http://h", role=Role.DECODE, kvCapacityTokens=10_000)], NodeModelConfig()
    )
    t.bind_decode("n0", "r0", 3000)
    (s,) = t.snapshot(now=0.0)
    assert s.running_decode == 1 and s.kv_room_tokens == 7000
    t.apply_report(
        LoadReport(
            node_id="n0", role=Role.DECODE, last_dispatch_seq=-1, running_decode=4, kv_room_tokens=8000
        ),
        now=1.0,
    )
    (s,) = t.snapshot(now=1.0)
    assert s.running_decode == 5 and s.kv_room_tokens == 5000
    t.finish_decode("n0", "r0")
    (s,) = t.snapshot(now=1.0)
    assert s.running_decode == 4


def test_decode_waiting_tokens_reach_smetric_from_a_fresh_report_only() -> None:
    # a colocated engine's prefilled requests waiting for decode room: SMetric counts them against
    # the KV room (NodeState.decode_waiting_tokens); a stale report says nothing
    t = table(Role.BOTH)
    report = LoadReport(node_id="n0", role=Role.BOTH, kv_room_tokens=4000, decode_waiting_tokens=3500)
    t.apply_report(report, now=10.0)
    (s,) = t.snapshot(now=11.0)
    assert s.decode_waiting_tokens == 3500 and s.kv_room_tokens == 4000
    (stale,) = t.snapshot(now=16.0)
    assert stale.decode_waiting_tokens == 0


def test_role_change_drains_until_the_engine_reports_the_new_role() -> None:
    t = table(Role.PREFILL, Role.PREFILL)
    switched = t.configure(
        [
            NodeConfig(id="n0", url="http://h0", role=Role.DECODE),
            NodeConfig(id="n1", url="http://h1", role=Role.PREFILL),
        ],
        NodeModelConfig(),
    )
    assert switched == ["n0"]
    assert [s.draining for s in t.snapshot(0.0)] == [True, False]
    t.apply_report(LoadReport(node_id="n0", role=Role.PREFILL), now=0.0)
    assert t.snapshot(0.0)[0].draining
    t.apply_report(LoadReport(node_id="n0", role=Role.DECODE), now=0.0)
    assert not t.snapshot(0.0)[0].draining


def test_desired_role_in_a_report_starts_the_drain() -> None:
    t = table(Role.PREFILL)
    t.apply_report(LoadReport(node_id="n0", role=Role.PREFILL, desired_role=Role.DECODE), now=0.0)
    (s,) = t.snapshot(0.0)
    assert s.role is Role.DECODE and s.draining
    t.apply_report(LoadReport(node_id="n0", role=Role.DECODE), now=0.5)
    (s,) = t.snapshot(0.5)
    assert s.role is Role.DECODE and not s.draining


def test_a_failed_node_cools_down_then_comes_back() -> None:
    t = table(Role.BOTH)
    t.mark_down("n0", now=10.0)
    assert not t.snapshot(11.0)[0].accepting
    assert t.snapshot(12.5)[0].accepting


def test_nodes_removed_from_config_disappear() -> None:
    t = table(Role.BOTH, Role.BOTH)
    t.configure([NodeConfig(id="n1", url="http://h1")], NodeModelConfig())
    assert [s.node_id for s in t.snapshot(0.0)] == ["n1"]


def test_config_parsing_and_errors(tmp_path: Path) -> None:
    cfg = parse_config(
        "policy: smetric\nknobs: {slack: 1.5}\nslo: {ttftBase: 3}\nnodes: [{id: a, url: 'http://a'}]"
    )
    assert cfg.policy_context().slo.base == 3.0 and cfg.knobs == {"slack": 1.5}
    for bad, match in [
        ("policy: nope", "unknown routing policy"),
        ("knobs: {bogus: 1}", "unknown knobs"),
        ("pageSize: 0", "pageSize"),
        ("nodes: [{id: a, url: 'http://a'}, {id: a, url: 'http://b'}]", "duplicate node"),
        ("nodes: [{id: a, url: 'ftp://a'}]", "url"),
        ("surprise: 1", "surprise"),
        ("{not yaml", "not valid yaml"),
    ]:
        with pytest.raises(ConfigError, match=match):
            parse_config(bad)


@pytest.mark.parametrize(
    ("text", "cap", "context"),
    [
        ("{}", 1 << 21, None),  # the default cap, no context to announce
        ("contextLength: 131072", 131_072, 131_072),
        ("{contextLength: 131072, limits: {maxPromptTokens: 4000}}", 4000, 131_072),  # the lower one caps
        ("{contextLength: 4000, limits: {maxPromptTokens: 131072}}", 4000, 4000),
    ],
)
def test_the_prompt_cap_is_the_lower_of_the_limit_and_the_context(
    text: str, cap: int, context: int | None
) -> None:
    cfg = parse_config(text)
    assert (cfg.prompt_cap, cfg.context_length) == (cap, context)


def test_a_context_length_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="contextLength"):
        parse_config("contextLength: 0")


def test_config_file_notices_changes(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("policy: evolving\n")
    f = ConfigFile(path)
    assert f.load().policy == "evolving"
    assert not f.changed()
    path.write_text("policy: round-robin\n")
    assert f.changed()
    assert f.load().policy == "round-robin"
    assert RouterConfig().disaggregated is False


def test_config_from_the_pool_spec_settings_round_trips() -> None:
    from agentpool.api.settings import FetchSettings, RouterSettings
    from agentpool.models import TtftSlo
    from agentpool.router.config import config_from_settings, render_config

    settings = RouterSettings(
        policy="smetric",
        knobs={"slack": 1.5, "hit_ratio": 0.7},
        fetch=FetchSettings(base_s=0.001, per_token_s=2e-6, min_tokens=256),
        copy_price_s_per_token=3e-7,
        state_max_age_s=4.0,
    )
    nodes = [NodeConfig(id="p0", url="http://p0:8080", role=Role.PREFILL)]
    cfg = config_from_settings(
        settings, TtftSlo(base=3.0, per_token=2e-4), tpot_s=0.04, model="m", nodes=nodes
    )
    again = parse_config(render_config(cfg), "json")
    assert again == cfg
    ctx = again.policy_context()
    assert ctx.fetch.tau(1000) == pytest.approx(0.001 + 2e-3)
    assert (ctx.kappa_s_per_token, ctx.max_report_age_s, ctx.slo.base, ctx.tpot_slo_s) == (
        3e-7,
        4.0,
        3.0,
        0.04,
    )
    assert again.nodes[0].role is Role.PREFILL and again.knobs == {"slack": 1.5, "hit_ratio": 0.7}


def test_the_unreported_queue_follows_every_dispatch_and_finish() -> None:
    """The aggregate is kept per node as requests come and go: each change must show."""
    t = table(Role.PREFILL)
    works = [Work(t_uc=100.0 * (i + 1), t_c=10.0 * i) for i in range(4)]
    for i, w in enumerate(works):
        t.dispatch_prefill("n0", f"r{i}", w, 1000)
        (state,) = t.snapshot(0.0)
        assert state.unreported.requests == i + 1
        assert state.unreported.t_uc == sum(x.t_uc for x in works[: i + 1])
    assert t.snapshot(0.5)[0].unreported is t.snapshot(0.6)[0].unreported  # unchanged: the same object
    t.finish_prefill("n0", "r1")
    t.finish_prefill("n0", "unknown")
    (state,) = t.snapshot(1.0)
    assert (state.unreported.requests, state.unreported.t_uc) == (3, 100.0 + 300.0 + 400.0)
    t.apply_report(LoadReport(node_id="n0", role=Role.PREFILL, last_dispatch_seq=2), 1.0)
    (state,) = t.snapshot(1.0)  # only r3 (sequence 3) is after the report
    assert (state.unreported.requests, state.unreported.t_uc, state.unreported.t_c) == (1, 400.0, 30.0)
    for rid in ("r0", "r2", "r3"):
        t.finish_prefill("n0", rid)
    assert t.snapshot(2.0)[0].unreported.requests == 0


def test_a_switch_the_router_saw_no_desired_role_for_is_followed_from_the_served_role() -> None:
    """An idle engine drains at once: its switch can complete between two load reports, so no report
    ever carries the desired role; or the desired role goes back before the engine switched. The
    router follows the role the engine reports serving (before: it kept the configured role for good
    and sent that node the other phase's work, or no work at all)."""
    t = table(Role.PREFILL, Role.DECODE)
    t.apply_report(LoadReport(node_id="n1", role=Role.PREFILL), now=1.0)  # switched D -> P unseen
    assert [(s.role, s.draining) for s in t.snapshot(now=1.0)] == [(Role.PREFILL, False)] * 2
    t.apply_report(LoadReport(node_id="n0", role=Role.PREFILL, desired_role=Role.DECODE), now=2.0)
    n0, _ = t.snapshot(now=2.0)
    assert (n0.role, n0.draining) == (Role.DECODE, True)
    t.apply_report(LoadReport(node_id="n0", role=Role.PREFILL), now=3.0)  # the desired role went back
    n0, _ = t.snapshot(now=3.0)
    assert (n0.role, n0.draining) == (Role.PREFILL, False)


def test_a_configured_switch_waits_for_the_engine_to_hear_of_it() -> None:
    """A role changed in the router's config: reports of the old role without a desired one are news
    from before the engine heard of it, not a reason to go back."""
    t = table(Role.PREFILL)
    t.configure([NodeConfig(id="n0", url="http://h0", role=Role.DECODE)], NodeModelConfig())
    t.apply_report(LoadReport(node_id="n0", role=Role.PREFILL), now=1.0)
    assert [(s.role, s.draining) for s in t.snapshot(now=1.0)] == [(Role.DECODE, True)]
    t.apply_report(LoadReport(node_id="n0", role=Role.PREFILL, desired_role=Role.DECODE), now=2.0)
    t.apply_report(LoadReport(node_id="n0", role=Role.DECODE), now=3.0)
    assert [(s.role, s.draining) for s in t.snapshot(now=3.0)] == [(Role.DECODE, False)]
    t.apply_report(LoadReport(node_id="n0", role=Role.PREFILL), now=4.0)  # and later switches back
    assert [(s.role, s.draining) for s in t.snapshot(now=4.0)] == [(Role.PREFILL, False)]


def test_the_snapshot_passes_node_state_fields_in_their_order() -> None:
    """``NodeTable._state`` builds ``NodeState`` positionally (per node for every request)."""
    assert tuple(f.name for f in fields(NodeState)) == STATE_FIELDS
    t = table(Role.BOTH)
    t.bind_decode("n0", "r0", 700)
    t.mark_down("n0", 10.0)
    (state,) = t.snapshot(0.0)
    assert (state.node_id, state.running_decode, state.kv_used_tokens, state.accepting) == (
        "n0",
        1,
        700,
        False,
    )
    assert (state.report_age_s, state.decode_waiting_tokens, state.draining) == (None, 0, False)
