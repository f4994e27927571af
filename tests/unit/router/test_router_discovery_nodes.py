"""Discovered nodes in the node table (registry, Kubernetes) and the growing cool-down of failing nodes."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from agentpool.router.config import KubernetesDiscoveryConfig, NodeConfig, NodeModelConfig
from agentpool.router.discovery import engines_from_slices
from agentpool.router.nodes import NodeTable
from agentpool.router.policy import Role
from agentpool.wire.engine import LoadReport


def node(i: str, url: str = "http://e:1", role: Role = Role.BOTH) -> NodeConfig:
    return NodeConfig(id=i, url=url, role=role)


def accepting(t: NodeTable, now: float) -> set[str]:
    return {n.node_id for n in t.snapshot(now) if n.accepting}


def test_a_failing_node_waits_longer_each_time_up_to_the_cap_and_a_success_resets_it() -> None:
    t = NodeTable(down_cooldown_s=2.0, max_down_s=20.0)
    t.configure([node("a")], NodeModelConfig())
    assert [t.mark_down("a", 0.0) for _ in range(6)] == [2.0, 4.0, 8.0, 16.0, 20.0, 20.0]
    assert accepting(t, 19.9) == set() and accepting(t, 20.0) == {"a"}
    t.succeeded("a")
    assert t.mark_down("a", 100.0) == 2.0
    assert t.mark_down("gone", 0.0) == 0.0


def test_registered_nodes_survive_config_reloads_and_expire_without_reports() -> None:
    t = NodeTable()
    t.configure([node("a")], NodeModelConfig())
    assert t.register(node("r", "http://r:1", Role.PREFILL), "registry", now=0.0)
    assert not t.register(node("a", "http://elsewhere:1"), "registry", now=0.0)  # a configured id wins
    assert t.get("a").url == "http://e:1"
    t.configure([node("a"), node("b")], NodeModelConfig())
    assert {e.node_id for e in t.entries()} == {"a", "b", "r"}
    assert t.get("r").role is Role.PREFILL and t.get("r").source == "registry"
    t.apply_report(LoadReport(node_id="r", role=Role.PREFILL), now=8.0)  # the heartbeat
    assert t.expire("registry", now=15.0, ttl_s=10.0) == []
    assert t.expire("registry", now=18.5, ttl_s=10.0) == ["r"]
    assert "r" not in t and "a" in t  # configured nodes never expire
    t.configure([], NodeModelConfig())
    assert len(t) == 0


def test_kubernetes_nodes_wait_for_a_report_that_gives_their_role_and_leave_with_their_endpoint() -> None:
    t = NodeTable()
    t.configure([node("cfg")], NodeModelConfig())
    added, removed = t.sync("kubernetes", [node("k0", "http://10.0.0.1:8080"), node("k1")], now=0.0)
    assert added == ["k0", "k1"] and removed == []
    assert accepting(t, 0.0) == {"cfg"}  # no role known yet: nothing is sent to k0, k1
    t.apply_report(LoadReport(node_id="k0", role=Role.DECODE), now=1.0)
    assert t.get("k0").role is Role.DECODE and accepting(t, 1.0) == {"cfg", "k0"}
    added, removed = t.sync("kubernetes", [node("k0", "http://10.0.0.9:8080")], now=2.0)
    assert added == [] and removed == ["k1"]
    assert t.get("k0").url == "http://10.0.0.9:8080" and t.get("k0").role is Role.DECODE  # the pod moved
    assert t.sync("kubernetes", [], now=3.0) == ([], ["k0"])
    assert {e.node_id for e in t.entries()} == {"cfg"}


def endpoint(name: str | None, address: str, ready: bool | None = True) -> k8s.V1Endpoint:
    ref = None if name is None else k8s.V1ObjectReference(kind="Pod", name=name)
    return k8s.V1Endpoint(
        addresses=[address], conditions=k8s.V1EndpointConditions(ready=ready), target_ref=ref
    )


def endpoint_slice(
    service: str, endpoints: list[k8s.V1Endpoint], port_name: str = "http"
) -> k8s.V1EndpointSlice:
    return k8s.V1EndpointSlice(
        address_type="IPv4",
        metadata=k8s.V1ObjectMeta(name=f"{service}-x", labels={"kubernetes.io/service-name": service}),
        ports=[
            k8s.DiscoveryV1EndpointPort(name="metrics", port=9090),
            k8s.DiscoveryV1EndpointPort(name=port_name, port=8080),
        ],
        endpoints=endpoints,
    )


@pytest.mark.parametrize(
    ("port", "ids"),
    [("http", ["engine-0", "engine-2"]), (8080, ["engine-0", "engine-2", "engine-5"])],  # by name or number
)
def test_ready_endpoints_of_the_service_become_nodes(port: str | int, ids: list[str]) -> None:
    cfg = KubernetesDiscoveryConfig(namespace="ns", service="engines", port=port)
    slices = [
        endpoint_slice(
            "engines",
            [
                endpoint("engine-0", "10.0.0.1"),
                endpoint("engine-1", "10.0.0.2", ready=False),
                endpoint("engine-2", "fd00::3", ready=None),  # unknown readiness counts as ready
                endpoint(None, "10.0.0.4"),  # no pod behind it: no node id
            ],
        ),
        endpoint_slice("other", [endpoint("x", "10.0.0.9")]),
        endpoint_slice("engines", [endpoint("engine-5", "10.0.0.5")], port_name="grpc"),
    ]
    urls = {
        "engine-0": "http://10.0.0.1:8080",
        "engine-2": "http://[fd00::3]:8080",
        "engine-5": "http://10.0.0.5:8080",
    }
    assert engines_from_slices(slices, cfg) == [NodeConfig(id=i, url=urls[i]) for i in ids]
