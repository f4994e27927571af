"""Value parsers and the plain settings the planner and router build from the spec."""

from __future__ import annotations

import pytest
from asp_validators import load_example

from agentpool.api import (
    POLICY_NAMES,
    AgentServingPool,
    FetchSettings,
    PlannerSettings,
    RouterSpec,
    byte_quantity,
    duration_seconds,
)
from agentpool.models import TtftSlo


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0s", 0.0),
        ("250ms", 0.25),
        ("0.45ms", 0.00045),
        ("2s", 2.0),
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("1m30s500ms", 90.5),
    ],
)
def test_duration_seconds(text: str, seconds: float) -> None:
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "10", "10 m", "-1s", "1d", "1us", ".5s", "ms", "10mm"])
def test_malformed_durations_raise(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        duration_seconds(text)


def test_per_kilo_token_durations_are_exact() -> None:
    assert duration_seconds("1ms", per=1000) == 1e-6
    assert duration_seconds("0.1ms", per=1000) == 1e-7
    assert duration_seconds("20ms", per=1000) == 2e-5


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (0, 0),
        (4096, 4096),
        ("0", 0),
        ("512Mi", 512 * 2**20),
        ("64Gi", 64 * 2**30),
        ("1.5Ti", 3 * 2**39),
        ("500M", 500 * 10**6),
        ("2k", 2000),
    ],
)
def test_byte_quantity(value: int | str, size: int) -> None:
    assert byte_quantity(value) == size


@pytest.mark.parametrize("value", [-1, "lots", "1GB", "1e3", "-5Gi", "1m"])
def test_malformed_byte_quantities_raise(value: int | str) -> None:
    with pytest.raises(ValueError, match="byte quantity"):
        byte_quantity(value)


def test_policy_names() -> None:
    assert POLICY_NAMES == (
        "evolving",
        "smetric",
        "round-robin",
        "least-loaded",
        "cache-aware",
        "dynamo",
        "lmetric",
        "linear",
        "session-id",
    )


def test_sglang_example_settings() -> None:
    spec = AgentServingPool.model_validate(load_example("pool-sglang.yaml")).spec
    assert spec.planner.settings() == PlannerSettings(
        enabled=True,
        window_s=600.0,
        slices=10,
        warmup_s=1800.0,
        cooldown_s=120.0,
        min_prefill=2,
        min_decode=2,
    )
    assert spec.planner.settings().slice_s == 60.0
    router = spec.router.settings()
    assert router.policy == "evolving"
    assert router.knobs == {}
    assert router.fetch == FetchSettings(base_s=0.00045, per_token_s=1e-6, min_tokens=512)
    assert router.copy_price_s_per_token == 1e-7
    assert router.state_max_age_s == 5.0
    assert spec.slo.ttft_slo() == TtftSlo(base=2.0, per_token=2e-5)
    assert spec.slo.tpot_s == 0.05
    assert spec.engine.host_kv_bytes == 512 * 2**30
    assert (spec.initial_prefill, spec.initial_decode) == (4, 5)
    assert spec.model.client_name == "qwen3-coder"
    assert spec.model.experts is not None and (spec.model.experts.active, spec.model.experts.total) == (
        8,
        128,
    )


def test_defaults_of_a_minimal_pool() -> None:
    spec = AgentServingPool.model_validate(load_example("pool-sim.yaml")).spec
    assert spec.mode == "disaggregated"
    assert spec.kv_pool.page_size == 64
    assert spec.kv_pool.eviction_policy == "branch-count"
    assert spec.redis.managed is not None and spec.redis.existing is None
    assert spec.model.client_name == "Qwen/Qwen3-Coder-30B-A3B-Instruct"


@pytest.mark.parametrize(
    ("router", "knobs"),
    [
        ({"policy": "smetric"}, {"slack": 1.0, "hit_ratio": 0.8}),
        ({"policy": "smetric", "smetric": {"slack": 1.5}}, {"slack": 1.5, "hit_ratio": 0.8}),
        (
            {"policy": "cache-aware"},
            {"cache_threshold": 0.3, "balance_abs": 64.0, "balance_rel": 1.5},
        ),
        ({"policy": "dynamo", "dynamo": {"hostCredit": 0.5}}, {"host_credit": 0.5, "overlap_weight": 1.0}),
        ({"policy": "linear", "linear": {"lambda": 0.25}}, {"lam": 0.25}),
        ({"policy": "lmetric"}, {}),
        ({"policy": "round-robin"}, {}),
    ],
)
def test_router_knobs_fill_defaults(router: dict[str, object], knobs: dict[str, float]) -> None:
    assert RouterSpec.model_validate(router).settings().knobs == knobs


def test_colocated_pool_has_no_split() -> None:
    manifest = load_example("pool-sim.yaml")
    del manifest["spec"]["initialSplit"]
    manifest["spec"].update(mode="colocated", planner={"enabled": False})
    spec = AgentServingPool.model_validate(manifest).spec
    assert (spec.initial_prefill, spec.initial_decode) == (0, 0)


def test_models_are_immutable_and_round_trip() -> None:
    pool = AgentServingPool.model_validate(load_example("pool-sglang.yaml"))
    with pytest.raises(ValueError, match="frozen"):
        pool.spec.nodes = 3  # type: ignore[misc]
    assert AgentServingPool.model_validate(pool.to_wire()) == pool
    assert AgentServingPool.model_validate(pool.model_dump()) == pool
