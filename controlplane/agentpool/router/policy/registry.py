"""The explicit registry of routing policies: name -> (policy class, its knobs dataclass).

Adding a policy means adding one module and one line here; nothing registers itself on import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentpool.router.policy.cache_aware import CacheAwareKnobs, CacheAwarePolicy
from agentpool.router.policy.contract import Policy, PolicyError
from agentpool.router.policy.dynamo import DynamoKnobs, DynamoPolicy
from agentpool.router.policy.evolving import EvolvingKnobs, EvolvingPolicy
from agentpool.router.policy.knobs import parse_knobs
from agentpool.router.policy.least_loaded import LeastLoadedKnobs, LeastLoadedPolicy
from agentpool.router.policy.linear import LinearKnobs, LinearPolicy
from agentpool.router.policy.lmetric import LMetricKnobs, LMetricPolicy
from agentpool.router.policy.round_robin import RoundRobinKnobs, RoundRobinPolicy
from agentpool.router.policy.session_id import SessionIdKnobs, SessionIdPolicy
from agentpool.router.policy.smetric import SMetricKnobs, SMetricPolicy


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    """A registered policy: its class (constructed from its knobs) and its knobs dataclass."""

    policy: Callable[[Any], Policy]
    knobs: type[Any]


POLICIES: Mapping[str, PolicyEntry] = {
    "cache-aware": PolicyEntry(CacheAwarePolicy, CacheAwareKnobs),
    "dynamo": PolicyEntry(DynamoPolicy, DynamoKnobs),
    "evolving": PolicyEntry(EvolvingPolicy, EvolvingKnobs),
    "least-loaded": PolicyEntry(LeastLoadedPolicy, LeastLoadedKnobs),
    "linear": PolicyEntry(LinearPolicy, LinearKnobs),
    "lmetric": PolicyEntry(LMetricPolicy, LMetricKnobs),
    "round-robin": PolicyEntry(RoundRobinPolicy, RoundRobinKnobs),
    "session-id": PolicyEntry(SessionIdPolicy, SessionIdKnobs),
    "smetric": PolicyEntry(SMetricPolicy, SMetricKnobs),
}


def policy_names() -> list[str]:
    return sorted(POLICIES)


def create_policy(name: str, knobs: Mapping[str, float] | None = None) -> Policy:
    """A new policy instance named ``name`` with ``knobs`` validated and bound."""
    try:
        entry = POLICIES[name]
    except KeyError:
        raise PolicyError(f"unknown routing policy {name!r}; known: {policy_names()}") from None
    return entry.policy(parse_knobs(name, entry.knobs, knobs))
