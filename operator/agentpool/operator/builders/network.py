"""NetworkPolicies of a pool: who may reach its engines and its KV directory (pure).

NIXL over UCX authenticates nothing: a host that reaches an engine's UCX endpoints (ephemeral
ports) can READ its registered host KV pool. The engine's HTTP API and its lease channel's hello
need the engine token, but the transfers themselves cannot. So, unless `spec.network.policy` is
false, the pool gets (ingress only; egress stays open):

- `<pool>-engine` selects the pool's engine pods and admits every port from the pool's engine
  pods (NIXL/UCX, the lease channel, SGLang's bootstrap and transfers), and the HTTP port from the
  pool's router pods (generate) and the metrics sources.
- `<pool>-directory` selects the pool's directory pod and admits its gRPC port (the operator does
  not run the Route link) from the pool's router pods (router and planner) and engine pods, and its
  metrics port from the metrics sources.
- `<pool>-redis` (a managed Redis only) selects the Redis pod and admits its port from the pool's
  directory pod, its only client.

Metrics sources (`spec.network.metricsFrom`): left out, every source (Prometheus may run in any
namespace; the engine HTTP port still needs the engine token for everything but the probes,
`/metrics` and `/agentpool/v1/state`); a list, those peers only; `[]`, nobody outside the pool.
Kubelet probes come from the node, which NetworkPolicy always admits. Nothing connects to an
engine from the directory, the planner or Redis: engines connect out to them.

A rule removed from a policy is applied like any dropped field: the operator's compare-then-apply
compares the digest of the whole object it last wrote (`agentpool.operator.apply`).
"""

from __future__ import annotations

from typing import Any

from agentpool.api import AgentServingPoolSpec
from agentpool.operator.names import (
    DIRECTORY,
    DIRECTORY_METRICS_PORT,
    DIRECTORY_PORT,
    ENGINE,
    ENGINE_PORT,
    REDIS,
    REDIS_PORT,
    ROUTER,
    PoolRef,
)

POLICY_COMPONENTS = (ENGINE, DIRECTORY, REDIS)
"""The components that get a NetworkPolicy, named `<pool>-<component>`."""


def _pods(pool: PoolRef, component: str) -> dict[str, Any]:
    """A peer: the pool's pods of one component, in the pool's namespace."""
    return {"podSelector": {"matchLabels": pool.selector(component)}}


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def _metrics_rule(spec: AgentServingPoolSpec, port: int) -> list[dict[str, Any]]:
    """The rule admitting the metrics sources on `port`; none when only the pool may reach it. A
    rule without `from` admits every source, so an empty list must give no rule at all."""
    peers = spec.network.metrics_from
    if peers is None:
        return [{"ports": _tcp(port)}]
    if not peers:
        return []
    return [{"from": [dict(p) for p in peers], "ports": _tcp(port)}]


def _policy(pool: PoolRef, component: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    spec = {
        "podSelector": {"matchLabels": pool.selector(component)},
        "policyTypes": ["Ingress"],
        "ingress": ingress,
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": pool.metadata(pool.child(component), component),
        "spec": spec,
    }


def engine_network_policy(pool: PoolRef, spec: AgentServingPoolSpec) -> dict[str, Any]:
    return _policy(
        pool,
        ENGINE,
        [
            {"from": [_pods(pool, ENGINE)]},  # every port: UCX listens on ephemeral ones
            {"from": [_pods(pool, ROUTER)], "ports": _tcp(ENGINE_PORT)},
            *_metrics_rule(spec, ENGINE_PORT),
        ],
    )


def directory_network_policy(pool: PoolRef, spec: AgentServingPoolSpec) -> dict[str, Any]:
    return _policy(
        pool,
        DIRECTORY,
        [
            {
                "from": [_pods(pool, ROUTER), _pods(pool, ENGINE)],
                "ports": _tcp(DIRECTORY_PORT),
            },
            *_metrics_rule(spec, DIRECTORY_METRICS_PORT),
        ],
    )


def redis_network_policy(pool: PoolRef) -> dict[str, Any]:
    return _policy(pool, REDIS, [{"from": [_pods(pool, DIRECTORY)], "ports": _tcp(REDIS_PORT)}])


def network_policies(pool: PoolRef, spec: AgentServingPoolSpec) -> list[dict[str, Any]]:
    """The pool's NetworkPolicies; none when `spec.network.policy` is false."""
    if not spec.network.policy:
        return []
    out = [engine_network_policy(pool, spec), directory_network_policy(pool, spec)]
    if spec.redis.managed is not None:
        out.append(redis_network_policy(pool))
    return out


def policy_names(pool: PoolRef) -> list[str]:
    """Every NetworkPolicy name a pool may have (to delete them after an opt-out)."""
    return [pool.child(c) for c in POLICY_COMPONENTS]
