"""Eq. 1 and Eq. 2's coefficients alone: a node model to start from, before any fit.

A pool may name them (``spec.model.iterationModel``): the live planner's first fit takes them as
its prior (:class:`agentpool.planner.config.PlannerConfig`), and ``agentpool simulate -f`` starts
its routers and planners from them (:class:`agentpool.sim.config.SimConfig`). The MoE shape and the
window measurements are the pool's, added by :meth:`IterationCoefficients.node_model`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from agentpool.models.iteration import DecodeModel, NodeModel, PrefillModel
from agentpool.models.records import MoeShape


@dataclass(frozen=True, slots=True)
class IterationCoefficients:
    """``c0``-``c3`` (Eq. 1) and ``d0``-``d2`` (Eq. 2), in seconds, all non-negative."""

    c0: float
    c1: float
    c2: float
    c3: float
    d0: float
    d1: float
    d2: float

    def __post_init__(self) -> None:
        self.node_model(MoeShape())  # validates: the models refuse negative coefficients

    @classmethod
    def of(
        cls, value: IterationCoefficients | Mapping[str, Any], what: str = "coefficients"
    ) -> IterationCoefficients:
        """From itself or from a mapping of exactly the seven names to numbers (a settings file's);
        ``what`` names the setting in the error."""
        if isinstance(value, IterationCoefficients):
            return value
        names = {f.name for f in fields(cls)}
        if not isinstance(value, Mapping) or set(value) != names:
            raise ValueError(f"{what} must map exactly {sorted(names)} to seconds, got {value!r}")
        numbers = {}
        for name in sorted(names):
            v = value[name]
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"{what}.{name} must be a number, got {v!r}")
            numbers[name] = float(v)
        return cls(**numbers)

    def node_model(self, shape: MoeShape, t_bar: float = 8192.0, f_restore: float = 0.0) -> NodeModel:
        """The node model of these coefficients for a pool of ``shape``."""
        decode = DecodeModel(
            self.d0,
            self.d1,
            self.d2,
            experts_active=shape.experts_active,
            experts_total=shape.experts_total,
            t_fwd=shape.t_fwd,
        )
        prefill = PrefillModel(self.c0, self.c1, self.c2, self.c3)
        return NodeModel(prefill=prefill, decode=decode, t_bar=t_bar, f_restore=f_restore)


def decode_shape(model: DecodeModel) -> MoeShape:
    """The MoE routing shape ``model`` was fitted with."""
    return MoeShape(model.experts_active, model.experts_total, model.t_fwd)
