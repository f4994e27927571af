from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
from planner_scenarios import OSWORLD, nodes, noisy_slices

from agentpool.api import SwitchStatus
from agentpool.models import DecodeModel, MoeShape, NodeModel, PrefillModel
from agentpool.models.fitting import fit_nodes
from agentpool.models.synthetic import decode_records, prefill_records
from agentpool.planner.core import Outcome, PlannerInput, PlannerPolicy, plan
from agentpool.planner.status import model_fit_status, switch_status

AT = datetime(2026, 11, 29, 17, 0, tzinfo=UTC)


def test_model_fit_status_reports_median_coefficients_and_all_records() -> None:
    rng = np.random.default_rng(0)
    records = []
    for i, scale in enumerate([1.0, 1.1, 5.0]):  # the third node is an outlier
        m = NodeModel(
            PrefillModel(0.01 * scale, 4e-5, 2e-10, 1e-6), DecodeModel(0.01, 0.02 * scale, 2e-4, 8, 256)
        )
        records += prefill_records(f"n{i}", m, 50, 0.0, rng) + decode_records(f"n{i}", m, 50, 0.0, rng)
    status = model_fit_status(fit_nodes(records, MoeShape(8, 256)), AT)
    assert status.state == "Fitted" and status.records == 300 and status.fitted_at == AT
    assert status.prefill is not None and status.decode is not None
    assert abs(status.prefill.c0 - 0.011) < 1e-6  # median of 0.010, 0.011, 0.050
    assert abs(status.decode.d1 - 0.022) < 1e-6


def test_switch_status_counts_switches_and_labels_the_splits() -> None:
    slices = tuple(noisy_slices(OSWORLD, 10, 0.05, np.random.default_rng(7)))
    d = plan(PlannerInput(nodes=nodes(prefill=2), slices=slices), PlannerPolicy())
    assert d.outcome is Outcome.SWITCH
    s = switch_status(SwitchStatus(total=3), d, AT)
    assert (s.total, s.last_from, s.last_to, s.last_time) == (4, "2P7D", "6P3D", AT)
    hold = plan(PlannerInput(nodes=nodes(prefill=6), slices=slices), PlannerPolicy())
    assert hold.outcome is Outcome.HOLD
    assert switch_status(s, hold, AT) is s
