"""The pool's NetworkPolicies: a table of (pool, source pod, port) -> admitted or not, evaluated
with NetworkPolicy's semantics against the labels of the pods the builders really make."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentpool.api import AgentServingPool
from agentpool.operator.apply import APPLIED_ANNOTATION, with_applied_digest
from agentpool.operator.builders import BuildSettings, children
from agentpool.operator.builders.network import network_policies, policy_names
from agentpool.operator.names import PoolRef

ROOT = Path(__file__).resolve().parents[3]
SIM = yaml.safe_load((ROOT / "examples" / "pool-sim.yaml").read_text())
SGLANG = yaml.safe_load((ROOT / "examples" / "pool-sglang.yaml").read_text())
NAMESPACE = "team-a"
UCX_PORT = 41234  # an ephemeral port UCX or the lease channel may listen on
PROMETHEUS_NS = {"kubernetes.io/metadata.name": "monitoring"}
MONITORING = [{"namespaceSelector": {"matchLabels": PROMETHEUS_NS}}]


def network(manifest: dict[str, Any], **fields: Any) -> dict[str, Any]:
    out = copy.deepcopy(manifest)
    out["spec"]["network"] = fields
    return out


EXISTING_REDIS = copy.deepcopy(SIM)
EXISTING_REDIS["spec"]["redis"] = {"existing": {"secretName": "cache"}}


def pool_children(manifest: dict[str, Any], name: str | None = None) -> list[dict[str, Any]]:
    spec = AgentServingPool.model_validate(manifest).spec
    ref = PoolRef(name or manifest["metadata"]["name"], NAMESPACE, "uid-1", {"team": "search"})
    return children(ref, spec, 1, BuildSettings())


@dataclass(frozen=True)
class Source:
    """A pod that opens a connection: its namespace, its namespace's labels, its own labels."""

    namespace: str
    namespace_labels: dict[str, str]
    labels: dict[str, str]


def pod_labels(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, str]:
    """The labels the pods of a workload the builders made carry (its pod template's)."""
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return dict(obj["spec"]["template"]["metadata"]["labels"])


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # all the builders and these tests use
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def peer_matches(peer: dict[str, Any], source: Source) -> bool:
    assert "ipBlock" not in peer
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], source.namespace_labels):
            return False
    elif source.namespace != NAMESPACE:  # a podSelector alone: the policy's namespace
        return False
    return "podSelector" not in peer or selects(peer["podSelector"], source.labels)


def admits(policies: list[dict[str, Any]], target: dict[str, str], source: Source, port: int) -> bool:
    """NetworkPolicy ingress semantics: a pod no policy selects takes everything; a selected pod
    takes what any rule of any selecting policy admits (`from` missing or empty: every source;
    `ports` missing or empty: every port)."""
    selecting = [p for p in policies if selects(p["spec"]["podSelector"], target)]
    if not selecting:
        return True
    for policy in selecting:
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            ports = rule.get("ports")
            if peers and not any(peer_matches(p, source) for p in peers):
                continue
            if ports and not any(p.get("protocol", "TCP") == "TCP" and p["port"] == port for p in ports):
                continue
            return True
    return False


SIM_OBJS = pool_children(SIM)
OTHER_OBJS = pool_children(SIM, name="other")
ENGINE = pod_labels(SIM_OBJS, "StatefulSet", "sim-engine")
ROUTER = pod_labels(SIM_OBJS, "Deployment", "sim-router")
DIRECTORY = pod_labels(SIM_OBJS, "Deployment", "sim-directory")
REDIS = pod_labels(SIM_OBJS, "StatefulSet", "sim-redis")
OTHER_ENGINE = pod_labels(OTHER_OBJS, "StatefulSet", "other-engine")
OTHER_ROUTER = pod_labels(OTHER_OBJS, "Deployment", "other-router")
NS_LABELS = {"kubernetes.io/metadata.name": NAMESPACE}

SOURCES = {
    "engine": Source(NAMESPACE, NS_LABELS, ENGINE),
    "router": Source(NAMESPACE, NS_LABELS, ROUTER),
    "directory": Source(NAMESPACE, NS_LABELS, DIRECTORY),
    "redis": Source(NAMESPACE, NS_LABELS, REDIS),
    "other pool's engine": Source(NAMESPACE, NS_LABELS, OTHER_ENGINE),
    "other pool's router": Source(NAMESPACE, NS_LABELS, OTHER_ROUTER),
    "unlabelled pod": Source(NAMESPACE, NS_LABELS, {}),
    "prometheus": Source("monitoring", PROMETHEUS_NS, {"app": "prometheus"}),
    "elsewhere": Source("default", {"kubernetes.io/metadata.name": "default"}, {}),
}


@dataclass(frozen=True)
class Case:
    name: str
    manifest: dict[str, Any]
    admitted: set[tuple[str, str, int]]
    """(target, source, port) that must be admitted; every other one in `probes` must not be."""


def probes() -> list[tuple[str, str, int]]:
    engine_ports = [8080, UCX_PORT, 8998]  # HTTP, an ephemeral UCX/lease port, SGLang's bootstrap
    directory_ports = [50061, 50062, 9090, UCX_PORT]
    out = [("engine", s, p) for s in SOURCES for p in engine_ports]
    out += [("redis", s, p) for s in SOURCES for p in (6379, UCX_PORT)]
    return out + [("directory", s, p) for s in SOURCES for p in directory_ports]


EVERYONE = set(SOURCES)
POOL_ENGINE_PORTS = {("engine", "engine", p) for p in (8080, UCX_PORT, 8998)}
ROUTER_HTTP = {("engine", "router", 8080)}
DIRECTORY_CLIENTS = {("directory", s, 50061) for s in ("router", "engine")}  # 50062 (the link): not run
REDIS_CLIENT = {("redis", "directory", 6379)}
ANY_REDIS = {("redis", s, p) for s in SOURCES for p in (6379, UCX_PORT)}


def metrics_from(sources: set[str]) -> set[tuple[str, str, int]]:
    return {("engine", s, 8080) for s in sources} | {("directory", s, 9090) for s in sources}


def everything() -> set[tuple[str, str, int]]:
    return set(probes())


CASES = [
    Case(
        "sim, default: metrics ports open to every source",
        SIM,
        POOL_ENGINE_PORTS | ROUTER_HTTP | DIRECTORY_CLIENTS | REDIS_CLIENT | metrics_from(EVERYONE),
    ),
    Case(
        "sglang example, default",
        SGLANG,
        POOL_ENGINE_PORTS | ROUTER_HTTP | DIRECTORY_CLIENTS | REDIS_CLIENT | metrics_from(EVERYONE),
    ),
    Case(
        "metrics from the monitoring namespace only",
        network(SIM, metricsFrom=MONITORING),
        POOL_ENGINE_PORTS | ROUTER_HTTP | DIRECTORY_CLIENTS | REDIS_CLIENT | metrics_from({"prometheus"}),
    ),
    Case(
        "metrics from nobody outside the pool",
        network(SIM, metricsFrom=[]),
        POOL_ENGINE_PORTS | ROUTER_HTTP | DIRECTORY_CLIENTS | REDIS_CLIENT,
    ),
    Case(  # no Redis pod of the pool: the probes stand for a pod labelled as one would be
        "an existing Redis gets no policy",
        EXISTING_REDIS,
        POOL_ENGINE_PORTS | ROUTER_HTTP | DIRECTORY_CLIENTS | ANY_REDIS | metrics_from(EVERYONE),
    ),
    Case("opted out: no policy, everything reaches everything", network(SIM, policy=False), everything()),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_who_reaches_the_engines_and_the_directory(case: Case) -> None:
    name = case.manifest["metadata"]["name"]
    objs = pool_children(case.manifest)
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    own = {  # this pool's pods, as its builders label them
        "engine": pod_labels(objs, "StatefulSet", f"{name}-engine"),
        "router": pod_labels(objs, "Deployment", f"{name}-router"),
        "directory": pod_labels(objs, "Deployment", f"{name}-directory"),
        "redis": pod_labels(SIM_OBJS, "StatefulSet", "sim-redis") | {"agentpool.io/pool": name},
    }
    sources = {**SOURCES, **{k: Source(NAMESPACE, NS_LABELS, v) for k, v in own.items()}}
    wrong = [
        (target, source, port, expected)
        for target, source, port in probes()
        if admits(policies, own[target], sources[source], port)
        != (expected := (target, source, port) in case.admitted)
    ]
    assert not wrong, wrong


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_policy_selects_exactly_its_component_pods(case: Case) -> None:
    objs = pool_children(case.manifest)
    name = case.manifest["metadata"]["name"]
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "NetworkPolicy"}
    if not case.manifest["spec"].get("network", {}).get("policy", True):
        assert policies == {}
        return
    names = policy_names(PoolRef(name, NAMESPACE, "uid-1"))
    if "existing" in case.manifest["spec"].get("redis", {}):
        names.remove(f"{name}-redis")
    assert sorted(policies) == sorted(names)
    workloads = [o for o in objs if o["kind"] in ("StatefulSet", "Deployment")]
    for policy in policies.values():
        selected = [
            w["metadata"]["name"]
            for w in workloads
            if selects(policy["spec"]["podSelector"], w["spec"]["template"]["metadata"]["labels"])
        ]
        assert selected == [policy["metadata"]["name"]]  # <pool>-engine's pods, <pool>-directory's, ...
        assert policy["metadata"]["labels"]["agentpool.io/pool"] == name
        assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    # applied before the workloads whose pods they protect
    kinds = [o["kind"] for o in objs]
    assert max(i for i, k in enumerate(kinds) if k == "NetworkPolicy") < min(
        i for i, k in enumerate(kinds) if k in ("StatefulSet", "Deployment")
    )


def test_the_applied_digest_changes_with_every_rule_change() -> None:
    """The compare-then-apply ignores fields the desired object lacks; the digest of the applied
    object makes a rule that went away (e.g. `metricsFrom` unset again) a difference it sees."""
    ref = PoolRef("sim", NAMESPACE, "uid-1")
    digests = set()
    for manifest in (SIM, network(SIM, metricsFrom=[]), network(SIM, metricsFrom=MONITORING)):
        spec = AgentServingPool.model_validate(manifest).spec
        for policy in network_policies(ref, spec):
            applied = with_applied_digest(policy)["metadata"]["annotations"][APPLIED_ANNOTATION]
            digests.add((policy["metadata"]["name"], applied))
    assert len(digests) == 7  # the Redis policy's rules do not depend on metricsFrom


def test_the_policies_are_valid_kubernetes_objects() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for manifest in (SIM, network(SIM, metricsFrom=MONITORING), network(SIM, metricsFrom=[])):
        for policy in (o for o in pool_children(manifest) if o["kind"] == "NetworkPolicy"):
            kubernetes_validate.validate(policy, "1.28", strict=True)


def test_the_spec_default_is_on_and_peers_are_bounded() -> None:
    assert AgentServingPool.model_validate(SIM).spec.network.policy is True
    with pytest.raises(ValueError, match="at most 32"):
        AgentServingPool.model_validate(network(SIM, metricsFrom=MONITORING * 33))


ADDRESS = re.compile(r"([a-z0-9-]+)\.team-a\.svc:(\d+)")


def configured_addresses(objs: list[dict[str, Any]], name: str) -> set[tuple[str, str, int]]:
    """(source component, target component, port) for every service address the builders write
    into a component's command lines and configuration files."""
    texts: dict[str, list[str]] = {"router": [], "engine": [], "directory": []}
    for obj in objs:
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        if obj["kind"] in ("Deployment", "StatefulSet") and component in texts:
            for c in obj["spec"]["template"]["spec"]["containers"]:
                texts[component] += [*c.get("command", []), *c.get("args", [])]
        if obj["kind"] == "ConfigMap":
            source = "engine" if obj["metadata"]["name"] == f"{name}-engines" else "router"
            texts[source] += list(obj["data"].values())  # router.json and planner.json: the router pod
    out = set()
    for source, strings in texts.items():
        for text in strings:
            for service, port in ADDRESS.findall(text):
                out.add((source, service.removeprefix(f"{name}-"), int(port)))
    return out


@pytest.mark.parametrize("manifest", [SIM, SGLANG], ids=["sim", "sglang"])
def test_every_address_the_builders_configure_is_admitted(manifest: dict[str, Any]) -> None:
    """What connects where, from the builders' own configuration: a port moved or a new client
    added without the policies following fails here."""
    name = manifest["metadata"]["name"]
    objs = pool_children(manifest)
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    labels = {
        c: pod_labels(objs, kind, f"{name}-{c}")
        for c, kind in (("engine", "StatefulSet"), ("router", "Deployment"), ("directory", "Deployment"),
                        ("redis", "StatefulSet"))
    }  # fmt: skip
    found = configured_addresses(objs, name)
    assert {("router", "engine", 8080), ("router", "directory", 50061), ("engine", "directory", 50061),
            ("engine", "engine", 8080), ("engine", "router", 8000),
            ("directory", "redis", 6379)} <= found, found  # fmt: skip
    for source, target, port in found:
        assert admits(policies, labels[target], Source(NAMESPACE, NS_LABELS, labels[source]), port), (
            source,
            target,
            port,
        )
