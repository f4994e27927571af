"""What a pool manifest means to the simulator: ``agentpool simulate -f POOL.yaml``.

The manifest sets the pool (nodes, initial split, mode), the SLO, the planner's window, slices,
cooldown, minimum nodes per phase, minimum relative gain and refit settings (over
``--min-relative-gain`` and ``--no-refit``), the iteration model the routers and planners start
from (``spec.model.iterationModel``, over the preset's; the simulated truth stays the preset's),
and which simulated system is the pool: the one with the manifest's routing policy and planner
(``evolving`` + planner: ``agentpool``; ``smetric`` + planner: ``agentpool-smetric``; a colocated
pool: the colocated system of its policy). A manifest no simulated system matches is an error
that says so. Everything else (trace, agents, duration, node preset) stays a flag.
"""

from __future__ import annotations

import dataclasses

from agentpool.api import AgentServingPool
from agentpool.models import IterationCoefficients
from agentpool.sim.run import Scenario
from agentpool.sim.systems import SYSTEMS, PlannerKind, Pool


def pool_system(pool: AgentServingPool) -> str:
    """The simulated system that runs ``pool`` as its manifest configures it."""
    spec = pool.spec
    policy = spec.router.policy
    layout = Pool.COLOCATED if spec.mode == "colocated" else Pool.DISAGGREGATED
    planned = spec.planner.enabled and layout is Pool.DISAGGREGATED
    for name, system in SYSTEMS.items():
        if system.unlimited_cache or system.pool is not layout or system.policy != policy:
            continue
        if layout is Pool.COLOCATED or system.planner is (
            PlannerKind.EVOLVING if planned else PlannerKind.NONE
        ):
            return name
    raise ValueError(
        f"no simulated system runs a {spec.mode} pool with router policy {policy!r}"
        + (" and the planner" if planned else " without the planner")
        + f"; simulated systems: {', '.join(SYSTEMS)} (pick with --systems)"
    )


def apply_pool(sc: Scenario, pool: AgentServingPool) -> Scenario:
    """``sc`` with the manifest's pool shape, SLO and planner settings."""
    spec = pool.spec
    slo = spec.slo.ttft_slo()
    planner = spec.planner.settings()
    given = spec.model.iteration_coefficients()
    prefill = spec.initial_prefill if spec.mode == "disaggregated" else sc.sim.prefill_nodes
    sim = dataclasses.replace(
        sc.sim,
        nodes=spec.nodes,
        prefill_nodes=min(prefill, spec.nodes),
        slo_ttft_base_s=slo.base,
        slo_ttft_per_token_s=slo.per_token,
        slo_tpot_s=spec.slo.tpot_s,
        node_model=None if given is None else IterationCoefficients.of(given),
    )
    return dataclasses.replace(
        sc,
        sim=sim,
        static_prefill_nodes=sim.prefill_nodes,
        planner=dataclasses.replace(
            sc.planner,
            window_s=planner.window_s,
            slices=planner.slices,
            cooldown_s=planner.cooldown_s,
            min_prefill=planner.min_prefill,
            min_decode=planner.min_decode,
            min_relative_gain=planner.min_relative_gain,
            refit=planner.refit,
            refit_policy=planner.refit_policy,
        ),
    )
