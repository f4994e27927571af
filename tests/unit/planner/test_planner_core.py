from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from planner_scenarios import (
    NODE,
    OSWORLD,
    PUTNAM,
    best_prefill_count,
    nodes,
    noisy_slices,
    oracle_throughput,
)

from agentpool.models import DecodeModel, NodeModel, PrefillModel, Work, WorkSlice
from agentpool.planner.core import (
    LastSwitch,
    Outcome,
    PlannerInput,
    PlannerNode,
    PlannerPolicy,
    Role,
    initial_roles,
    plan,
)
from agentpool.planner.throughput import NodeArrays, SliceArrays

POLICY = PlannerPolicy()


def test_scenarios_have_the_documented_best_splits() -> None:
    # Guards the premises of the burst/shift tests below.
    assert best_prefill_count([WorkSlice(*PUTNAM)]) == 2
    assert best_prefill_count([WorkSlice(*OSWORLD)]) == 6


def test_sustained_shift_to_prefill_heavy_switches_to_the_split_that_maximizes_theta() -> None:
    rng = np.random.default_rng(7)
    slices = noisy_slices(OSWORLD, 10, 0.05, rng)
    d = plan(PlannerInput(nodes=nodes(prefill=2), slices=tuple(slices)), POLICY)
    assert d.outcome is Outcome.SWITCH
    assert d.chosen is not None
    assert d.chosen.prefill_count == best_prefill_count(slices) == 6
    assert d.prefill == ("n0", "n1", "n2", "n3", "n4", "n5")
    assert d.to_prefill == ("n2", "n3", "n4", "n5") and d.to_decode == ()
    assert d.chosen.mean_gain > 2 * d.chosen.std_error


def test_short_prefill_burst_does_not_switch() -> None:
    # §3.2: several sub-agents start together; for one slice the work looks prefill-heavy.
    rng = np.random.default_rng(11)
    slices = noisy_slices(PUTNAM, 9, 0.05, rng)
    burst = WorkSlice(work=OSWORLD[0], decode_occupancy=PUTNAM[1])
    # On the burst slice alone another split is better: a planner that followed it would switch.
    assert best_prefill_count([burst]) != 2
    slices.insert(4, burst)
    d = plan(PlannerInput(nodes=nodes(prefill=2), slices=tuple(slices)), POLICY)
    assert d.outcome is Outcome.HOLD, d.reason
    assert d.prefill == ("n0", "n1") and d.to_prefill == d.to_decode == ()
    assert d.best is not None and any(g > 0 for g in d.best.gains)  # the burst slice did gain


@pytest.mark.parametrize("workload,best", [(PUTNAM, 2), (OSWORLD, 6)])
def test_workload_whose_best_split_is_current_never_switches(workload: tuple, best: int) -> None:
    for seed in range(40):
        slices = noisy_slices(workload, 10, 0.08, np.random.default_rng(seed))
        d = plan(PlannerInput(nodes=nodes(prefill=best), slices=tuple(slices)), POLICY)
        assert d.outcome is Outcome.HOLD, (seed, d.reason)
        assert all(c.mean_gain < 0 for c in d.candidates), seed


def test_gains_are_eq6_against_an_independent_oracle() -> None:
    slices = noisy_slices(OSWORLD, 6, 0.1, np.random.default_rng(3))
    d = plan(PlannerInput(nodes=nodes(prefill=3), slices=tuple(slices)), POLICY)
    for c in d.candidates:
        expected = [oracle_throughput(c.prefill_count, 9, s) - oracle_throughput(3, 9, s) for s in slices]
        assert c.gains == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert c.mean_gain == pytest.approx(float(np.mean(expected)))
        assert c.std_error == pytest.approx(float(np.std(expected, ddof=1)) / np.sqrt(6))
        assert c.qualifies == (c.mean_gain > 2 * c.std_error)
    assert d.current_throughput == pytest.approx([oracle_throughput(3, 9, s) for s in slices])


def test_candidates_move_the_fewest_nodes_in_one_direction() -> None:
    d = plan(PlannerInput(nodes=nodes(prefill=4), slices=(WorkSlice(*PUTNAM),) * 3), POLICY)
    assert sorted(c.prefill_count for c in d.candidates) == [1, 2, 3, 5, 6, 7, 8]
    for c in d.candidates:
        assert c.moves == abs(c.prefill_count - 4)
        assert not (c.to_prefill and c.to_decode)
        assert set(c.to_prefill) <= {f"n{i}" for i in range(4, 9)}
        assert set(c.to_decode) <= {f"n{i}" for i in range(4)}


def test_min_nodes_per_phase_bound_the_candidates() -> None:
    policy = PlannerPolicy(min_prefill=3, min_decode=4)
    d = plan(PlannerInput(nodes=nodes(prefill=4), slices=(WorkSlice(*PUTNAM),) * 3), policy)
    assert sorted(c.prefill_count for c in d.candidates) == [3, 5]
    # Putnam wants 2P; the floor of 3 prefill nodes makes 3P the best allowed move.
    assert d.outcome is Outcome.SWITCH and len(d.prefill) == 3 and len(d.to_decode) == 1


def test_pinned_nodes_never_move_and_limit_the_candidates() -> None:
    pinned = frozenset({"n0", "n1", "n2", "n7"})
    d = plan(PlannerInput(nodes=nodes(prefill=4, pinned=pinned), slices=(WorkSlice(*PUTNAM),) * 3), POLICY)
    assert sorted(c.prefill_count for c in d.candidates) == [3, 5, 6, 7, 8]
    for c in d.candidates:
        assert not pinned & (set(c.to_prefill) | set(c.to_decode))
    assert d.outcome is Outcome.SWITCH and d.to_decode == ("n3",)


def test_draining_node_skips_the_window() -> None:
    slices = tuple(noisy_slices(OSWORLD, 10, 0.05, np.random.default_rng(1)))
    d = plan(PlannerInput(nodes=nodes(prefill=2, draining=frozenset({"n5"})), slices=slices), POLICY)
    assert d.outcome is Outcome.DRAINING and "n5" in d.reason
    assert d.candidates == () and d.to_prefill == () and d.prefill == ("n0", "n1")


def timed(slices: list[WorkSlice], start: float, width: float = 60.0) -> tuple[WorkSlice, ...]:
    """``slices`` laid end to end from ``start``, ``width`` seconds each."""
    return tuple(
        dataclasses.replace(x, start=start + i * width, end=start + (i + 1) * width)
        for i, x in enumerate(slices)
    )


# (window end, switch applied, switch completed, outcome, slices left out of the gain test): a
# 600 s window of 10 slices [600, 1200) on a sustained shift to OSWorld, cooldown 120 s.
COOLDOWN_TABLE = [
    # no switch yet: every slice counts
    (1200.0, None, None, Outcome.SWITCH, 0),
    # switched at the window start and done at once: the 2 slices within 120 s are left out
    (1200.0, 600.0, 600.0, Outcome.SWITCH, 2),
    # the drain took 30 s: the cooldown ends at 750, so slices starting before it go (3)
    (1200.0, 600.0, 630.0, Outcome.SWITCH, 3),
    # the drain took 520 s: at the window end only 80 s have passed since: the cooldown binds
    (1200.0, 600.0, 1120.0, Outcome.COOLDOWN, 0),
    # done 100 s before the end: 100 < 120 s
    (1200.0, 1050.0, 1100.0, Outcome.COOLDOWN, 0),
    # done 130 s before the end: 10 s of the last slice fall in the cooldown: < 2 slices left
    (1200.0, 1000.0, 1070.0, Outcome.TOO_FEW_SLICES, 10),
    # the last switch was long before the window: nothing is left out
    (1200.0, 100.0, 110.0, Outcome.SWITCH, 0),
]


@pytest.mark.parametrize("end,applied,settled,outcome,left_out", COOLDOWN_TABLE)
def test_cooldown_counts_from_the_completed_switch_and_its_slices_are_left_out(
    end: float, applied: float | None, settled: float | None, outcome: Outcome, left_out: int
) -> None:
    slices = timed(noisy_slices(OSWORLD, 10, 0.05, np.random.default_rng(1)), start=end - 600)
    last = None if applied is None else LastSwitch(applied, settled)
    d = plan(PlannerInput(nodes=nodes(prefill=2), slices=slices, now=end, last_switch=last), POLICY)
    assert d.outcome is outcome, d.reason
    assert d.excluded_slices == left_out
    if outcome is Outcome.SWITCH:
        assert d.best is not None and len(d.best.gains) == 10 - left_out


def test_the_transient_right_after_a_switch_does_not_decide_the_next_one() -> None:
    """The pool just moved to 3P for a shift to OSWorld work (best 6P). Right after the switch two
    slices see only short requests (those re-queued from the moved node finish first). Counted,
    they swamp the gain test and the planner holds at 3P for another window; left out (App. E.3:
    the planner skips the 120 s after each switch) the steady slices move it on to 6P."""
    rng = np.random.default_rng(4)
    transient = [WorkSlice(work=Work(t_uc=300, t_out=100), decode_occupancy=300) for _ in range(2)]
    slices = timed(transient + noisy_slices(OSWORLD, 8, 0.05, rng), start=600.0)
    three = nodes(prefill=3)
    counted = plan(PlannerInput(nodes=three, slices=slices), POLICY)  # what the old planner saw
    assert counted.outcome is Outcome.HOLD, counted.reason
    skipped = plan(
        PlannerInput(nodes=three, slices=slices, now=1200.0, last_switch=LastSwitch(600.0, 600.0)), POLICY
    )
    assert skipped.outcome is Outcome.SWITCH and skipped.excluded_slices == 2, skipped.reason
    assert len(skipped.prefill) == 6


def test_a_switch_needs_timed_slices_and_a_consistent_clock() -> None:
    slices = tuple(noisy_slices(OSWORLD, 4, 0.05, np.random.default_rng(1)))
    with pytest.raises(ValueError, match="without times"):
        PlannerInput(nodes=nodes(prefill=2), slices=slices, now=1000.0, last_switch=LastSwitch(10.0, 20.0))
    with pytest.raises(ValueError, match="after the evaluation"):
        PlannerInput(nodes=nodes(prefill=2), slices=(), now=5.0, last_switch=LastSwitch(10.0))
    with pytest.raises(ValueError, match="completes after"):
        LastSwitch(10.0, 5.0)


def test_too_few_slices_cannot_be_tested() -> None:
    d = plan(PlannerInput(nodes=nodes(prefill=2), slices=(WorkSlice(*OSWORLD),)), POLICY)
    assert d.outcome is Outcome.TOO_FEW_SLICES


def test_decisions_are_deterministic_and_independent_of_node_order() -> None:
    slices = tuple(noisy_slices(OSWORLD, 10, 0.1, np.random.default_rng(5)))
    ns = nodes(prefill=3)
    first = plan(PlannerInput(nodes=ns, slices=slices), POLICY)
    again = plan(PlannerInput(nodes=ns, slices=slices), POLICY)
    shuffled = plan(PlannerInput(nodes=tuple(reversed(ns)), slices=slices), POLICY)
    assert first == again == shuffled


def test_heterogeneous_nodes_move_the_strongest_prefill_node_first() -> None:
    fast = dataclasses.replace(NODE, prefill=PrefillModel(c0=0.0075, c1=2e-5, c2=1e-10, c3=5e-7))
    ns = list(nodes(prefill=2))
    ns[7] = PlannerNode(name="n7", model=fast, role=Role.DECODE)
    slices = tuple(noisy_slices(OSWORLD, 10, 0.05, np.random.default_rng(2)))
    d = plan(PlannerInput(nodes=tuple(ns), slices=slices), POLICY)
    one_more = next(c for c in d.candidates if c.prefill_count == 3)
    assert one_more.to_prefill == ("n7",)


def test_no_decode_occupancy_means_no_evidence() -> None:
    slices = tuple(WorkSlice(work=OSWORLD[0], decode_occupancy=0.0) for _ in range(5))
    d = plan(PlannerInput(nodes=nodes(prefill=2), slices=slices), POLICY)
    assert d.outcome is Outcome.HOLD
    assert all(c.mean_gain == 0 for c in d.candidates)


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="unique"):
        PlannerInput(nodes=nodes(prefill=1) + nodes(prefill=1), slices=())
    with pytest.raises(ValueError, match="at least one node per phase"):
        PlannerPolicy(min_decode=0)
    zero = NodeModel(prefill=PrefillModel(0, 0, 0, 1e-6), decode=DecodeModel(0.01, 0, 0))
    with pytest.raises(ValueError, match="infinite throughput"):
        PlannerInput(nodes=nodes(prefill=2, model=zero), slices=(WorkSlice(*OSWORLD),) * 2)


def test_initial_roles_keep_pins_and_fill_prefill_in_name_order() -> None:
    names = ["e3", "e0", "e2", "e1", "e4"]
    roles = initial_roles(names, {"e0": Role.DECODE, "e4": Role.PREFILL}, prefill=2, policy=POLICY)
    assert roles == {
        "e0": Role.DECODE,
        "e1": Role.PREFILL,
        "e2": Role.DECODE,
        "e3": Role.DECODE,
        "e4": Role.PREFILL,
    }
    with pytest.raises(ValueError, match="pinned"):
        initial_roles(names, {"e0": Role.PREFILL, "e1": Role.PREFILL}, prefill=1, policy=POLICY)
    with pytest.raises(ValueError, match="minimum"):
        initial_roles(names, {}, prefill=5, policy=POLICY)
    with pytest.raises(ValueError, match="not in the pool"):
        initial_roles(names, {"x": Role.DECODE}, prefill=1, policy=POLICY)


# ---- decode KV room ----------------------------------------------------------------------------


def _with_kv(ns: tuple[PlannerNode, ...], capacity: float) -> tuple[PlannerNode, ...]:
    return tuple(dataclasses.replace(n, kv_capacity_tokens=capacity) for n in ns)


def test_a_split_whose_decode_nodes_cannot_hold_the_running_contexts_is_not_chosen() -> None:
    # OSWorld-like at 60 requests in flight: each holds 12K + 80K + 300 tokens of KV, 5.5M in all.
    slices = tuple(noisy_slices(OSWORLD, 10, 0.02, np.random.default_rng(5)))
    demand = [s.decode_occupancy * (s.work.t_uc + s.work.t_c + s.work.t_out) for s in slices]
    unlimited = plan(PlannerInput(nodes=nodes(prefill=2), slices=slices), POLICY)
    assert unlimited.chosen is not None and unlimited.chosen.prefill_count == 6  # 3 decode nodes
    # 1.6M tokens of decode KV per node: 3 nodes (4.8M) cannot hold the contexts, 4 (6.4M) can
    capacity = 1.6e6
    assert 3 * capacity < min(demand) and 4 * capacity > max(demand)
    d = plan(PlannerInput(nodes=_with_kv(nodes(prefill=2), capacity), slices=slices), POLICY)
    assert d.outcome is Outcome.SWITCH, d.reason
    assert d.chosen is not None and d.chosen.prefill_count == 5
    for c in d.candidates:
        assert c.kv_short_slices == (10 if c.prefill_count >= 6 else 0), c
        if c.prefill_count >= 6:
            assert not c.qualifies


def test_kv_room_caps_the_decode_batch_of_eq4() -> None:
    # Putnam-like, decode-heavy: 300 requests of 38K tokens; 8 decode nodes of 1M tokens hold 26 each
    s = WorkSlice(*PUTNAM)
    arrays = NodeArrays.of([NODE] * 8, [1.0e6] * 8)
    per_node = 1.0e6 / (s.work.t_uc + s.work.t_c + s.work.t_out)
    assert per_node < s.decode_occupancy / 8
    rates = arrays.decode_rates(SliceArrays.of([s]), 8)
    assert rates[:, 0] == pytest.approx([NODE.decode_rate(s.work, per_node)] * 8, rel=1e-12)
    # without a capacity (or an infinite one) the batch is q̄/|D|, as Eq. 4 writes it
    for free in (NodeArrays.of([NODE] * 8), NodeArrays.of([NODE] * 8, [float("inf")] * 8)):
        assert free.decode_rates(SliceArrays.of([s]), 8)[:, 0] == pytest.approx(
            [NODE.decode_rate(s.work, s.decode_occupancy / 8)] * 8, rel=1e-12
        )


def test_infinite_kv_capacity_decides_as_before() -> None:
    for seed in range(10):
        slices = tuple(noisy_slices(OSWORLD if seed % 2 else PUTNAM, 10, 0.08, np.random.default_rng(seed)))
        a = plan(PlannerInput(nodes=nodes(prefill=4), slices=slices), POLICY)
        b = plan(PlannerInput(nodes=_with_kv(nodes(prefill=4), float("inf")), slices=slices), POLICY)
        assert a == b


def test_a_pool_already_short_of_kv_room_may_still_add_decode_nodes() -> None:
    # Putnam-like with 5P4D: 4 decode nodes of 2M tokens hold 210 of the 300 running contexts
    slices = tuple(noisy_slices(PUTNAM, 10, 0.02, np.random.default_rng(9)))
    d = plan(PlannerInput(nodes=_with_kv(nodes(prefill=5), 2.0e6), slices=slices), POLICY)
    assert d.outcome is Outcome.SWITCH, d.reason
    assert d.chosen is not None and d.chosen.prefill_count < 5
    assert d.chosen.kv_short_slices <= 10


def test_kv_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="KV capacity"):
        PlannerNode("n0", NODE, Role.DECODE, kv_capacity_tokens=0.0)
