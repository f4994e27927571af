"""The control plane of a pool: directory, router with the planner beside it, managed Redis (pure).

- Directory: a Deployment (one replica; its state lives in Redis) and a Service. Its settings are
  command-line flags (no secrets among them): a page-size change restarts it, as it must.
- Router: a Deployment and a Service. The planner runs in the same pod, behind a Lease
  (`python -m agentpool.operator.lease`), so that one planner acts even while a rollout runs two
  router pods. The pod's account is the planner's, but its API token is projected only into the
  planner container: the router container holds no API credential.
- Redis: a StatefulSet and a Service unless the spec names an existing Redis; its password comes
  from the generated Secret's `redis.conf`, never from its command line.
- Directory TLS (`spec.auth.directoryTls`): certificate files mounted from the named Secrets, their
  paths in the flags (`builders.tls`).
"""

from __future__ import annotations

from typing import Any

from agentpool.api import AgentServingPoolSpec
from agentpool.operator.builders.pods import (
    RESTRICTED_SECURITY_CONTEXT,
    config_mount,
    config_volume,
    http_probe,
    mount,
    secret_file_volume,
    service,
    tcp_probe,
)
from agentpool.operator.builders.secrets import (
    REDIS_CONF_KEY,
    directory_token,
    engine_token,
    redis_password,
    report_token,
)
from agentpool.operator.builders.settings import (
    CONFIG_DIR,
    DIRECTORY_TOKEN_DIR,
    ENGINE_TOKEN_DIR,
    PLANNER_CONFIG_KEY,
    REDIS_PASSWORD_FILE,
    REDIS_SECRET_DIR,
    REPORT_TOKEN_DIR,
    ROUTER_CONFIG_KEY,
    SA_TOKEN_DIR,
    TOKEN_FILE,
    BuildSettings,
)
from agentpool.operator.builders.tls import client_args, client_tls, router_scheme, server_args, server_tls
from agentpool.operator.names import (
    DIRECTORY,
    DIRECTORY_METRICS_PORT,
    DIRECTORY_PORT,
    ENGINE,
    PLANNER,
    PLANNER_METRICS_PORT,
    REDIS,
    REDIS_PORT,
    ROUTER,
    ROUTER_PORT,
    PoolRef,
)

NON_ROOT_UID = 65532
MAX_NODES = 4096
"""`spec.nodes` at most (agentpool.api); the directory's own default is lower."""
REDIS_UID = 999


def _pod_security(uid: int) -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid}


def _deployment(pool: PoolRef, component: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": pool.metadata(pool.child(component), component),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": pool.selector(component)},
            "template": {"metadata": {"labels": pool.labels_for(component)}, "spec": pod_spec},
        },
    }


def redis_url(pool: PoolRef) -> str:
    return f"redis://{pool.service_host(REDIS)}:{REDIS_PORT}/0"


# ---------------------------------------------------------------- directory


def directory_deployment(
    pool: PoolRef, spec: AgentServingPoolSpec, settings: BuildSettings
) -> dict[str, Any]:
    args = [
        "--host=0.0.0.0",
        f"--port={DIRECTORY_PORT}",
        f"--namespace=agentpool:{pool.namespace}:{pool.name}",
        f"--page-size={spec.kv_pool.page_size}",
        f"--max-nodes={MAX_NODES}",  # the spec's bound, so a scale never restarts the directory
        f"--auth-token-file={DIRECTORY_TOKEN_DIR}/{TOKEN_FILE}",
        f"--metrics-port={DIRECTORY_METRICS_PORT}",
    ]
    env: list[dict[str, Any]] = []
    volumes = [secret_file_volume("directory-token", directory_token(pool, spec))]
    mounts = [mount("directory-token", DIRECTORY_TOKEN_DIR)]
    tls = server_tls(spec, "directory")
    volumes += tls.volumes
    mounts += tls.mounts
    args += server_args(tls)
    existing = spec.redis.existing
    if existing is None:
        args.append(f"--redis-url={redis_url(pool)}")
    else:  # the URL comes from the named Secret through the environment, not from the spec
        env.append(
            {
                "name": "AGENTPOOL_REDIS_URL",
                "valueFrom": {"secretKeyRef": {"name": existing.secret_name, "key": existing.url_key}},
            }
        )
        args.append("--redis-url=$(AGENTPOOL_REDIS_URL)")
    password = redis_password(pool, spec)
    if password is not None:
        volumes.append(secret_file_volume("redis-password", password, REDIS_PASSWORD_FILE))
        mounts.append(mount("redis-password", REDIS_SECRET_DIR))
        args.append(f"--redis-password-file={REDIS_SECRET_DIR}/{REDIS_PASSWORD_FILE}")
    container: dict[str, Any] = {
        "name": DIRECTORY,
        "image": settings.control_plane_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": [settings.python, "-m", "agentpool.directory"],
        "args": args,
        "ports": [
            {"name": "grpc", "containerPort": DIRECTORY_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": DIRECTORY_METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": tcp_probe("grpc"),
        "livenessProbe": tcp_probe("grpc", period_s=10),
        "securityContext": RESTRICTED_SECURITY_CONTEXT,
        "volumeMounts": mounts,
    }
    if env:
        container["env"] = env
    pod_spec = {
        "serviceAccountName": pool.child(DIRECTORY),
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(NON_ROOT_UID),
        "containers": [container],
        "volumes": volumes,
    }
    return _deployment(pool, DIRECTORY, pod_spec)


def directory_service(pool: PoolRef) -> dict[str, Any]:
    return service(pool, DIRECTORY, [("grpc", DIRECTORY_PORT), ("metrics", DIRECTORY_METRICS_PORT)])


# ---------------------------------------------------------------- router and planner


def _api_token_volume() -> dict[str, Any]:
    """The account's API token, CA and namespace, as automounting would give them, for one container."""
    return {
        "name": "planner-api",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                    }
                },
            ]
        },
    }


def planner_command(pool: PoolRef, spec: AgentServingPoolSpec, settings: BuildSettings) -> list[str]:
    experts = spec.model.experts
    planner = [
        settings.python, "-m", "agentpool.planner",
        f"--namespace={pool.namespace}",
        f"--pool={pool.name}",
        f"--pool-uid={pool.uid}",
        f"--selector={pool.selector_text(ENGINE)}",
        f"--router-selector={pool.selector_text(ROUTER)}",  # every router replica, found by label
        f"--router-port={ROUTER_PORT}",
        f"--router-token-file={REPORT_TOKEN_DIR}/{TOKEN_FILE}",  # the routers' token for fitted models
        f"--directory={pool.service_host(DIRECTORY)}:{DIRECTORY_PORT}",
        f"--directory-token-file={DIRECTORY_TOKEN_DIR}/{TOKEN_FILE}",
        *client_args(client_tls(spec, "directory"), "directory"),
        *_planner_router_tls_args(pool, spec),
        "--in-cluster",
        f"--settings={CONFIG_DIR}/{PLANNER_CONFIG_KEY}",
        f"--state-configmap={pool.planner_state}",
        f"--metrics-port={PLANNER_METRICS_PORT}",
    ]  # fmt: skip
    if experts is not None:
        planner += [f"--experts-active={experts.active}", f"--experts-total={experts.total}"]
    lease = [
        settings.python, "-m", "agentpool.operator.lease",
        f"--namespace={pool.namespace}",
        f"--name={pool.planner_lease}",
        "--identity=$(POD_NAME)",
        "--",
    ]  # fmt: skip
    return lease + planner


def _planner_router_tls_args(pool: PoolRef, spec: AgentServingPoolSpec) -> list[str]:
    """With `routerTls`: the planner reaches the router pods over HTTPS at their IPs, checking the
    certificate against the router Service's name, and presents the client certificate where
    there is one."""
    files = client_tls(spec, "router")
    if not files.paths:
        return []
    return [
        f"--router-scheme={router_scheme(spec)}",
        f"--router-server-name={pool.service_host(ROUTER)}",
        *client_args(files, "router"),
    ]


def router_deployment(pool: PoolRef, spec: AgentServingPoolSpec, settings: BuildSettings) -> dict[str, Any]:
    tls = client_tls(spec, "directory")
    serving = server_tls(spec, "router")  # its own certificate, with routerTls
    scheme = router_scheme(spec)
    router: dict[str, Any] = {
        "name": ROUTER,
        "image": settings.control_plane_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": [settings.python, "-m", "agentpool.router"],
        "args": [
            f"--config={CONFIG_DIR}/{ROUTER_CONFIG_KEY}",
            "--host=0.0.0.0",
            f"--port={ROUTER_PORT}",
            f"--directory={pool.service_host(DIRECTORY)}:{DIRECTORY_PORT}",
            f"--directory-token-file={DIRECTORY_TOKEN_DIR}/{TOKEN_FILE}",
            f"--report-token-file={REPORT_TOKEN_DIR}/{TOKEN_FILE}",
            f"--engine-token-file={ENGINE_TOKEN_DIR}/{TOKEN_FILE}",
            *client_args(tls, "directory"),
            *server_args(serving),
        ],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "readinessProbe": http_probe("/ready", "http", scheme=scheme),
        "livenessProbe": http_probe("/health", "http", period_s=10, scheme=scheme),
        "securityContext": RESTRICTED_SECURITY_CONTEXT,
        "volumeMounts": [
            config_mount(),
            mount("directory-token", DIRECTORY_TOKEN_DIR),
            mount("report-token", REPORT_TOKEN_DIR),
            mount("engine-token", ENGINE_TOKEN_DIR),
            *tls.mounts,
            *serving.mounts,
        ],
    }
    containers = [router]
    config_keys = [ROUTER_CONFIG_KEY]
    volumes = [
        secret_file_volume("directory-token", directory_token(pool, spec)),
        secret_file_volume("report-token", report_token(pool, spec)),
        secret_file_volume("engine-token", engine_token(pool, spec)),
        *tls.volumes,
        *serving.volumes,
    ]
    if spec.mode == "disaggregated":
        to_router = client_tls(spec, "router")  # the planner reaches the routers as a client
        config_keys.append(PLANNER_CONFIG_KEY)
        volumes += [_api_token_volume(), *to_router.volumes]
        containers.append(
            {
                "name": PLANNER,
                "image": settings.control_plane_image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": planner_command(pool, spec, settings),
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "ports": [
                    {"name": "planner-metrics", "containerPort": PLANNER_METRICS_PORT, "protocol": "TCP"}
                ],
                "securityContext": RESTRICTED_SECURITY_CONTEXT,
                "volumeMounts": [
                    config_mount(),
                    mount("planner-api", SA_TOKEN_DIR),
                    mount("directory-token", DIRECTORY_TOKEN_DIR),
                    mount("report-token", REPORT_TOKEN_DIR),
                    *tls.mounts,
                    *to_router.mounts,
                ],
            }
        )
    volumes.append(config_volume(pool, config_keys))
    pod_spec = {
        "serviceAccountName": pool.child(PLANNER),
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(NON_ROOT_UID),
        "containers": containers,
        "volumes": volumes,
    }
    return _deployment(pool, ROUTER, pod_spec)


def router_service(pool: PoolRef, spec: AgentServingPoolSpec) -> dict[str, Any]:
    """The router's HTTP port (and its /metrics), and the planner's metrics where one runs."""
    ports = [("http", ROUTER_PORT)]
    if spec.mode == "disaggregated":
        ports.append(("planner-metrics", PLANNER_METRICS_PORT))
    return service(pool, ROUTER, ports)


# ---------------------------------------------------------------- managed Redis


def redis_stateful_set(pool: PoolRef, spec: AgentServingPoolSpec) -> dict[str, Any]:
    managed = spec.redis.managed
    if managed is None:
        raise ValueError("the pool names an existing Redis; there is no managed one to build")
    container = {
        "name": REDIS,
        "image": managed.image,
        "command": ["redis-server", "/etc/redis/redis.conf"],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "readinessProbe": tcp_probe("redis"),
        "livenessProbe": tcp_probe("redis", period_s=10),
        "securityContext": RESTRICTED_SECURITY_CONTEXT,
        "volumeMounts": [mount("redis-conf", "/etc/redis"), {"name": "data", "mountPath": "/data"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": pool.metadata(pool.child(REDIS), REDIS),
        "spec": {
            "replicas": 1,
            "serviceName": pool.child(REDIS),
            "selector": {"matchLabels": pool.selector(REDIS)},
            "template": {
                "metadata": {"labels": pool.labels_for(REDIS)},
                "spec": {
                    "serviceAccountName": pool.child(REDIS),
                    "automountServiceAccountToken": False,
                    "securityContext": _pod_security(REDIS_UID),
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "redis-conf",
                            "secret": {
                                "secretName": pool.redis_secret,
                                "items": [{"key": REDIS_CONF_KEY, "path": "redis.conf"}],
                                "defaultMode": 0o440,
                            },
                        },
                        {"name": "data", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def redis_service(pool: PoolRef) -> dict[str, Any]:
    return service(pool, REDIS, [("redis", REDIS_PORT)])
