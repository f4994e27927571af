"""The pool's ConfigMaps: the router's and planner's settings (re-read by them live), and the
engines' (one file per node).

SLO and policy edits change only this ConfigMap (never a pod template), so no pod restarts: the
router re-reads `router.json` when it changes, the planner re-reads `planner.json` every few
seconds. The annotation `agentpool.io/generation` records the pool generation the data is for,
and both files carry it too (`generation`): the router and planner report the one they loaded
(the router in its work batches, the planner in its state ConfigMap), which the status shows.
No credential is written here: tokens and passwords stay in Secrets, mounted as files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from agentpool.api import AgentServingPoolSpec, AgentServingPoolStatus
from agentpool.operator.builders.settings import (
    DIRECTORY_TOKEN_DIR,
    ENGINE_TOKEN_DIR,
    PLANNER_CONFIG_KEY,
    PODINFO_DIR,
    REPORT_TOKEN_DIR,
    ROLE_FILE,
    ROUTER_CONFIG_KEY,
    TOKEN_FILE,
)
from agentpool.operator.builders.sglang import sglang_settings
from agentpool.operator.builders.tls import client_config, client_tls, router_scheme
from agentpool.operator.names import (
    DIRECTORY,
    DIRECTORY_PORT,
    ENGINE,
    ENGINE_PORT,
    GENERATION_ANNOTATION,
    ROUTER,
    ROUTER_PORT,
    PoolRef,
)
from agentpool.planner.from_spec import planner_config
from agentpool.planner.settings_file import GENERATION_KEY
from agentpool.router.config import NodeConfig, config_from_settings, render_config
from agentpool.router.policy import Role


def initial_role(spec: AgentServingPoolSpec, ordinal: int) -> str:
    """The role a node starts with: the first `initialSplit.prefill` nodes prefill, the rest
    decode; every node `both` in a colocated pool."""
    if spec.mode == "colocated":
        return "both"
    return "prefill" if ordinal < spec.initial_prefill else "decode"


def role_for_pod(
    spec: AgentServingPoolSpec, ordinal: int, name: str, previous: AgentServingPoolStatus | None
) -> str:
    """The desired role of engine pod `name` when it has none: the one the status last showed for it
    (a pod replaced by a rolling update or deleted by hand comes back with the role the planner had
    given it, so the split it chose survives the restart), else its initial role."""
    if previous is not None:
        last = next((n.desired_role for n in previous.nodes if n.name == name), None)
        if last is not None and (last == "both") == (spec.mode == "colocated"):
            return str(last)
    return initial_role(spec, ordinal)


def router_config(pool: PoolRef, spec: AgentServingPoolSpec, generation: int) -> str:
    nodes = [
        NodeConfig(id=pool.engine_pod(i), url=pool.engine_url(i), role=Role(initial_role(spec, i)))
        for i in range(spec.nodes)
    ]
    config = config_from_settings(
        spec.router.settings(),
        spec.slo.ttft_slo(),
        tpot_s=spec.slo.tpot_s,
        model=spec.model.client_name,
        nodes=nodes,
        page_size=spec.kv_pool.page_size,
        generation=generation,
        node_model=spec.model.iteration_coefficients(),
        context_length=spec.model.context_length,
    )
    return render_config(config)


def planner_settings(spec: AgentServingPoolSpec, generation: int) -> str | None:
    """The planner's settings file; None in a colocated pool (no planner runs there)."""
    if spec.mode != "disaggregated":
        return None
    values = {**dataclasses.asdict(planner_config(spec)), GENERATION_KEY: generation}
    return json.dumps(values, default=str, sort_keys=True)


ENGINE_CONFIG_LIMIT = 900_000
"""Bytes of engine configs one ConfigMap may hold (the API server's limit is 1 MiB)."""


def engine_config(pool: PoolRef, spec: AgentServingPoolSpec, ordinal: int) -> str:
    """The engine agent's settings file for node `ordinal` (`python -m agentpool.engine --config`,
    :class:`agentpool.engine.config.EngineConfig`): the agent has no node-id flag, so each node
    gets its own key, `<pod>.json`, which the pod selects with `$(POD_NAME)`."""
    return json.dumps(engine_settings(pool, spec, ordinal), sort_keys=True)


def engine_settings(pool: PoolRef, spec: AgentServingPoolSpec, ordinal: int) -> dict[str, Any]:
    """The values of :func:`engine_config`."""
    pod = pool.engine_pod(ordinal)
    values: dict[str, Any] = {
        "nodeId": pod,
        "host": "0.0.0.0",
        "port": ENGINE_PORT,
        "advertiseUrl": pool.engine_url(ordinal),  # what routers reach it at (the headless Service)
        "tokenFile": f"{ENGINE_TOKEN_DIR}/{TOKEN_FILE}",  # its API's and lease channel's token (a Secret)
        "backend": spec.engine.backend,
        "role": initial_role(spec, ordinal),
        "roleFile": f"{PODINFO_DIR}/{ROLE_FILE}",
        "kube": {"namespace": pool.namespace, "pod": pod},
        "routers": [
            {
                "url": f"{router_scheme(spec)}://{pool.service_host(ROUTER)}:{ROUTER_PORT}",
                "tokenFile": f"{REPORT_TOKEN_DIR}/{TOKEN_FILE}",
                **client_config(client_tls(spec, "router")),  # with routerTls: its CA, a client certificate
            }
        ],
        "directory": {
            "target": f"{pool.service_host(DIRECTORY)}:{DIRECTORY_PORT}",
            "tokenFile": f"{DIRECTORY_TOKEN_DIR}/{TOKEN_FILE}",
            **client_config(client_tls(spec, "directory")),  # TLS file paths (no key material)
        },
        "peerUrlTemplate": f"http://{{node}}.{pool.service_host(ENGINE)}:{ENGINE_PORT}",
        "pageSize": spec.kv_pool.page_size,
        "hostKvBytes": spec.engine.host_kv_bytes,
    }
    if spec.engine.backend == "sim":
        sim: dict[str, Any] = {}
        experts = spec.model.experts
        if experts is not None:
            sim |= {"expertsActive": experts.active, "expertsTotal": experts.total}
        if spec.model.context_length is not None:  # it refuses longer requests, as SGLang would
            sim["contextLength"] = spec.model.context_length
        if sim:
            values["sim"] = sim
    if spec.engine.backend == "sglang":
        values["sglang"] = sglang_settings(spec)  # the agent launches and drives SGLang
    return values


PER_NODE_ENGINE_KEYS = ("nodeId", "advertiseUrl", "role", "kube")
"""Keys of an engine's settings that differ from node to node (its name, URL and initial role)."""


def engine_settings_digest(pool: PoolRef, spec: AgentServingPoolSpec) -> str:
    """What every engine reads at start, less its per-node keys, as a short digest: the engine pod
    template carries it, so a change (SGLang's arguments, the context length, the host KV size...)
    rolls the engines, while a scale, which only adds or removes per-node files, does not."""
    common = {k: v for k, v in engine_settings(pool, spec, 0).items() if k not in PER_NODE_ENGINE_KEYS}
    return hashlib.sha256(json.dumps(common, sort_keys=True).encode()).hexdigest()[:16]


def engine_config_map(pool: PoolRef, spec: AgentServingPoolSpec) -> dict[str, Any]:
    """One key per engine node; kept apart from the router's and planner's ConfigMap so that an
    SLO edit does not touch it."""
    data = {f"{pool.engine_pod(i)}.json": engine_config(pool, spec, i) for i in range(spec.nodes)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": pool.metadata(pool.engine_config_map, ENGINE),
        "data": data,
    }


def config_map(pool: PoolRef, spec: AgentServingPoolSpec, generation: int) -> dict[str, Any]:
    data = {ROUTER_CONFIG_KEY: router_config(pool, spec, generation)}
    planner = planner_settings(spec, generation)
    if planner is not None:
        data[PLANNER_CONFIG_KEY] = planner
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": pool.metadata(pool.config_map, "config", {GENERATION_ANNOTATION: str(generation)}),
        "data": data,
    }
