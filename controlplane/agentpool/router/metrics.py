"""Prometheus metrics of the router (``agentpool_router_*``), on a registry owned by the service.

The per-request ones (latencies, decisions, prefix tokens, answered requests) are :class:`LoopCounter`
and :class:`LoopHistogram`: plain floats updated on the event loop, turned into metric families only
when ``/metrics`` is scraped. prometheus_client's own classes take a lock and check the metric's
state on every update, and a request made about ten updates (bench/results/router_cpu.md, cut 5).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import cast, overload

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from agentpool.router.policy import NodeState

_go_float = cast(Callable[[float], str], floatToGoString)  # how prometheus_client writes a bucket bound

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2)


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters can only be incremented by non-negative amounts")
        self.value += amount


class _HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket (not cumulative); the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bucket with value <= bound
        self.sum += value


class LoopCounter:
    """A labelled counter for the event loop's thread (no lock), collected by :class:`LoopMetrics`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.children: dict[tuple[str, ...], _CounterChild] = {}

    def labels(self, *values: str) -> _CounterChild:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = _CounterChild()
        return child

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self.children.items()):
            family.add_metric(list(values), child.value)
        return family


class LoopHistogram:
    """A labelled histogram for the event loop's thread (no lock), collected by :class:`LoopMetrics`;
    buckets as prometheus_client's for the finite values it is given (a value lands in the first bucket
    whose bound is at least it; the router observes durations only, never NaN)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        self.children: dict[tuple[str, ...], _HistogramChild] = {}

    def labels(self, *values: str) -> _HistogramChild:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = _HistogramChild(self.bounds)
        return child

    def family(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        les = [_go_float(b) for b in self.bounds] + ["+Inf"]
        for values, child in list(self.children.items()):
            cumulative, buckets = 0, []
            for le, count in zip(les, list(child.counts), strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            family.add_metric(list(values), buckets, child.sum)
        return family


class LoopMetrics(Collector):
    """Collects the :class:`LoopCounter` and :class:`LoopHistogram` metrics at scrape time."""

    def __init__(self, metrics: Sequence[LoopCounter | LoopHistogram]) -> None:
        self.metrics = list(metrics)

    def collect(self) -> Iterator[Metric]:
        for m in self.metrics:
            yield m.family()


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.ttft = LoopHistogram(
            "agentpool_router_ttft_seconds",
            "Time to first token seen by the client",
            ["policy"],
            _LATENCY_BUCKETS,
        )
        self.tpot = LoopHistogram(
            "agentpool_router_tpot_seconds",
            "Mean time per output token after the first, per request",
            ["policy"],
            _TPOT_BUCKETS,
        )
        self.e2e = LoopHistogram(
            "agentpool_router_e2e_seconds", "End-to-end request latency", ["policy"], _LATENCY_BUCKETS
        )
        self.decision = LoopHistogram(
            "agentpool_router_decision_seconds",
            "Time a policy takes to choose a node",
            ["policy"],
            _DECISION_BUCKETS,
        )
        self.decisions = LoopCounter(
            "agentpool_router_decisions_total", "Routing decisions", ["policy", "node", "phase"]
        )
        self.prefix_tokens = LoopCounter(
            "agentpool_router_prefix_tokens_total",
            "Prompt tokens of routed requests by where their KV was: local, remote (fetched), miss",
            ["kind"],
        )
        self.requests = LoopCounter(
            "agentpool_router_requests_total", "Requests answered", ["endpoint", "code"]
        )
        per_request: list[LoopCounter | LoopHistogram] = [self.ttft, self.tpot, self.e2e, self.decision]
        r.register(LoopMetrics([*per_request, self.decisions, self.prefix_tokens, self.requests]))
        self.retries = Counter(
            "agentpool_router_retries_total", "Re-dispatches of a request", ["reason"], registry=r
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

    @overload
    def child(self, metric: LoopCounter, *values: str) -> _CounterChild: ...

    @overload
    def child(self, metric: LoopHistogram, *values: str) -> _HistogramChild: ...

    def child(self, metric: LoopCounter | LoopHistogram, *values: str) -> _CounterChild | _HistogramChild:
        """``metric.labels(*values)`` (each metric keeps its children: as bounded as the label values);
        a child made before is taken straight from the metric's table (about ten per request)."""
        found = metric.children.get(values)
        return found if found is not None else metric.labels(*values)


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
