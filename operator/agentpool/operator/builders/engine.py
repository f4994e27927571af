"""The engine StatefulSet (one pod per node) and its headless Service (pure).

- Desired role: the pod annotation `agentpool.io/role`, which the planner writes. The engine reads
  it through the API (its account may get/watch its own pod by name) or from the downward-API file
  `/etc/agentpool/podinfo/role`, which the kubelet refreshes when the annotation changes. The pod
  template never carries the annotation, so a reconcile cannot revert the planner.
- Host KV pool: `/dev/shm` is a memory-backed emptyDir of `hostKvSize`, and unless the spec sets
  `limits.memory` the container requests and is limited to `hostKvSize` plus the backend's overhead.
- GPUs: `nvidia.com/gpu` = `gpusPerNode` in requests and limits; the `sim` backend asks for none.
- Engine settings: the engines' ConfigMap is read at start; the pod template's
  `agentpool.io/engine-settings` digest of it makes a change roll the StatefulSet, one pod at a time,
  each engine draining on SIGTERM (its running requests finish, its queue goes back to the router).
- Tokens, each a Secret mounted as a file: the report token (to the routers), the directory token,
  and the engine token that this engine's API and lease channel require and that it sends to its
  peers (the routers have it too).
"""

from __future__ import annotations

from typing import Any

from agentpool.api import AgentServingPoolSpec
from agentpool.operator.builders.config import engine_settings_digest
from agentpool.operator.builders.pods import (
    config_mount,
    http_probe,
    mount,
    secret_file_volume,
    service,
)
from agentpool.operator.builders.secrets import directory_token, engine_token, report_token
from agentpool.operator.builders.settings import (
    CONFIG_DIR,
    DIRECTORY_TOKEN_DIR,
    ENGINE_MEMORY_OVERHEAD,
    ENGINE_TOKEN_DIR,
    PODINFO_DIR,
    REPORT_TOKEN_DIR,
    ROLE_FILE,
)
from agentpool.operator.builders.sglang import BOOTSTRAP_PORT, STARTUP_PROBE_FAILURES, STARTUP_PROBE_PERIOD_S
from agentpool.operator.builders.tls import client_tls
from agentpool.operator.names import (
    ENGINE,
    ENGINE_PORT,
    ENGINE_SETTINGS_ANNOTATION,
    ROLE_ANNOTATION,
    PoolRef,
)
from agentpool.operator.quantity import mebibytes

GPU_RESOURCE = "nvidia.com/gpu"
DRAIN_GRACE_S = 300
"""Seconds a terminating engine gets to finish its running requests (its queue goes back to the
router at once)."""
DRAIN_TIMEOUT_S = DRAIN_GRACE_S - 30
"""The engine's own limit on that drain (``--drain-timeout-s``): it then stops by itself, in time
to close its SGLang server and connections before the kubelet kills it."""


def engine_memory_bytes(spec: AgentServingPoolSpec) -> int:
    """Memory an engine gets when the spec does not say: its host KV pool plus the overhead."""
    return spec.engine.host_kv_bytes + ENGINE_MEMORY_OVERHEAD[spec.engine.backend]


def engine_resources(spec: AgentServingPoolSpec) -> dict[str, Any]:
    given = spec.engine.scheduling.resources
    requests: dict[str, Any] = {k: str(v) for k, v in (given.requests or {}).items()}
    limits: dict[str, Any] = {k: str(v) for k, v in (given.limits or {}).items()}
    if "memory" not in limits:
        memory = mebibytes(engine_memory_bytes(spec))
        limits["memory"] = memory
        requests.setdefault("memory", memory)
    if spec.engine.gpus_per_node > 0:
        requests[GPU_RESOURCE] = str(spec.engine.gpus_per_node)
        limits[GPU_RESOURCE] = str(spec.engine.gpus_per_node)
    return {"requests": requests, "limits": limits}


def _volumes(pool: PoolRef, spec: AgentServingPoolSpec) -> list[dict[str, Any]]:
    shm: dict[str, Any] = {"medium": "Memory"}
    if spec.engine.host_kv_bytes > 0:
        shm["sizeLimit"] = mebibytes(spec.engine.host_kv_bytes + 2**30)
    return [
        {"name": "config", "configMap": {"name": pool.engine_config_map}},
        {
            "name": "podinfo",
            "downwardAPI": {
                "items": [
                    {
                        "path": ROLE_FILE,
                        "fieldRef": {"fieldPath": f"metadata.annotations['{ROLE_ANNOTATION}']"},
                    }
                ]
            },
        },
        secret_file_volume("report-token", report_token(pool, spec)),
        secret_file_volume("directory-token", directory_token(pool, spec)),
        secret_file_volume("engine-token", engine_token(pool, spec)),
        *client_tls(spec, "directory").volumes,
        *client_tls(spec, "router").volumes,
        {"name": "dshm", "emptyDir": shm},
    ]


def engine_container(pool: PoolRef, spec: AgentServingPoolSpec) -> dict[str, Any]:
    sglang = spec.engine.backend == "sglang"
    startup_failures = STARTUP_PROBE_FAILURES if sglang else 60  # loading a model takes minutes
    ports = [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    if sglang:  # SGLang's disaggregation bootstrap: decode pods connect to it on the prefill pod
        ports.append({"name": "bootstrap", "containerPort": BOOTSTRAP_PORT, "protocol": "TCP"})
    return {
        "name": ENGINE,
        "image": spec.engine.image,
        # the engine image's interpreter (engine-image/Dockerfile: the SGLang image's python3); the
        # agent has no node-id flag: each pod reads its own file (Kubernetes expands $(POD_NAME))
        "command": [
            *("python3", "-m", "agentpool.engine", "--config", f"{CONFIG_DIR}/$(POD_NAME).json"),
            *("--drain-timeout-s", str(DRAIN_TIMEOUT_S)),
        ],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
        "ports": ports,
        "resources": engine_resources(spec),
        "startupProbe": http_probe(
            "/health", "http", period_s=STARTUP_PROBE_PERIOD_S, failures=startup_failures
        ),
        "readinessProbe": http_probe("/ready", "http", period_s=2),
        "livenessProbe": http_probe("/health", "http", period_s=10, failures=6),
        "volumeMounts": [
            config_mount(),
            mount("podinfo", PODINFO_DIR),
            mount("report-token", REPORT_TOKEN_DIR),
            mount("directory-token", DIRECTORY_TOKEN_DIR),
            mount("engine-token", ENGINE_TOKEN_DIR),
            *client_tls(spec, "directory").mounts,
            *client_tls(spec, "router").mounts,
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }


def engine_stateful_set(pool: PoolRef, spec: AgentServingPoolSpec) -> dict[str, Any]:
    scheduling = spec.engine.scheduling
    pod_spec: dict[str, Any] = {
        "serviceAccountName": pool.child(ENGINE),
        "terminationGracePeriodSeconds": DRAIN_GRACE_S,
        "containers": [engine_container(pool, spec)],
        "volumes": _volumes(pool, spec),
    }
    if scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        pod_spec["tolerations"] = [t.to_wire() for t in scheduling.tolerations]
    if scheduling.affinity is not None:
        pod_spec["affinity"] = scheduling.affinity
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": pool.metadata(pool.child(ENGINE), ENGINE),
        "spec": {
            "replicas": spec.nodes,
            "serviceName": pool.child(ENGINE),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": pool.selector(ENGINE)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {
                    "labels": pool.labels_for(ENGINE),
                    # a change rolls the engines, one at a time, each draining on SIGTERM
                    "annotations": {ENGINE_SETTINGS_ANNOTATION: engine_settings_digest(pool, spec)},
                },
                "spec": pod_spec,
            },
        },
    }


def engine_service(pool: PoolRef) -> dict[str, Any]:
    """Headless: every engine has a stable DNS name `<pod>.<pool>-engine.<ns>.svc`."""
    return service(pool, ENGINE, [("http", ENGINE_PORT)], headless=True)
