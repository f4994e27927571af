"""Prometheus metrics of the router (``agentpool_router_*``), on a registry owned by the service."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from agentpool.router.policy import NodeState

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2)

W = TypeVar("W", bound=MetricWrapperBase)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            "agentpool_router_ttft_seconds",
            "Time to first token seen by the client",
            ["policy"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "agentpool_router_tpot_seconds",
            "Mean time per output token after the first, per request",
            ["policy"],
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "agentpool_router_e2e_seconds",
            "End-to-end request latency",
            ["policy"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.decision = Histogram(
            "agentpool_router_decision_seconds",
            "Time a policy takes to choose a node",
            ["policy"],
            buckets=_DECISION_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(
            "agentpool_router_decisions_total", "Routing decisions", ["policy", "node", "phase"], registry=r
        )
        self.prefix_tokens = Counter(
            "agentpool_router_prefix_tokens_total",
            "Prompt tokens of routed requests by where their KV was: local, remote (fetched), miss",
            ["kind"],
            registry=r,
        )
        self.retries = Counter(
            "agentpool_router_retries_total", "Re-dispatches of a request", ["reason"], registry=r
        )
        self.requests = Counter(
            "agentpool_router_requests_total", "Requests answered", ["endpoint", "code"], registry=r
        )
        self.directory_errors = Counter(
            "agentpool_router_directory_errors_total",
            "Directory calls that failed or timed out",
            ["call"],
            registry=r,
        )
        self.config_reloads = Counter(
            "agentpool_router_config_reloads_total", "Configuration reloads", ["result"], registry=r
        )
        self.config_generation = Gauge(
            "agentpool_router_config_generation",
            "Pool generation of the configuration in force (-1: the config names none)",
            registry=r,
        )
        self.rejected_reports = Counter(
            "agentpool_router_rejected_reports_total",
            "Engine load reports refused for a missing or wrong token",
            registry=r,
        )
        self.engine_failures = Counter(
            "agentpool_router_engine_failures_total",
            "Engine calls that failed, by whose fault: engine (marks it down) or request (does not)",
            ["cause"],
            registry=r,
        )
        self.discovered = Counter(
            "agentpool_router_discovered_engines_total",
            "Engines added or removed by discovery (registry, kubernetes), and failed discovery reads",
            ["source", "event"],
            registry=r,
        )
        self._children: dict[tuple[int, tuple[str, ...]], MetricWrapperBase] = {}

    def child(self, metric: W, *values: str) -> W:
        """``metric.labels(*values)``, memoized: the hot path skips prometheus' label checks and lock.

        As bounded as the label values themselves (prometheus keeps every child it made anyway).
        """
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return cast(W, found)


class QueueDepthCollector(Collector):
    """``agentpool_router_queue_depth_requests{node}``: read from the node table at scrape time.

    Prefill requests queued per node as the router's policies see them (reported plus sent but not
    yet reported), and ``..._running_decode_requests{node}`` for decode.
    """

    def __init__(self, snapshot: Callable[[], Sequence[NodeState]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily(
            "agentpool_router_queue_depth_requests",
            "Prefill requests queued per node, as the router sees it",
            labels=["node"],
        )
        decoding = GaugeMetricFamily(
            "agentpool_router_running_decode_requests",
            "Requests decoding per node, as the router sees it",
            labels=["node"],
        )
        for n in self._snapshot():
            queued.add_metric([n.node_id], n.queue.requests + n.unreported.requests)
            decoding.add_metric([n.node_id], n.running_decode)
        yield queued
        yield decoding
