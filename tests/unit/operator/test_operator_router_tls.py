"""Router HTTPS and mutual TLS in the manifests (`spec.auth.routerTls`): which Secret keys each pod
gets as files, the flags and config fields that name them (parsed by each service's own parser and
loader), the probes' scheme, and the URLs the engines and the planner reach the router at."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pool_manifests import build_pool, container, flags, obj, planner_args, pod, secret_files

from agentpool.engine.config import load_config
from agentpool.planner.process import parser as planner_parser
from agentpool.router.__main__ import parser as router_parser

TLS = {"secretName": "router-tls"}
MTLS = {"secretName": "router-tls", "clientSecretName": "router-clients"}


def build(tls: dict[str, Any] | None) -> list[dict[str, Any]]:
    return build_pool({} if tls is None else {"routerTls": tls})


@pytest.mark.parametrize("tls", [None, TLS, MTLS], ids=["plain", "tls", "mtls"])
def test_each_part_gets_only_the_router_keys_it_needs(tls: dict[str, Any] | None) -> None:
    objs = build(tls)
    mutual = tls is not None and "clientSecretName" in tls
    router_pod = pod(objs, "Deployment", "sim-router")
    router = container(router_pod, "router")
    files = secret_files(router_pod, router)
    want_server: dict[str, tuple[str, str]] = {}
    if tls is not None:
        want_server = {
            "--tls-cert-file": ("router-tls", "tls.crt"),
            "--tls-key-file": ("router-tls", "tls.key"),
        }
        if mutual:
            want_server["--tls-client-ca-file"] = ("router-clients", "ca.crt")
    assert {f: files[p] for f, p in flags(router["args"], "--tls-").items()} == want_server

    want_client: dict[str, tuple[str, str]] = {}
    if tls is not None:
        want_client = {"--router-ca-file": ("router-tls", "ca.crt")}
        if mutual:
            want_client |= {
                "--router-client-cert-file": ("router-clients", "tls.crt"),
                "--router-client-key-file": ("router-clients", "tls.key"),
            }
    planner = container(router_pod, "planner")
    args = planner_args(router_pod)
    got = {
        f: secret_files(router_pod, planner)[p]
        for f, p in flags(args, "--router-").items()
        if p.startswith("/")
    }
    assert {k: v for k, v in got.items() if k != "--router-token-file"} == want_client

    engine_pod = pod(objs, "StatefulSet", "sim-engine")
    engine = container(engine_pod, "engine")
    (target,) = json.loads(obj(objs, "ConfigMap", "sim-engines")["data"]["sim-engine-0.json"])["routers"]
    keys = {"caFile": "--router-ca-file", "clientCertFile": "--router-client-cert-file"}
    keys["clientKeyFile"] = "--router-client-key-file"
    got = {keys[k]: secret_files(engine_pod, engine)[v] for k, v in target.items() if k in keys}
    assert got == want_client

    # only the router sees its key; the planner and engines get the CA and the client pair alone
    for pod_spec, c in ((router_pod, planner), (engine_pod, engine)):
        assert ("router-tls", "tls.key") not in secret_files(pod_spec, c).values()
    assert ("router-clients", "tls.key") not in files.values()


@pytest.mark.parametrize(("tls", "scheme"), [(None, "HTTP"), (TLS, "HTTPS"), (MTLS, "HTTPS")])
def test_probes_engines_and_planner_reach_the_router_over_its_scheme(
    tls: dict[str, Any] | None, scheme: str
) -> None:
    objs = build(tls)
    router_pod = pod(objs, "Deployment", "sim-router")
    router = container(router_pod, "router")
    assert router["readinessProbe"]["httpGet"]["scheme"] == scheme
    assert router["livenessProbe"]["httpGet"]["scheme"] == scheme
    (target,) = json.loads(obj(objs, "ConfigMap", "sim-engines")["data"]["sim-engine-0.json"])["routers"]
    assert target["url"] == f"{scheme.lower()}://sim-router.team-a.svc:8000"
    args = planner_parser().parse_args(planner_args(router_pod))
    assert args.router_scheme == scheme.lower()
    # pods are reached at their IPs: the certificate is checked against the Service's name
    assert args.router_server_name == (None if tls is None else "sim-router.team-a.svc")
    # the engine pods' own probes and the directory are untouched by the router's TLS
    engine = container(pod(objs, "StatefulSet", "sim-engine"), "engine")
    assert engine["readinessProbe"]["httpGet"]["scheme"] == "HTTP"


@pytest.mark.parametrize("tls", [TLS, MTLS], ids=["tls", "mtls"])
def test_the_services_own_parsers_and_loader_take_the_router_files(
    tls: dict[str, Any], tmp_path: Path
) -> None:
    objs = build(tls)
    router_pod = pod(objs, "Deployment", "sim-router")
    args = router_parser().parse_args(container(router_pod, "router")["args"])
    assert args.tls_cert_file == Path("/var/run/agentpool/router-tls/tls.crt")
    assert args.tls_key_file == Path("/var/run/agentpool/router-tls/tls.key")
    mutual = "clientSecretName" in tls
    client_ca = Path("/var/run/agentpool/router-client-ca/ca.crt") if mutual else None
    assert args.tls_client_ca_file == client_ca
    p_args = planner_parser().parse_args(planner_args(router_pod))
    assert p_args.router_ca_file == Path("/var/run/agentpool/router-ca/ca.crt")
    cert = Path("/var/run/agentpool/router-client-tls/tls.crt") if mutual else None
    assert p_args.router_client_cert_file == cert
    path = tmp_path / "engine.json"
    path.write_text(obj(objs, "ConfigMap", "sim-engines")["data"]["sim-engine-0.json"])
    (target,) = load_config(path).routers
    assert target.url.startswith("https://")
    assert target.ca_file == p_args.router_ca_file
    assert target.client_cert_file == cert


def test_router_and_directory_tls_together_keep_their_files_apart() -> None:
    objs = build_pool(
        {
            "directoryTls": {"secretName": "dir-tls", "clientSecretName": "dir-clients"},
            "routerTls": MTLS,
        }
    )
    router_pod = pod(objs, "Deployment", "sim-router")
    names = [v["name"] for v in router_pod["volumes"]]
    assert len(names) == len(set(names))  # no volume named twice
    for c in router_pod["containers"]:
        paths = [m["mountPath"] for m in c["volumeMounts"]]
        assert len(paths) == len(set(paths))
    planner = container(router_pod, "planner")
    seen = set(secret_files(router_pod, planner).values())
    assert {("dir-clients", "tls.crt"), ("router-clients", "tls.crt"), ("router-tls", "ca.crt")} <= seen
    assert "BEGIN" not in json.dumps(objs)
