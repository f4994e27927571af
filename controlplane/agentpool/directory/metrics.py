"""Prometheus metrics of the directory service (``agentpool_directory_*``), in a registry per server."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class DirectoryMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "agentpool_directory_events_total", "KV events applied, by kind", ["kind"], registry=r
        )
        self.blocks = Counter(
            "agentpool_directory_event_blocks_total", "Blocks named by applied KV events", registry=r
        )
        self.resyncs_requested = Counter(
            "agentpool_directory_resyncs_requested_total",
            "Resyncs requested from engines, by reason",
            ["reason"],
            registry=r,
        )
        self.resyncs = Counter("agentpool_directory_resyncs_total", "Node resyncs applied", registry=r)
        self.requests = Counter(
            "agentpool_directory_requests_total",
            "RPCs answered, by method and code",
            ["method", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "agentpool_directory_request_duration_seconds",
            "RPC handling time, by method",
            ["method"],
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0),
            registry=r,
        )
        self.store_writes = Counter(
            "agentpool_directory_store_writes_total",
            "Store write round trips, by outcome",
            ["outcome"],
            registry=r,
        )
        self.store_up = Gauge("agentpool_directory_store_up", "1 when the store (Redis) answers", registry=r)
        self.nodes = Gauge("agentpool_directory_nodes", "Registered nodes", registry=r)
        self.branches = Gauge("agentpool_directory_branches", "Active branches", registry=r)
        self.index_blocks = Gauge(
            "agentpool_directory_index_blocks", "Blocks in the prefix index", registry=r
        )
        self.expired_branches = Counter(
            "agentpool_directory_expired_branches_total", "Branches ended for idleness", registry=r
        )
        self.dropped_nodes = Counter(
            "agentpool_directory_dropped_nodes_total", "Nodes purged, by reason", ["reason"], registry=r
        )
        self.watchers = Gauge("agentpool_directory_count_watchers", "Open count-update streams", registry=r)

        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def observe(self, method: str, code: str, seconds: float) -> None:
        """One RPC answered: its latency and its count by code (label children looked up once)."""
        pair = self._children.get((method, code))
        if pair is None:
            pair = self._children[(method, code)] = (
                self.latency.labels(method),
                self.requests.labels(method, code),
            )
        pair[0].observe(seconds)
        pair[1].inc()
