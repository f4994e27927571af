"""The Helm chart without helm: templates render (a subset renderer) to valid Kubernetes YAML, the
values schema holds for the defaults and refuses bad values, every value used exists and every value
is used, the RBAC covers what the operator does, and the dashboard queries metrics the code exports."""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from helm_subset import Context, TemplateError, render

from agentpool.api import AgentServingPool
from agentpool.operator.builders import BuildSettings, children
from agentpool.operator.names import PoolRef

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "agentpool"
VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
CHART_META: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())


def rendered(values: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], set[str]]:
    ctx = Context(
        values=values if values is not None else VALUES,
        release={"Name": "ap", "Namespace": "agentpool-system"},
        chart={"Name": CHART_META["name"], "AppVersion": CHART_META["appVersion"]},
    )
    docs: list[dict[str, Any]] = []
    for template in sorted((CHART / "templates").glob("*.yaml")):
        text = render(template.read_text(), ctx)
        docs += [d for d in yaml.safe_load_all(text) if d is not None]
    return docs, ctx.used


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


def leaves(values: Any, prefix: str = "") -> set[str]:
    if isinstance(values, dict) and values:
        return set().union(*(leaves(v, f"{prefix}{k}.") for k, v in values.items()))
    return {prefix.rstrip(".")}


def test_the_defaults_render_to_valid_kubernetes_objects() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs, _ = rendered()
    assert sorted(by_kind(docs)) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount"]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.28", strict=True)
    operator = by_kind(docs)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert operator["command"] == ["python", "-m", "agentpool.operator"]
    assert "--all-namespaces" in operator["args"]
    assert "--control-plane-image=ghcr.io/agentpool/agentpool:0.1.0" in operator["args"]
    assert operator["resources"] == VALUES["resources"]


def test_the_operator_parses_its_arguments() -> None:
    from agentpool.operator.__main__ import parse_args

    docs, _ = rendered()
    args = parse_args(by_kind(docs)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args.all_namespaces and args.status_interval_s == 5 and args.liveness.endswith("/healthz")


def test_every_value_used_exists_and_every_value_is_used() -> None:
    values = copy.deepcopy(VALUES)
    values["serviceMonitor"]["enabled"] = True
    values["watchNamespaces"] = ["a"]
    _, used = rendered(values)
    defined = leaves(values)
    assert {u for u in used if u not in defined and not any(d.startswith(u + ".") for d in defined)} == set()
    unused = {d for d in defined if not any(d == u or d.startswith(u + ".") for u in used)}
    assert unused == set(), "values no template reads"
    broken = copy.deepcopy(VALUES)
    del broken["operator"]["drainTimeoutS"]
    with pytest.raises(TemplateError, match=r"operator\.drainTimeoutS"):
        rendered(broken)


def test_namespaces_and_the_service_monitor() -> None:
    values = copy.deepcopy(VALUES)
    values["watchNamespaces"] = ["team-a", "team-b"]
    values["serviceMonitor"] = {"enabled": True, "interval": "15s", "labels": {"release": "prom"}}
    docs, _ = rendered(values)
    args = by_kind(docs)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args and "--all-namespaces" not in args
    monitor = by_kind(docs)["ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"http", "metrics", "planner-metrics"}
    assert all(e["interval"] == "15s" for e in monitor["spec"]["endpoints"])
    # it selects what the builders label, and the ports the builders name exist
    pool = AgentServingPool.model_validate(yaml.safe_load((ROOT / "examples" / "pool-sim.yaml").read_text()))
    made = children(PoolRef("sim", "ns", "uid"), pool.spec, 1, BuildSettings())
    assert "NetworkPolicy" in {o["kind"] for o in made}  # on by default: checked below too
    services = [o for o in made if o["kind"] == "Service"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert all(selector.items() <= s["metadata"]["labels"].items() for s in services)
    ports = {p["name"] for s in services for p in s["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports


def test_the_schema_accepts_the_defaults() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.validate(VALUES, SCHEMA)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("image.tag", 1),
        ("image.pullPolicy", "Sometimes"),
        ("operator.statusIntervalS", 0),
        ("operator.drainTimeoutS", -5),
        ("operator.logLevel", "chatty"),
        ("watchNamespaces", ["Team A"]),
        ("serviceMonitor.enabled", "yes"),
        ("serviceMonitor.interval", "30 seconds"),
        ("resources.limits", {"memory": "-1Gi"}),
        ("controlPlaneImage", ""),
        ("imagePullSecret", "x"),
    ],
)
def test_the_schema_refuses_bad_values(path: str, value: Any) -> None:
    values = copy.deepcopy(VALUES)
    *parents, leaf = path.split(".")
    node = values
    for key in parents:
        node = node[key]
    node[leaf] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, SCHEMA)


def test_kubernetes_version_and_crd() -> None:
    assert CHART_META["kubeVersion"] == ">=1.28.0-0"
    assert "1.28" in (ROOT / "README.md").read_text()
    chart_crd = (CHART / "crds" / "agentservingpools.agentpool.io.yaml").read_text()
    assert chart_crd == (ROOT / "crds" / "agentservingpools.agentpool.io.yaml").read_text()


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_the_operator_may_grant_what_it_grants_and_do_what_it_does() -> None:
    docs, _ = rendered()
    granted = _grants(by_kind(docs)["ClusterRole"]["rules"])
    pool = AgentServingPool.model_validate(yaml.safe_load((ROOT / "examples" / "pool-sim.yaml").read_text()))
    made = children(PoolRef("sim", "ns", "uid"), pool.spec, 1, BuildSettings())
    assert "NetworkPolicy" in {o["kind"] for o in made}  # on by default: checked below too
    for role in (o for o in made if o["kind"] == "Role"):  # no escalation: it holds all it grants
        assert _grants(role["rules"]) <= granted, role["metadata"]["name"]
    plural = {"ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps", "Service": "services",
              "StatefulSet": "statefulsets", "Deployment": "deployments", "Role": "roles",
              "RoleBinding": "rolebindings", "NetworkPolicy": "networkpolicies"}  # fmt: skip
    group = {"StatefulSet": "apps", "Deployment": "apps", "Role": "rbac.authorization.k8s.io",
             "RoleBinding": "rbac.authorization.k8s.io", "NetworkPolicy": "networking.k8s.io"}  # fmt: skip
    for obj in made:  # it creates, compares, applies and deletes every child
        for verb in ("get", "create", "patch", "delete"):
            assert (group.get(obj["kind"], ""), plural[obj["kind"]], verb) in granted, (obj["kind"], verb)
    needed = {
        ("agentpool.io", "agentservingpools", "watch"),
        ("agentpool.io", "agentservingpools/status", "patch"),
        ("", "secrets", "create"),
        ("", "secrets", "patch"),  # a key a newer operator adds to an existing <pool>-auth (engine-token)
        ("", "pods", "patch"),  # initial roles, drains
        ("", "events", "create"),
        ("coordination.k8s.io", "leases", "delete"),
    }
    assert needed <= granted
    # the planner's switch count and reasons come from its state ConfigMap, not from Events
    assert ("", "events", "list") not in granted
    assert ("", "secrets", "list") not in granted and ("", "secrets", "watch") not in granted
    assert not any("*" in grant for grant in granted)


# ---------------------------------------------------------------- the dashboard

METRIC_TYPES = {"Counter": "Counter", "Gauge": "Gauge", "Histogram": "Histogram", "Summary": "Summary",
                "CounterMetricFamily": "Counter", "GaugeMetricFamily": "Gauge",
                "HistogramMetricFamily": "Histogram",
                # the router's per-request metrics, kept on its loop and collected at scrape time
                "LoopCounter": "Counter", "LoopHistogram": "Histogram"}  # fmt: skip


def exported_metrics() -> dict[str, str]:
    """Every series name the code exports -> its metric type, found in the metric definitions."""
    out: dict[str, str] = {}
    for root in ("controlplane", "engine-image"):
        for path in (ROOT / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
                    continue
                func = (
                    node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                )
                name = node.args[0].value
                if func not in METRIC_TYPES or not isinstance(name, str) or not name.startswith("agentpool_"):
                    continue
                kind = METRIC_TYPES[func]
                if kind == "Counter":
                    out[name.removesuffix("_total") + "_total"] = kind
                elif kind in ("Histogram", "Summary"):
                    for suffix in ("_bucket", "_sum", "_count"):
                        out[name + suffix] = kind
                else:
                    out[name] = kind
    return out


def test_the_dashboard_queries_metrics_the_code_exports() -> None:
    dashboard = json.loads((CHART / "dashboards" / "agentpool.json").read_text())
    exported = exported_metrics()
    assert len(exported) > 30
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"agentpool_[a-z_]+", e)}
    assert used - set(exported) == set(), "the dashboard names metrics nobody exports"
    for expr in exprs:
        for metric in re.findall(r"rate\((agentpool_[a-z_]+)", expr):
            assert exported[metric] in ("Counter", "Histogram"), metric
        if "histogram_quantile" in expr:
            assert all(m.endswith("_bucket") for m in re.findall(r"agentpool_[a-z_]+", expr)), expr
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("split", "switches", "ttft", "tpot", "kv hit", "lost reuse", "fetch bytes", "queue depth"):
        assert topic in titles, topic
