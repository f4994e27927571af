"""The pool's ConfigMap: the router's, planner's and engines' settings, re-read by them live.

SLO and policy edits change only this ConfigMap (never a pod template), so no pod restarts: the
router re-reads `router.json` when it changes, the planner re-reads `planner.json` every few
seconds. The annotation `agentpool.io/generation` records the pool generation the data is for.
No credential is written here: tokens and passwords stay in Secrets, mounted as files.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from agentpool.api import AgentServingPoolSpec
from agentpool.operator.builders.settings import (
    DIRECTORY_TOKEN_DIR,
    ENGINE_CONFIG_KEY,
    PLANNER_CONFIG_KEY,
    PODINFO_DIR,
    REPORT_TOKEN_DIR,
    ROLE_FILE,
    ROUTER_CONFIG_KEY,
    TOKEN_FILE,
)
from agentpool.operator.names import (
    DIRECTORY,
    DIRECTORY_PORT,
    ENGINE_PORT,
    GENERATION_ANNOTATION,
    ROUTER,
    ROUTER_PORT,
    PoolRef,
)
from agentpool.planner.from_spec import planner_config
from agentpool.router.config import NodeConfig, config_from_settings, render_config
from agentpool.router.policy import Role


def initial_role(spec: AgentServingPoolSpec, ordinal: int) -> str:
    """The role a node starts with: the first `initialSplit.prefill` nodes prefill, the rest
    decode; every node `both` in a colocated pool."""
    if spec.mode == "colocated":
        return "both"
    return "prefill" if ordinal < spec.initial_prefill else "decode"


def router_config(pool: PoolRef, spec: AgentServingPoolSpec) -> str:
    nodes = [
        NodeConfig(id=pool.engine_pod(i), url=pool.engine_url(i), role=Role(initial_role(spec, i)))
        for i in range(spec.nodes)
    ]
    config = config_from_settings(
        spec.router.settings(),
        spec.slo.ttft_slo(),
        model=spec.model.client_name,
        nodes=nodes,
        page_size=spec.kv_pool.page_size,
    )
    return render_config(config)


def planner_settings(spec: AgentServingPoolSpec) -> str | None:
    """The planner's settings file; None in a colocated pool (no planner runs there)."""
    if spec.mode != "disaggregated":
        return None
    values = dataclasses.asdict(planner_config(spec))
    return json.dumps(values, default=str, sort_keys=True)


def engine_config(pool: PoolRef, spec: AgentServingPoolSpec) -> str:
    """The engine agent's settings (`python -m agentpool.engine --config`); its own pod name and
    namespace come from the environment (`POD_NAME`, `POD_NAMESPACE`)."""
    values: dict[str, Any] = {
        "backend": spec.engine.backend,
        "model": spec.model.name,
        "servedModelName": spec.model.client_name,
        "port": ENGINE_PORT,
        "pageSize": spec.kv_pool.page_size,
        "hostKvBytes": spec.engine.host_kv_bytes,
        "transferBackend": spec.kv_pool.transfer_backend,
        "evictionPolicy": spec.kv_pool.eviction_policy,
        "backendArgs": list(spec.engine.args),
        "routers": [f"http://{pool.service_host(ROUTER)}:{ROUTER_PORT}"],
        "directory": f"{pool.service_host(DIRECTORY)}:{DIRECTORY_PORT}",
        "reportTokenFile": f"{REPORT_TOKEN_DIR}/{TOKEN_FILE}",
        "directoryTokenFile": f"{DIRECTORY_TOKEN_DIR}/{TOKEN_FILE}",
        "roleFile": f"{PODINFO_DIR}/{ROLE_FILE}",
    }
    if spec.model.context_length is not None:
        values["contextLength"] = spec.model.context_length
    return json.dumps(values, sort_keys=True)


def config_map(pool: PoolRef, spec: AgentServingPoolSpec, generation: int) -> dict[str, Any]:
    data = {ROUTER_CONFIG_KEY: router_config(pool, spec), ENGINE_CONFIG_KEY: engine_config(pool, spec)}
    planner = planner_settings(spec)
    if planner is not None:
        data[PLANNER_CONFIG_KEY] = planner
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": pool.metadata(pool.config_map, "config", {GENERATION_ANNOTATION: str(generation)}),
        "data": data,
    }
