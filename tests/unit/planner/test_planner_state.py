"""The planner's saved state: models, fitted records and last switch survive a JSON round trip;
shape checked; the records stay within their bounds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from pydantic import ValidationError

from agentpool.models import DecodeModel, MoeShape, NodeModel, PrefillModel
from agentpool.models.fitting import prefill_regressors
from agentpool.models.refit import NodeRecords
from agentpool.models.synthetic import decode_records, prefill_records
from agentpool.planner.saved_records import RECORDS_PER_PHASE, saved_records
from agentpool.planner.state import PlannerState

MODEL = NodeModel(
    prefill=PrefillModel(c0=0.015, c1=4e-5, c2=2e-10, c3=1e-6),
    decode=DecodeModel(d0=0.012, d1=0.018, d2=2.5e-4, experts_active=8, experts_total=256),
    t_bar=4096.0,
    f_restore=0.25,
)
SHAPE = MoeShape(experts_active=8, experts_total=256)


def test_round_trip_keeps_every_coefficient_and_the_last_switch() -> None:
    state = PlannerState.of(SHAPE, {"b": MODEL, "a": MODEL}, fitted_at=10.0, last_switch_at=99.5)
    back = PlannerState.model_validate_json(state.model_dump_json())
    assert back.node_models() == {"a": MODEL, "b": MODEL}
    assert (back.fitted_at, back.last_switch_at) == (10.0, 99.5)
    assert back.matches(SHAPE) and not back.matches(MoeShape(experts_active=0, experts_total=0))


SHAPE_JSON = '"shape": {"experts_active": 0, "experts_total": 0, "t_fwd": 1}'


@pytest.mark.parametrize(
    "raw",
    [
        '{"version": 2, ' + SHAPE_JSON + ', "fitted_at": 0, "models": {}}',
        "{" + SHAPE_JSON + ', "fitted_at": 0, "models": {}, "x": 1}',
        "{" + SHAPE_JSON + ', "fitted_at": NaN, "models": {}}',
    ],
)
def test_other_versions_unknown_fields_and_non_finite_values_are_rejected(raw: str) -> None:
    with pytest.raises(ValidationError):
        PlannerState.model_validate_json(raw)


def _records(node: str, n: int, seed: int) -> NodeRecords:
    rng = np.random.default_rng(seed)
    return NodeRecords(
        tuple(prefill_records(node, MODEL, n, 0.02, rng, start=1000.0)),
        tuple(decode_records(node, MODEL, n, 0.02, rng, start=1000.0)),
    )


def _ranges(r: NodeRecords) -> tuple[list[float], ...]:
    """Each refit regressor's largest and smallest positive value over the records."""
    cols = np.array([prefill_regressors(x.batch)[1:] for x in r.prefill])
    running = np.array([x.running for x in r.decode], dtype=np.float64)
    return (
        list(cols.max(axis=0)),
        [float(c[c > 0].min()) if (c > 0).any() else 0.0 for c in cols.T],
        [float(running.max()), float(running.min())],
    )


def test_fitted_records_are_saved_thinned_keeping_their_range_and_restored() -> None:
    fitted = {"a": _records("a", 1000, 1), "b": _records("a", 100, 2)}  # b: fitted on a's records
    state = PlannerState.of(SHAPE, {"a": MODEL, "b": MODEL}, 10.0, None, records=saved_records(fitted))
    back = PlannerState.model_validate_json(state.model_dump_json()).node_records()
    assert sorted(back) == ["a", "b"]
    a = back["a"]
    assert len(a.prefill) == len(a.decode) == RECORDS_PER_PHASE  # from 1000 each
    assert _ranges(a) == _ranges(fitted["a"])  # what a window is checked against: unchanged
    assert set(a.prefill) <= {replace(x, node="a") for x in fitted["a"].prefill}  # records as they were
    assert [x.at for x in a.decode] == sorted(x.at for x in a.decode)  # in order
    b = back["b"]
    assert len(b.prefill) == 100 and all(x.node == "b" for x in b.prefill)  # kept whole, now b's
    assert [x.batch for x in b.prefill] == [x.batch for x in fitted["b"].prefill]


def test_saved_records_stay_within_their_byte_budget() -> None:
    fitted = {f"n{i}": _records(f"n{i}", 300, i) for i in range(20)}
    whole = sum(len(s.model_dump_json()) for s in saved_records(fitted).values())
    budget = whole // 3
    saved = saved_records(fitted, budget=budget)
    assert 0 < sum(len(s.model_dump_json()) for s in saved.values()) <= budget
    (n,) = {len(s.decode) for s in saved.values()}  # the same count for every node ...
    assert n in {RECORDS_PER_PHASE >> k for k in range(1, 8)}  # ... halved until they fit
    assert saved_records(fitted, budget=100) == {}  # not even one record each: none saved


def test_a_state_saved_before_records_were_kept_still_loads() -> None:
    raw = "{" + SHAPE_JSON + ', "fitted_at": 0, "models": {}}'
    assert PlannerState.model_validate_json(raw).node_records() == {}
