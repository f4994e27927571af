"""The planner's own configuration (Algorithm E.3 parameters), independent of the pool spec's shape."""

from __future__ import annotations

from dataclasses import dataclass

from agentpool.models import DEFAULT_OCCUPANCY, IterationCoefficients, OccupancyCount
from agentpool.models.refit import RefitPolicy
from agentpool.planner.core import PlannerPolicy

_REFIT = RefitPolicy()  # the defaults


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """Window ``T_win`` cut into ``slices``; warmup ``T_learn``; cooldown; min nodes per phase.

    Defaults are the paper's runs: 600 s windows of ten 60 s slices, 1800 s warmup, 120 s cooldown.
    ``initial_prefill`` is the prefill count of the split that disaggregation starts from.
    ``occupancy`` is what ``q̄`` counts: requests in flight by default (why:
    :class:`agentpool.models.OccupancyCount`); samples that count something else are ignored.
    ``refit``: refit a node's models when a window's iteration records leave the range they were
    fitted on and they mispredict them (:mod:`agentpool.models.refit`); false keeps the warmup's
    fit frozen, as the paper does. ``refit_margin``, ``refit_min_records``, ``refit_min_share``,
    ``refit_max_error`` and ``refit_max_records`` are :class:`RefitPolicy`'s fields (its defaults;
    :meth:`refit_policy`), flat so that a settings file and the command line set them by name.
    ``min_relative_gain``: a switch must gain at least this fraction of the current split's
    predicted throughput, and moving more nodes must gain that much more than moving fewer
    (:class:`agentpool.planner.core.PlannerPolicy`; 0 is the paper's test alone). 3% by default:
    the paper finds adjacent splits "differ by only a few percent, for example 3% ..., which is
    comparable to the variation between runs" (App. D.2).
    ``prior_model``: the coefficients the first fit starts from (``spec.model.iterationModel``):
    every node's prior until it has a model of its own, so the terms its warmup records cannot
    tell apart keep these values (:func:`agentpool.models.fitting.fit_nodes`); None: no prior.
    """

    window_s: float = 600.0
    slices: int = 10
    warmup_s: float = 1800.0
    cooldown_s: float = 120.0
    min_prefill: int = 1
    min_decode: int = 1
    initial_prefill: int = 1
    enabled: bool = True
    occupancy: OccupancyCount = DEFAULT_OCCUPANCY
    refit: bool = True
    min_relative_gain: float = 0.03
    refit_margin: float = _REFIT.margin
    refit_min_records: int = _REFIT.min_records
    refit_min_share: float = _REFIT.min_share
    refit_max_error: float = _REFIT.max_error
    refit_max_records: int = _REFIT.max_records
    prior_model: IterationCoefficients | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "occupancy", OccupancyCount(self.occupancy))  # "in_flight" from a file
        if self.prior_model is not None:  # a mapping from a file
            object.__setattr__(self, "prior_model", IterationCoefficients.of(self.prior_model, "prior_model"))
        if self.window_s <= 0 or self.warmup_s < 0:
            raise ValueError(f"window must be > 0 s and warmup >= 0 s: {self}")
        if self.slices < 2:
            raise ValueError(f"the gain test needs at least 2 slices per window, got {self.slices}")
        if self.initial_prefill < self.min_prefill:
            raise ValueError(f"initial prefill count {self.initial_prefill} is below min {self.min_prefill}")
        self.policy()  # validates cooldown and min nodes per phase
        self.refit_policy()  # and the refit thresholds

    def policy(self) -> PlannerPolicy:
        return PlannerPolicy(
            cooldown_s=self.cooldown_s,
            min_prefill=self.min_prefill,
            min_decode=self.min_decode,
            min_relative_gain=self.min_relative_gain,
        )

    def refit_policy(self) -> RefitPolicy:
        return RefitPolicy(
            margin=self.refit_margin,
            min_records=self.refit_min_records,
            min_share=self.refit_min_share,
            max_error=self.refit_max_error,
            max_records=self.refit_max_records,
        )
