"""Small pieces shared by the pod templates: secret files, the config volume, probes (pure)."""

from __future__ import annotations

from typing import Any

from agentpool.api import SecretKeySelector
from agentpool.operator.builders.settings import CONFIG_DIR, TOKEN_FILE
from agentpool.operator.names import PoolRef


def secret_file_volume(volume: str, ref: SecretKeySelector, path: str = TOKEN_FILE) -> dict[str, Any]:
    """A volume with one file, `path`, holding `ref`'s value (mode 0400)."""
    return {
        "name": volume,
        "secret": {"secretName": ref.name, "items": [{"key": ref.key, "path": path}], "defaultMode": 0o400},
    }


def config_volume(pool: PoolRef, keys: list[str]) -> dict[str, Any]:
    return {
        "name": "config",
        "configMap": {"name": pool.config_map, "items": [{"key": k, "path": k} for k in keys]},
    }


def mount(volume: str, path: str) -> dict[str, Any]:
    return {"name": volume, "mountPath": path, "readOnly": True}


def config_mount() -> dict[str, Any]:
    return mount("config", CONFIG_DIR)


def http_probe(
    path: str, port: str, period_s: int = 5, failures: int = 3, scheme: str = "http"
) -> dict[str, Any]:
    """An HTTP(S) GET probe (the kubelet does not verify an HTTPS server's certificate)."""
    return {
        "httpGet": {"path": path, "port": port, "scheme": scheme.upper()},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }


def tcp_probe(port: str, period_s: int = 5) -> dict[str, Any]:
    return {
        "tcpSocket": {"port": port},
        "periodSeconds": period_s,
        "failureThreshold": 3,
        "timeoutSeconds": 2,
    }


RESTRICTED_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def service(
    pool: PoolRef, component: str, ports: list[tuple[str, int]], headless: bool = False
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": pool.selector(component),
        "ports": [
            {"name": name, "port": port, "targetPort": name, "protocol": "TCP"} for name, port in ports
        ],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = True
    else:
        spec["type"] = "ClusterIP"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pool.metadata(pool.child(component), component),
        "spec": spec,
    }
