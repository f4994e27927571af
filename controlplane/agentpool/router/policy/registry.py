"""The explicit registry of routing policies: name -> factory taking the policy's knobs.

Adding a policy means adding one module and one line here; nothing registers itself on import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agentpool.router.policy.cache_aware import CacheAwarePolicy
from agentpool.router.policy.contract import Policy, PolicyError
from agentpool.router.policy.dynamo import DynamoPolicy
from agentpool.router.policy.evolving import EvolvingPolicy
from agentpool.router.policy.least_loaded import LeastLoadedPolicy
from agentpool.router.policy.linear import LinearPolicy
from agentpool.router.policy.lmetric import LMetricPolicy
from agentpool.router.policy.round_robin import RoundRobinPolicy
from agentpool.router.policy.smetric import SMetricPolicy

PolicyFactory = Callable[[Mapping[str, float] | None], Policy]

POLICIES: Mapping[str, PolicyFactory] = {
    "cache-aware": CacheAwarePolicy.from_knobs,
    "dynamo": DynamoPolicy.from_knobs,
    "evolving": EvolvingPolicy.from_knobs,
    "least-loaded": LeastLoadedPolicy.from_knobs,
    "linear": LinearPolicy.from_knobs,
    "lmetric": LMetricPolicy.from_knobs,
    "round-robin": RoundRobinPolicy.from_knobs,
    "smetric": SMetricPolicy.from_knobs,
}


def policy_names() -> list[str]:
    return sorted(POLICIES)


def create_policy(name: str, knobs: Mapping[str, float] | None = None) -> Policy:
    """A new policy instance named ``name`` with ``knobs`` validated and bound."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise PolicyError(f"unknown routing policy {name!r}; known: {policy_names()}") from None
    return factory(knobs)
