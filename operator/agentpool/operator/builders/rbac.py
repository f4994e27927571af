"""ServiceAccounts, Roles and RoleBindings of a pool, with the least privilege each part needs.

- `<pool>-engine` (engine pods): get/list/watch the pool's engine pods, by name (its own desired
  role and drain annotations), nothing else. The role an engine serves goes to the routers in its
  load reports; the planner reads it from the routers' work batches, so engines never write to
  the API.
- `<pool>-planner` (router pods; its token is mounted only into the planner container):
  get/list/watch pods, patch the pool's engine pods by name (the annotations `agentpool.io/role`
  and `agentpool.io/observed-role`), create Events, create ConfigMaps and get/patch its state
  ConfigMap, create Leases and get/update its Lease.
- `<pool>-directory` (directory pods), `<pool>-redis` (the managed Redis): nothing, no token
  mounted.

Only the planner patches pods, and only the pool's engine pods (`resourceNames`); the router
container beside the planner gets no API token at all.
"""

from __future__ import annotations

from typing import Any

from agentpool.api import AgentServingPoolSpec
from agentpool.operator.names import DIRECTORY, ENGINE, PLANNER, REDIS, PoolRef


def service_account(pool: PoolRef, component: str, automount: bool) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": pool.metadata(pool.child(component), component),
        "automountServiceAccountToken": automount,
    }


def _rule(api_group: str, resource: str, verbs: list[str], names: list[str] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"apiGroups": [api_group], "resources": [resource], "verbs": verbs}
    if names is not None:
        rule["resourceNames"] = names
    return rule


def engine_role(pool: PoolRef, spec: AgentServingPoolSpec) -> dict[str, Any]:
    pods = [pool.engine_pod(i) for i in range(spec.nodes)]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": pool.metadata(pool.child(ENGINE), ENGINE),
        # list/watch with fieldSelector metadata.name=<pod> are authorized against resourceNames
        "rules": [_rule("", "pods", ["get", "list", "watch"], pods)],
    }


def planner_role(pool: PoolRef, spec: AgentServingPoolSpec) -> dict[str, Any]:
    pods = [pool.engine_pod(i) for i in range(spec.nodes)]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": pool.metadata(pool.child(PLANNER), PLANNER),
        "rules": [
            _rule("", "pods", ["get", "list", "watch"]),
            _rule("", "pods", ["patch"], pods),
            _rule("", "events", ["create"]),
            _rule("events.k8s.io", "events", ["create"]),
            _rule("", "configmaps", ["create"]),
            _rule("", "configmaps", ["get", "patch"], [pool.planner_state]),
            _rule("coordination.k8s.io", "leases", ["create"]),
            _rule("coordination.k8s.io", "leases", ["get", "update"], [pool.planner_lease]),
        ],
    }


def role_binding(pool: PoolRef, component: str) -> dict[str, Any]:
    name = pool.child(component)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": pool.metadata(name, component),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": pool.namespace}],
    }


def rbac(pool: PoolRef, spec: AgentServingPoolSpec) -> list[dict[str, Any]]:
    out = [
        service_account(pool, ENGINE, automount=True),
        engine_role(pool, spec),
        role_binding(pool, ENGINE),
        service_account(pool, DIRECTORY, automount=False),
    ]
    if spec.redis.managed is not None:
        out.append(service_account(pool, REDIS, automount=False))
    # the router pods run under the planner's account; the token reaches only the planner container
    out += [
        service_account(pool, PLANNER, automount=False),
        planner_role(pool, spec),
        role_binding(pool, PLANNER),
    ]
    return out
