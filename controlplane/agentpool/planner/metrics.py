"""Prometheus metrics of the planner (``agentpool_planner_*``), on an explicit registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from agentpool.planner.core import SplitDecision


class PlannerMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.prefill_nodes = Gauge(
            "agentpool_planner_prefill_nodes",
            "Prefill nodes in the split after the last evaluation",
            registry=registry,
        )
        self.decode_nodes = Gauge(
            "agentpool_planner_decode_nodes",
            "Decode nodes in the split after the last evaluation",
            registry=registry,
        )
        self.best_gain = Gauge(
            "agentpool_planner_best_gain_requests_per_second",
            "Mean gain (Eq. 6) of the best candidate split at the last evaluation",
            registry=registry,
        )
        self.best_std_error = Gauge(
            "agentpool_planner_best_gain_std_error_requests_per_second",
            "Standard error of the best candidate's gains at the last evaluation",
            registry=registry,
        )
        self.throughput = Gauge(
            "agentpool_planner_predicted_throughput_requests_per_second",
            "Predicted throughput (Eq. 5) of the current split, mean over the window's slices",
            registry=registry,
        )
        self.decisions = Counter(
            "agentpool_planner_decisions", "Planner evaluations by outcome", ["outcome"], registry=registry
        )
        self.switched_nodes = Counter(
            "agentpool_planner_switched_nodes",
            "Nodes whose desired role the planner changed",
            registry=registry,
        )

    def observe(self, decision: SplitDecision) -> None:
        self.decisions.labels(outcome=decision.outcome.value).inc()
        self.prefill_nodes.set(len(decision.prefill))
        self.decode_nodes.set(len(decision.decode))
        self.switched_nodes.inc(len(decision.to_prefill) + len(decision.to_decode))
        if decision.current_throughput:
            self.throughput.set(sum(decision.current_throughput) / len(decision.current_throughput))
        best = decision.best
        if best is not None:
            self.best_gain.set(best.mean_gain)
            self.best_std_error.set(best.std_error)
