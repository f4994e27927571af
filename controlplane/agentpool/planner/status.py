"""The planner's part of the `AgentServingPool` status, built from its fits and decisions.

The status has one prefill and one decode model for the pool; the planner fits one per node. The
status shows the median of each coefficient over the nodes (robust to one badly fitted node);
the per-node fits and their held-out errors stay in the controller (``PlannerController.fits``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from datetime import datetime

from agentpool.api import ModelFitStatus, SwitchStatus
from agentpool.api.status import DecodeFit, PrefillFit
from agentpool.models.fitting import NodeFit
from agentpool.planner.core import Outcome, SplitDecision


def split_label(prefill: int, decode: int) -> str:
    """``4P5D``."""
    return f"{prefill}P{decode}D"


def model_fit_status(fits: Mapping[str, NodeFit], fitted_at: datetime) -> ModelFitStatus:
    """Fitted state with the median coefficients over nodes and the records used by all fits."""
    if not fits:
        raise ValueError("no fits to report")
    nodes = list(fits.values())

    def median(values: list[float]) -> float:
        return float(statistics.median(values))

    records = sum(
        f.prefill.report.records_fit
        + f.prefill.report.records_held_out
        + f.decode.report.records_fit
        + f.decode.report.records_held_out
        for f in nodes
    )
    return ModelFitStatus(
        state="Fitted",
        records=records,
        fitted_at=fitted_at,
        prefill=PrefillFit(
            c0=median([f.prefill.model.c0 for f in nodes]),
            c1=median([f.prefill.model.c1 for f in nodes]),
            c2=median([f.prefill.model.c2 for f in nodes]),
            c3=median([f.prefill.model.c3 for f in nodes]),
        ),
        decode=DecodeFit(
            d0=median([f.decode.model.d0 for f in nodes]),
            d1=median([f.decode.model.d1 for f in nodes]),
            d2=median([f.decode.model.d2 for f in nodes]),
        ),
    )


def switch_status(previous: SwitchStatus | None, decision: SplitDecision, at: datetime) -> SwitchStatus:
    """The switch counters after ``decision`` (unchanged unless it switched)."""
    prev = previous or SwitchStatus()
    if decision.outcome is not Outcome.SWITCH:
        return prev
    before_p = len(decision.prefill) - len(decision.to_prefill) + len(decision.to_decode)
    before_d = len(decision.decode) - len(decision.to_decode) + len(decision.to_prefill)
    return SwitchStatus(
        total=prev.total + 1,
        last_time=at,
        last_from=split_label(before_p, before_d),
        last_to=split_label(len(decision.prefill), len(decision.decode)),
    )
