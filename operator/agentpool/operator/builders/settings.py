"""What the operator itself decides about every pool: images, ports, paths (pure data)."""

from __future__ import annotations

from dataclasses import dataclass

CONFIG_DIR = "/etc/agentpool/config"
PODINFO_DIR = "/etc/agentpool/podinfo"
REPORT_TOKEN_DIR = "/var/run/agentpool/report"
DIRECTORY_TOKEN_DIR = "/var/run/agentpool/directory"
ENGINE_TOKEN_DIR = "/var/run/agentpool/engine"
REDIS_SECRET_DIR = "/var/run/agentpool/redis"
TOKEN_FILE = "token"
REDIS_PASSWORD_FILE = "password"
SA_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

ROUTER_CONFIG_KEY = "router.json"
PLANNER_CONFIG_KEY = "planner.json"
ROLE_FILE = "role"

ENGINE_MEMORY_OVERHEAD = {"sim": 1 * 2**30, "sglang": 16 * 2**30}
"""Memory an engine needs beside its host KV pool when the spec does not set `limits.memory`."""


@dataclass(frozen=True, slots=True)
class BuildSettings:
    """Operator-wide choices: the control-plane image runs the router, planner and directory."""

    control_plane_image: str = "ghcr.io/agentpool/agentpool:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    python: str = "python"
