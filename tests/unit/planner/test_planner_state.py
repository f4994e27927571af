"""The planner's saved state: models and last switch survive a JSON round trip; shape checked."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentpool.models import DecodeModel, MoeShape, NodeModel, PrefillModel
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
