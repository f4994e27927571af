"""`agentpool simulate -f POOL.yaml`: the manifest's pool, SLO, planner and policy reach the simulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentpool.local.pool import read_manifest
from agentpool.local.pool_sim import apply_pool, pool_system
from agentpool.models import IterationCoefficients, PrefillModel, TtftSlo
from agentpool.models.refit import RefitPolicy
from agentpool.sim.metrics import Metrics
from agentpool.sim.planners import PlannerSettings
from agentpool.sim.presets import preset
from agentpool.sim.run import Scenario
from agentpool.sim.simulator import Simulator
from agentpool.sim.systems import SYSTEMS

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pool-sim.yaml"


def manifest(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    text = EXAMPLE.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    p = tmp_path / "pool.yaml"
    p.write_text(text)
    return p


def test_the_example_is_agentpool_with_its_shape_slo_and_windows() -> None:
    pool = read_manifest(EXAMPLE)
    assert pool_system(pool) == "agentpool"
    sc = apply_pool(Scenario(), pool)
    assert (sc.sim.nodes, sc.sim.prefill_nodes, sc.static_prefill_nodes) == (6, 3, 3)
    assert (sc.sim.slo_ttft_base_s, sc.sim.slo_ttft_per_token_s, sc.sim.slo_tpot_s) == (2.0, 2e-5, 0.05)
    assert (sc.planner.window_s, sc.planner.slices, sc.planner.cooldown_s) == (120.0, 6, 30.0)


NO_PLANNER = ("    cooldown: 30s", "    cooldown: 30s\n    enabled: false")
COLOCATED = ("  initialSplit:\n    prefill: 3\n", "  mode: colocated\n")


@pytest.mark.parametrize(
    ("edits", "system"),
    [
        ((("policy: evolving", "policy: smetric"),), "agentpool-smetric"),
        ((("policy: evolving", "policy: cache-aware"), NO_PLANNER), "static-cache-aware"),
        ((("policy: evolving", "policy: lmetric"), COLOCATED, NO_PLANNER), "lmetric"),
    ],
)
def test_policy_and_planner_pick_the_system(
    tmp_path: Path, edits: tuple[tuple[str, str], ...], system: str
) -> None:
    assert pool_system(read_manifest(manifest(tmp_path, *edits))) == system


def test_a_pool_no_system_simulates_is_an_error(tmp_path: Path) -> None:
    pool = read_manifest(manifest(tmp_path, ("policy: evolving", "policy: dynamo")))
    with pytest.raises(
        ValueError, match="no simulated system runs a disaggregated pool with router policy 'dynamo'"
    ):
        pool_system(pool)


PLANNER_KNOBS = (
    "    cooldown: 30s",
    "    cooldown: 30s\n    minNodes:\n      prefill: 2\n      decode: 3\n    minRelativeGain: 0.12\n"
    "    refit:\n      enabled: false\n      margin: 2.5\n      minRecords: 33\n      minShare: 0.25\n"
    "      maxError: 0.2\n      maxRecords: 500",
)


def test_the_planner_min_nodes_gain_floor_and_refit_reach_the_simulated_planner(tmp_path: Path) -> None:
    """Flag values (``--min-relative-gain 0 --no-refit``) give way to the manifest's."""
    flags = Scenario(planner=PlannerSettings(min_relative_gain=0.0, refit=True))
    sc = apply_pool(flags, read_manifest(manifest(tmp_path, PLANNER_KNOBS)))
    assert (sc.planner.min_prefill, sc.planner.min_decode) == (2, 3)
    assert sc.planner.min_relative_gain == 0.12
    assert sc.planner.refit is False
    assert sc.planner.refit_policy == RefitPolicy(
        margin=2.5, min_records=33, min_share=0.25, max_error=0.2, max_records=500
    )


def test_a_manifest_without_them_gives_the_spec_defaults() -> None:
    flags = Scenario(planner=PlannerSettings(min_relative_gain=0.0, refit=False))
    sc = apply_pool(flags, read_manifest(EXAMPLE))
    assert (sc.planner.min_relative_gain, sc.planner.refit) == (0.03, True)
    assert (sc.planner.min_prefill, sc.planner.min_decode) == (1, 1)
    assert sc.planner.refit_policy == RefitPolicy()


ITERATION_MODEL = (
    "  model:\n",
    "  model:\n    iterationModel: {c0: 0.012, c1: 4.0e-5, c2: 2.0e-10, c3: 1.0e-7,\n"
    "                     d0: 0.009, d1: 0.004, d2: 2.0e-4}\n",
)


def test_the_iteration_model_is_what_the_simulated_routers_and_planners_start_from(tmp_path: Path) -> None:
    sc = apply_pool(Scenario(), read_manifest(manifest(tmp_path, ITERATION_MODEL)))
    assert sc.sim.node_model == IterationCoefficients(0.012, 4e-5, 2e-10, 1e-7, 0.009, 0.004, 2e-4)
    p = preset(sc.preset)
    sim = Simulator(SYSTEMS["agentpool"], p, sc.sim, Metrics(TtftSlo(2.0, 0.0), 0.1, 0.0, 60.0), seed=0)
    (model,) = set(sim.models)
    assert model.prefill == PrefillModel(0.012, 4e-5, 2e-10, 1e-7)
    assert (model.decode.d0, model.decode.d1, model.decode.d2) == (0.009, 0.004, 2e-4)
    assert model.decode.experts_total == p.decode_model().experts_total  # the preset's shape
    default = Simulator(
        SYSTEMS["agentpool"], p, Scenario().sim, Metrics(TtftSlo(2.0, 0.0), 0.1, 0.0, 60.0), seed=0
    )
    assert default.models[0].prefill == p.prefill_model()
