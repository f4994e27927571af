"""The router's per-request metrics (plain floats on the loop) expose what prometheus_client's would."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from agentpool.router.metrics import LoopCounter, LoopHistogram, LoopMetrics, RouterMetrics

BUCKETS = (1e-5, 2.5e-5, 0.005, 1.0, 60.0)


def exposition(registry: CollectorRegistry) -> str:
    """The scrape text without prometheus_client's ``_created`` samples (the loop metrics have none)."""
    lines = generate_latest(registry).decode().splitlines()
    return "\n".join(line for line in lines if "_created" not in line)


def test_loop_metrics_scrape_as_prometheus_client_metrics() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("x_seconds", "doc", ["policy"], buckets=BUCKETS, registry=theirs)
    c1 = Counter("y_total", "doc", ["a", "b"], registry=theirs)
    h2 = LoopHistogram("x_seconds", "doc", ["policy"], BUCKETS)
    c2 = LoopCounter("y_total", "doc", ["a", "b"])
    ours.register(LoopMetrics([h2, c2]))
    rng = random.Random(7)
    # on the bounds, between them, below the first and above the last
    values = [*BUCKETS, 0.0, 3e-6, 61.0] + [rng.random() * 2 for _ in range(200)]
    for v in values:
        policy = rng.choice(["p", "q"])
        h1.labels(policy).observe(v)
        h2.labels(policy).observe(v)
    for labels, amount in [(("x", "y"), 3.0), (("z", "w"), 0.0), (("x", "y"), 1.5)]:
        c1.labels(*labels).inc(amount)
        c2.labels(*labels).inc(amount)
    assert exposition(ours) == exposition(theirs)


def test_loop_metrics_refuse_what_prometheus_client_refuses() -> None:
    counter = LoopCounter("y_total", "doc", ["a"])
    with pytest.raises(ValueError):
        counter.labels("x").inc(-1)
    with pytest.raises(ValueError):
        counter.labels("x", "y")
    with pytest.raises(ValueError):
        LoopHistogram("x_seconds", "doc", ["policy"], BUCKETS).labels()


def test_router_metrics_reads_through_the_registry() -> None:
    m = RouterMetrics()
    m.child(m.requests, "chat", "200").inc()
    m.child(m.ttft, "evolving").observe(0.02)
    m.child(m.prefix_tokens, "local").inc(32)
    value = m.registry.get_sample_value
    assert value("agentpool_router_requests_total", {"endpoint": "chat", "code": "200"}) == 1.0
    assert value("agentpool_router_ttft_seconds_count", {"policy": "evolving"}) == 1.0
    assert value("agentpool_router_ttft_seconds_bucket", {"policy": "evolving", "le": "0.01"}) == 0.0
    assert value("agentpool_router_ttft_seconds_bucket", {"policy": "evolving", "le": "0.025"}) == 1.0
    assert value("agentpool_router_prefix_tokens_total", {"kind": "local"}) == 32.0
