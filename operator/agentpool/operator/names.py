"""Names, labels and owner references of everything the operator makes for a pool (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentpool.api import API_VERSION, KIND

POOL_LABEL = "agentpool.io/pool"
COMPONENT_LABEL = "app.kubernetes.io/component"
ROLE_ANNOTATION = "agentpool.io/role"
"""Desired role of an engine pod; the operator sets it once (initial split), the planner after."""
OBSERVED_ROLE_ANNOTATION = "agentpool.io/observed-role"
GENERATION_ANNOTATION = "agentpool.io/generation"
"""On the ConfigMap: the pool generation whose settings it holds."""
DRAIN_ANNOTATION = "agentpool.io/drain"
"""On an engine pod: `true` asks the engine to stop admitting work and finish what it has."""
ENGINE_SETTINGS_ANNOTATION = "agentpool.io/engine-settings"
"""On the engine pod template: a digest of the settings every engine reads at start, so that a
change to them rolls the engines (a scale or an SLO edit leaves it as it is)."""
MANAGED_BY = "agentpool-operator"

ENGINE = "engine"
ROUTER = "router"
DIRECTORY = "directory"
REDIS = "redis"
PLANNER = "planner"

# Service ports.
ENGINE_PORT = 8080
ROUTER_PORT = 8000
DIRECTORY_PORT = 50061
DIRECTORY_METRICS_PORT = 9090
PLANNER_METRICS_PORT = 9091
REDIS_PORT = 6379

MAX_POOL_NAME = 45
"""`<pool>-engine` names a StatefulSet whose pods carry a 63-character revision label: at most 52."""


@dataclass(frozen=True, slots=True)
class PoolRef:
    """The identity of one `AgentServingPool` object (from its metadata)."""

    name: str
    namespace: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def child(self, component: str) -> str:
        return f"{self.name}-{component}"

    @property
    def config_map(self) -> str:
        return f"{self.name}-config"

    @property
    def engine_config_map(self) -> str:
        return f"{self.name}-engines"

    @property
    def auth_secret(self) -> str:
        return f"{self.name}-auth"

    @property
    def redis_secret(self) -> str:
        return f"{self.name}-redis"

    @property
    def planner_lease(self) -> str:
        return f"{self.name}-planner"

    @property
    def planner_state(self) -> str:
        return f"{self.name}-planner-state"

    def engine_pod(self, ordinal: int) -> str:
        return f"{self.child(ENGINE)}-{ordinal}"

    def service_host(self, component: str) -> str:
        return f"{self.child(component)}.{self.namespace}.svc"

    def engine_url(self, ordinal: int) -> str:
        return f"http://{self.engine_pod(ordinal)}.{self.service_host(ENGINE)}:{ENGINE_PORT}"

    def selector(self, component: str) -> dict[str, str]:
        """Labels that select a component's pods (stable: never includes user labels)."""
        return {POOL_LABEL: self.name, COMPONENT_LABEL: component}

    def selector_text(self, component: str) -> str:
        return ",".join(f"{k}={v}" for k, v in self.selector(component).items())

    def labels_for(self, component: str) -> dict[str, str]:
        """The pool's own labels, then the identifying ones (which win)."""
        own = {
            k: v for k, v in self.labels.items() if not k.startswith(("agentpool.io/", "app.kubernetes.io/"))
        }
        return {
            **own,
            "app.kubernetes.io/name": "agentpool",
            "app.kubernetes.io/instance": self.name,
            "app.kubernetes.io/managed-by": MANAGED_BY,
            **self.selector(component),
        }

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(
        self, name: str, component: str, annotations: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "labels": self.labels_for(component),
            "ownerReferences": [self.owner_reference()],
        }
        if annotations:
            meta["annotations"] = dict(annotations)
        return meta
