"""Engines found while the router runs: the engine registry and Kubernetes EndpointSlices.

- Registry: an engine whose (authenticated) load report carries its ``url`` is registered under its
  ``node_id`` with the role it reports; its reports are its heartbeat, and it is removed after
  ``discovery.registryTtl`` without one (or at once by ``DELETE /agentpool/v1/engines/{id}``).
- Kubernetes: with ``discovery.kubernetes`` set, the ready endpoints of the Service's EndpointSlices
  are listed every ``interval`` (the pod name is the node id); endpoints that disappear or turn
  not-ready are removed. Such a node gets requests once its first report says which role it serves.
  The router's service account needs ``list`` on ``endpointslices.discovery.k8s.io``.

Configured ``nodes`` stay as the config file says; each source adds and removes only its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from agentpool.errors import UpstreamError
from agentpool.router.config import KubernetesDiscoveryConfig, NodeConfig, RouterConfig
from agentpool.router.metrics import RouterMetrics
from agentpool.router.nodes import NodeTable
from agentpool.wire.engine import LoadReport
from agentpool.wire.urls import base_url

log = logging.getLogger(__name__)
REGISTRY = "registry"
KUBERNETES = "kubernetes"
SERVICE_LABEL = "kubernetes.io/service-name"


class DiscoveryError(UpstreamError):
    """The discovery source could not be read (the previous node list stays)."""


def engines_from_slices(slices: Iterable[Any], cfg: KubernetesDiscoveryConfig) -> list[NodeConfig]:
    """Ready endpoints of ``cfg.service``'s EndpointSlices (kubernetes client ``V1EndpointSlice``s)."""
    found: dict[str, NodeConfig] = {}
    for s in slices:
        labels = (s.metadata.labels if s.metadata is not None else None) or {}
        if labels.get(SERVICE_LABEL) != cfg.service:
            continue
        port = _port(s.ports or [], cfg.port)
        if port is None:
            continue
        for ep in s.endpoints or []:
            ready = ep.conditions is None or ep.conditions.ready is not False
            if not ready or not ep.addresses or ep.target_ref is None or not ep.target_ref.name:
                continue
            address = ep.addresses[0]
            name = ep.target_ref.name
            found[name] = NodeConfig(id=name, url=base_url(cfg.scheme, address, port))
    return sorted(found.values(), key=lambda n: n.id)


def _port(ports: Iterable[Any], wanted: str | int) -> int | None:
    for p in ports:
        if p.port is not None and (p.name == wanted or p.port == wanted):
            return int(p.port)
    return None


class EndpointSliceSource:
    """Lists a Service's EndpointSlices with the kubernetes client (in a worker thread)."""

    def __init__(self, cfg: KubernetesDiscoveryConfig) -> None:
        self.cfg = cfg
        self._api: Any = None

    def _list(self) -> list[NodeConfig]:
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config
        from kubernetes.client.exceptions import ApiException
        from kubernetes.config.config_exception import ConfigException
        from urllib3.exceptions import HTTPError

        try:
            if self._api is None:
                conf = k8s.Configuration()
                if self.cfg.kubeconfig is not None:
                    k8s_config.load_kube_config(config_file=self.cfg.kubeconfig, client_configuration=conf)  # type: ignore[no-untyped-call]
                else:
                    k8s_config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
                self._api = k8s.DiscoveryV1Api(k8s.ApiClient(conf))
            result = self._api.list_namespaced_endpoint_slice(
                self.cfg.namespace, label_selector=f"{SERVICE_LABEL}={self.cfg.service}", _request_timeout=10
            )
        except ApiException as e:
            where = f"{self.cfg.namespace}/{self.cfg.service}"
            raise DiscoveryError(f"EndpointSlices of {where}: HTTP {e.status} {e.reason}") from e
        except (ConfigException, HTTPError, OSError) as e:
            raise DiscoveryError(f"EndpointSlices of {self.cfg.namespace}/{self.cfg.service}: {e}") from e
        return engines_from_slices(result.items or [], self.cfg)

    async def engines(self) -> list[NodeConfig]:
        return await asyncio.to_thread(self._list)


class Discovery:
    """Keeps the node table's discovered nodes current; ``config`` gives the current router config."""

    def __init__(
        self,
        nodes: NodeTable,
        config: Callable[[], RouterConfig],
        metrics: RouterMetrics,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = 1.0,
    ) -> None:
        self.nodes = nodes
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.tick_s = tick_s
        self._kube: EndpointSliceSource | None = None
        self._kube_due = 0.0
        self._task: asyncio.Task[None] | None = None

    # -- the registry ------------------------------------------------------------------------
    def register(self, report: LoadReport) -> bool:
        """Register the unknown engine of ``report`` (when it gives its URL and the registry is on)."""
        if report.url is None or not self.config().discovery.registry:
            return False
        cfg = NodeConfig(id=report.node_id, url=report.url, role=report.role)
        if not self.nodes.register(cfg, REGISTRY, self.clock()):
            return False
        log.info("engine %s registered at %s (%s)", report.node_id, report.url, report.role.value)
        self.metrics.discovered.labels(REGISTRY, "added").inc()
        return True

    def deregister(self, node_id: str) -> bool:
        removed = self.nodes.remove(node_id, REGISTRY)
        if removed:
            log.info("engine %s deregistered", node_id)
            self.metrics.discovered.labels(REGISTRY, "removed").inc()
        return removed

    # -- the loop ----------------------------------------------------------------------------
    async def tick(self) -> None:
        cfg = self.config().discovery
        now = self.clock()
        for node in self.nodes.expire(REGISTRY, now, cfg.registry_ttl_s):
            log.warning("engine %s sent no report for %g s: removed", node, cfg.registry_ttl_s)
            self.metrics.discovered.labels(REGISTRY, "removed").inc()
        if cfg.kubernetes is None:
            if self._kube is not None:
                self._kube = None
                self.nodes.sync(KUBERNETES, [], now)
            return
        if self._kube is None or self._kube.cfg != cfg.kubernetes:
            self._kube, self._kube_due = EndpointSliceSource(cfg.kubernetes), now
        if now < self._kube_due:
            return
        self._kube_due = now + cfg.kubernetes.interval_s
        try:
            engines = await self._kube.engines()
        except DiscoveryError as e:
            self.metrics.discovered.labels(KUBERNETES, "error").inc()
            log.warning("engine discovery failed, keeping the nodes found before: %s", e)
            return
        added, removed = self.nodes.sync(KUBERNETES, engines, self.clock())
        for node in added:
            log.info("engine %s found in the EndpointSlices (waits for its first report)", node)
        for node in removed:
            log.info("engine %s left the EndpointSlices: removed", node)
        self.metrics.discovered.labels(KUBERNETES, "added").inc(len(added))
        self.metrics.discovered.labels(KUBERNETES, "removed").inc(len(removed))

    async def _run(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(self.tick_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="router-discovery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
