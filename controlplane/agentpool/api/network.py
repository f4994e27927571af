"""Who may reach a pool's engines and KV directory over the network (NetworkPolicies).

The engines' host KV pools are read by peers with NIXL over UCX, which authenticates nothing: a
host that reaches an engine's UCX endpoints (ephemeral ports) can read its registered memory.
By default the operator therefore gives every pool NetworkPolicies that admit, on the engines,
every port only from the pool's own engines, on the KV directory its gRPC port only from the
pool's routers and engines, and on a managed Redis its port only from the directory. They take
effect only where the cluster's network plugin enforces NetworkPolicy.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from agentpool.api.base import ApiModel


class NetworkSpec(ApiModel):
    """NetworkPolicies the operator makes for the pool (on by default)."""

    policy: bool = True
    """Make the pool's NetworkPolicies: engine pods take traffic on every port (NIXL/UCX, the lease
    channel, SGLang's bootstrap) only from the pool's engines, and on their HTTP port (token
    authenticated, and `/metrics`) from the pool's routers and from `metricsFrom`; the KV
    directory's gRPC port takes traffic only from the pool's routers and engines, its metrics port
    from `metricsFrom`; a managed Redis only from the directory. `false`: no policies (a network
    plugin without NetworkPolicy, or policies you manage yourself); the operator deletes the ones
    it made."""
    metrics_from: list[dict[str, Any]] | None = Field(default=None, max_length=32)
    """Who else may reach the engines' HTTP port and the directory's metrics port (Prometheus):
    Kubernetes `NetworkPolicyPeer` objects (`podSelector`, `namespaceSelector`, `ipBlock`), passed
    through unchanged (kube-apiserver validates them when the operator writes the policy). Left
    out: those two ports admit every source (the engine API needs the engine token there; the
    probes, `/metrics` and the read-only `/agentpool/v1/state` do not). `[]`: only the pool itself."""
