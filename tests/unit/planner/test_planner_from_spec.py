from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agentpool.api import AgentServingPool
from agentpool.api.control import RefitSpec
from agentpool.models import MoeShape
from agentpool.models.refit import RefitPolicy
from agentpool.planner.config import PlannerConfig
from agentpool.planner.from_spec import moe_shape, planner_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _pool(name: str) -> AgentServingPool:
    return AgentServingPool.model_validate(yaml.safe_load((EXAMPLES / name).read_text()))


def test_planner_config_from_the_sim_example() -> None:
    spec = _pool("pool-sim.yaml").spec
    cfg = planner_config(spec)
    assert cfg == PlannerConfig(
        window_s=120.0,
        slices=6,
        warmup_s=60.0,
        cooldown_s=30.0,
        min_prefill=spec.planner.min_nodes.prefill,
        min_decode=spec.planner.min_nodes.decode,
        initial_prefill=3,
        enabled=True,
    )
    assert moe_shape(spec) == MoeShape(experts_active=8, experts_total=128, t_fwd=1.0)


def test_dense_model_and_colocated_pool() -> None:
    spec = _pool("pool-sim.yaml").spec
    dense = spec.model_copy(update={"model": spec.model.model_copy(update={"experts": None})})
    assert moe_shape(dense) == MoeShape(experts_active=0, experts_total=0)
    colocated = spec.model_copy(update={"mode": "colocated", "initial_split": None})
    with pytest.raises(ValueError, match="colocated"):
        planner_config(colocated)


def test_the_refit_opt_out_and_thresholds_reach_the_planner_config() -> None:
    spec = _pool("pool-sim.yaml").spec
    assert planner_config(spec).refit  # on by default, with RefitPolicy's defaults
    assert planner_config(spec).refit_policy() == RefitPolicy()
    off = spec.model_copy(
        update={"planner": spec.planner.model_copy(update={"refit": RefitSpec(enabled=False)})}
    )
    assert planner_config(off).refit is False
    manifest = yaml.safe_load((EXAMPLES / "pool-sim.yaml").read_text())
    manifest["spec"].setdefault("planner", {})["refit"] = {
        "margin": 2,
        "minRecords": 50,
        "minShare": 0.25,
        "maxError": 0.2,
        "maxRecords": 1000,
    }
    tuned = planner_config(AgentServingPool.model_validate(manifest).spec)
    assert tuned.refit and tuned.refit_policy() == RefitPolicy(
        margin=2.0, min_records=50, min_share=0.25, max_error=0.2, max_records=1000
    )


def test_the_min_relative_gain_reaches_the_planner_policy() -> None:
    spec = _pool("pool-sim.yaml").spec
    assert planner_config(spec).policy().min_relative_gain == 0.03  # the default
    off = spec.model_copy(update={"planner": spec.planner.model_copy(update={"min_relative_gain": 0.0})})
    assert planner_config(off).policy().min_relative_gain == 0.0  # the paper's test alone
