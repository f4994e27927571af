"""Build the planner's configuration and the models' MoE shape from an `AgentServingPool` spec."""

from __future__ import annotations

from agentpool.api import AgentServingPoolSpec
from agentpool.models import IterationCoefficients, MoeShape
from agentpool.planner.config import PlannerConfig


def planner_config(spec: AgentServingPoolSpec) -> PlannerConfig:
    """The planner section plus the initial split; a colocated pool has no split to plan."""
    if spec.mode != "disaggregated" or spec.initial_split is None:
        raise ValueError(f"a {spec.mode} pool without an initial split has no prefill/decode split to plan")
    s = spec.planner.settings()
    given = spec.model.iteration_coefficients()
    prior = None if given is None else IterationCoefficients.of(given)
    return PlannerConfig(
        window_s=s.window_s,
        slices=s.slices,
        warmup_s=s.warmup_s,
        cooldown_s=s.cooldown_s,
        min_prefill=s.min_prefill,
        min_decode=s.min_decode,
        initial_prefill=spec.initial_split.prefill,
        enabled=s.enabled,
        refit=s.refit,
        min_relative_gain=s.min_relative_gain,
        refit_margin=s.refit_policy.margin,
        refit_min_records=s.refit_policy.min_records,
        refit_min_share=s.refit_policy.min_share,
        refit_max_error=s.refit_policy.max_error,
        refit_max_records=s.refit_policy.max_records,
        prior_model=prior,
    )


def moe_shape(spec: AgentServingPoolSpec) -> MoeShape:
    """``k`` of ``E`` routed experts from ``spec.model.experts``; dense when absent.

    The spec has no speculative-decoding setting yet, so ``t_fwd`` is 1 token per request.
    """
    experts = spec.model.experts
    if experts is None:
        return MoeShape(experts_active=0, experts_total=0, t_fwd=1.0)
    return MoeShape(experts_active=experts.active, experts_total=experts.total, t_fwd=1.0)
