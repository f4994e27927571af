"""Every child of a pool, in apply order, and the deeper checks the schema cannot make (pure)."""

from __future__ import annotations

from typing import Any

from agentpool.api import AgentServingPoolSpec
from agentpool.operator.builders.config import ENGINE_CONFIG_LIMIT, config_map, engine_config_map
from agentpool.operator.builders.control import (
    directory_deployment,
    directory_service,
    redis_service,
    redis_stateful_set,
    router_deployment,
    router_service,
)
from agentpool.operator.builders.engine import engine_service, engine_stateful_set
from agentpool.operator.builders.network import network_policies
from agentpool.operator.builders.rbac import rbac
from agentpool.operator.builders.settings import BuildSettings
from agentpool.operator.builders.sglang import launch_problem
from agentpool.operator.names import MAX_POOL_NAME, PoolRef
from agentpool.operator.quantity import quantity_value

MIN_HOST_KV_BYTES = 64 * 1024
"""The engine agent's default block size: its host pool must hold at least one block."""


class InvalidPoolError(ValueError):
    """The pool passes the schema but cannot be served as written (status `Degraded/InvalidSpec`)."""


def deep_problems(pool: PoolRef, spec: AgentServingPoolSpec) -> list[str]:
    """What the CRD's schema accepts but the pool cannot run with; empty when it can."""
    problems: list[str] = []
    if len(pool.name) > MAX_POOL_NAME:
        problems.append(
            f"metadata.name is {len(pool.name)} characters; at most {MAX_POOL_NAME} leave room for the "
            f"engine StatefulSet's pod names"
        )
    resources = spec.engine.scheduling.resources
    memory = (resources.limits or {}).get("memory")
    if memory is not None and quantity_value(memory) < spec.engine.host_kv_bytes:
        problems.append(
            f"spec.engine.scheduling.resources.limits.memory ({memory}) is smaller than "
            f"spec.engine.hostKvSize ({spec.engine.host_kv_size}): the host KV pool cannot fit"
        )
    if spec.engine.host_kv_bytes < MIN_HOST_KV_BYTES:
        problems.append(
            f"spec.engine.hostKvSize ({spec.engine.host_kv_size}) is below one KV block "
            f"({MIN_HOST_KV_BYTES} bytes): the engine agent needs a host pool"
        )
    launch = launch_problem(spec)
    if launch is not None:
        problems.append(launch)
    request = (resources.requests or {}).get("memory")
    if memory is not None and request is not None and quantity_value(request) > quantity_value(memory):
        problems.append(
            f"spec.engine.scheduling.resources.requests.memory ({request}) exceeds its limit ({memory})"
        )
    return problems


def children(
    pool: PoolRef, spec: AgentServingPoolSpec, generation: int, settings: BuildSettings
) -> list[dict[str, Any]]:
    """The manifests of every child but the generated Secrets; `InvalidPoolError` if the pool
    cannot be served."""
    problems = deep_problems(pool, spec)
    if problems:
        raise InvalidPoolError("; ".join(problems))
    out = rbac(pool, spec)
    out.append(config_map(pool, spec, generation))
    engines = engine_config_map(pool, spec)
    size = sum(len(k) + len(v) for k, v in engines["data"].items())
    if size > ENGINE_CONFIG_LIMIT:
        raise InvalidPoolError(
            f"{spec.nodes} engine configurations take {size} bytes, more than one ConfigMap holds; "
            f"use fewer nodes per pool (the engine agent takes its node id only from its config file)"
        )
    out.append(engines)
    out += network_policies(pool, spec)  # before the pods they protect
    if spec.redis.managed is not None:
        out += [redis_service(pool), redis_stateful_set(pool, spec)]
    out += [
        directory_service(pool),
        directory_deployment(pool, spec, settings),
        router_service(pool, spec),
        router_deployment(pool, spec, settings),
        engine_service(pool),
        engine_stateful_set(pool, spec),
    ]
    return out
