"""Prometheus metrics of the engine agent (``agentpool_engine_*``), on a registry owned by the engine."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SWITCH_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_FETCH_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
_ITER_BUCKETS = (1e-4, 1e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.requests = Counter(
            "agentpool_engine_requests_total",
            "Generate requests by phase and outcome",
            ["phase", "outcome"],
            registry=r,
        )
        self.bad_requests = Counter(
            "agentpool_engine_bad_requests_total",
            "Requests refused with a 4xx, by reason",
            ["reason"],
            registry=r,
        )
        self.unauthenticated = Counter(
            "agentpool_engine_unauthenticated_total",
            "Calls refused for a missing or wrong engine token, by channel (http, lease_channel)",
            ["channel"],
            registry=r,
        )
        self.queue = Gauge("agentpool_engine_queue_requests", "Prefill requests queued", registry=r)
        self.batch = Gauge("agentpool_engine_decode_batch_requests", "Requests decoding", registry=r)
        self.kv_blocks = Gauge("agentpool_engine_kv_blocks", "KV blocks held, by tier", ["tier"], registry=r)
        self.fetch_bytes = Counter(
            "agentpool_engine_fetch_bytes_total",
            "Bytes read from peers' host pools, by kind",
            ["kind"],
            registry=r,
        )
        self.fetch_seconds = Histogram(
            "agentpool_engine_fetch_seconds",
            "Latency of reads from peers (lease, NIXL READ, check)",
            ["kind"],
            buckets=_FETCH_BUCKETS,
            registry=r,
        )
        self.fetch_failures = Counter(
            "agentpool_engine_fetch_failures_total",
            "Fetches that failed (the request recomputes), by kind",
            ["kind"],
            registry=r,
        )
        self.fetch_direct_misses = Counter(
            "agentpool_engine_fetch_direct_misses_total",
            "One-sided prefix reads that fell back to a lease, by reason (not_indexed: a block not in "
            "the peer's slot table; changed: a slot overwritten during the read)",
            ["reason"],
            registry=r,
        )
        self.recomputed_tokens = Counter(
            "agentpool_engine_fetch_recomputed_tokens_total",
            "Tokens recomputed because a fetch failed",
            registry=r,
        )
        self.handover_recomputed = Counter(
            "agentpool_engine_handover_recomputed_total",
            "Decode requests whose P->D hand-over failed and that were prefilled again "
            "(sim: by this node; sglang: by the prefill node)",
            registry=r,
        )
        self.unknown_transfers = Counter(
            "agentpool_engine_unknown_transfers_total",
            "Lookups of transfer ids or leases this node does not hold",
            registry=r,
        )
        self.switches = Counter(
            "agentpool_engine_switches_total",
            "Role switches done, by from and to role",
            ["from_role", "to_role"],
            registry=r,
        )
        self.switch_failures = Counter(
            "agentpool_engine_switch_failures_total",
            "Role switches the backend refused (the node serves its old role), by from and to role",
            ["from_role", "to_role"],
            registry=r,
        )
        self.switch_seconds = Histogram(
            "agentpool_engine_switch_seconds",
            "Role switch time: part=total (desired role seen to serving), drain, switch (after the drain)",
            ["part"],
            buckets=_SWITCH_BUCKETS,
            registry=r,
        )
        self.requeued = Counter(
            "agentpool_engine_requeued_requests_total",
            "Requests handed back to the router, by reason",
            ["reason"],
            registry=r,
        )
        self.iteration_seconds = Histogram(
            "agentpool_engine_iteration_seconds",
            "Iteration time (wall seconds), by phase",
            ["phase"],
            buckets=_ITER_BUCKETS,
            registry=r,
        )
        self.reports = Counter(
            "agentpool_engine_reports_total",
            "Load reports sent, by outcome (ok, rejected, failed)",
            ["outcome"],
            registry=r,
        )
        self.directory_resyncs = Counter(
            "agentpool_engine_directory_resyncs_total", "Full resyncs sent to the directory", registry=r
        )
        self.role = Gauge("agentpool_engine_role", "1 for the role served now", ["role"], registry=r)
        self.draining = Gauge("agentpool_engine_draining", "1 while draining for a role switch", registry=r)
