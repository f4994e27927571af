"""The spec's router section and the router's policy registry name the same policies and knobs."""

from __future__ import annotations

import dataclasses

import pytest

from agentpool.api import POLICY_NAMES, RouterSpec
from agentpool.router.policy import POLICIES, create_policy


def test_policy_names_equal_the_registry() -> None:
    assert sorted(POLICY_NAMES) == sorted(POLICIES)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_spec_knob_defaults_equal_the_policy_defaults(name: str) -> None:
    """The knobs a pool gets without writing any are exactly the router's own defaults."""
    spec_knobs = RouterSpec.model_validate({"policy": name}).knobs()
    router_defaults = dataclasses.asdict(create_policy(name).knobs)  # type: ignore[attr-defined]
    assert spec_knobs == router_defaults


@pytest.mark.parametrize(
    "router",
    [
        {"policy": "smetric", "smetric": {"slack": 1.5, "hitRatio": 0.5}},
        {"policy": "cache-aware", "cacheAware": {"cacheThreshold": 0.5, "balanceAbs": 8, "balanceRel": 1.1}},
        {"policy": "dynamo", "dynamo": {"hostCredit": 0.5, "overlapWeight": 2}},
        {"policy": "linear", "linear": {"lambda": 0.25}},
    ],
)
def test_spec_knobs_build_the_policy(router: dict[str, object]) -> None:
    spec = RouterSpec.model_validate(router)
    policy = create_policy(spec.policy, spec.knobs())
    assert dataclasses.asdict(policy.knobs) == spec.knobs()  # type: ignore[attr-defined]
