"""Directory TLS and mutual TLS in the manifests (`spec.auth.directoryTls`): which Secret keys each
pod gets as files, the flags and config fields that name them, and no key material anywhere else.
The flags are parsed by each service's own command-line parser, the engine file by its loader."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from pool_manifests import SIM, build_pool, container, flags, obj, pod, secret_files

from agentpool.api import AgentServingPool
from agentpool.directory.server import parse_args as directory_parse_args
from agentpool.engine.config import load_config
from agentpool.planner.process import parser as planner_parser
from agentpool.router.__main__ import parser as router_parser

TLS = {"secretName": "dir-tls"}
MTLS = {"secretName": "dir-tls", "clientSecretName": "dir-clients"}


def build(tls: dict[str, Any] | None) -> list[dict[str, Any]]:
    return build_pool({} if tls is None else {"directoryTls": tls})


@pytest.mark.parametrize("tls", [None, TLS, MTLS], ids=["plain", "tls", "mtls"])
def test_each_part_gets_only_the_keys_it_needs_and_names_them(tls: dict[str, Any] | None) -> None:
    objs = build(tls)
    mutual = tls is not None and "clientSecretName" in tls

    directory_pod = pod(objs, "Deployment", "sim-directory")
    directory = container(directory_pod, "directory")
    files = secret_files(directory_pod, directory)
    server = flags(directory["args"], "--tls-")
    want_server = {}
    if tls is not None:
        want_server = {"--tls-cert-file": ("dir-tls", "tls.crt"), "--tls-key-file": ("dir-tls", "tls.key")}
        if mutual:
            want_server["--tls-client-ca-file"] = ("dir-clients", "ca.crt")
    assert {flag: files[path] for flag, path in server.items()} == want_server

    want_client: dict[str, tuple[str, str]] = {}
    if tls is not None:
        want_client = {"--directory-ca-file": ("dir-tls", "ca.crt")}
        if mutual:
            want_client |= {
                "--directory-client-cert-file": ("dir-clients", "tls.crt"),
                "--directory-client-key-file": ("dir-clients", "tls.key"),
            }
    router_pod = pod(objs, "Deployment", "sim-router")
    router = container(router_pod, "router")
    got = {f: secret_files(router_pod, router)[p] for f, p in flags(router["args"], "--directory-").items()}
    assert {k: v for k, v in got.items() if k != "--directory-token-file"} == want_client
    planner = container(router_pod, "planner")
    command = planner["command"][planner["command"].index("agentpool.planner") + 1 :]
    got = {f: secret_files(router_pod, planner)[p] for f, p in flags(command, "--directory-").items()}
    assert {k: v for k, v in got.items() if k != "--directory-token-file"} == want_client

    engine_pod = pod(objs, "StatefulSet", "sim-engine")
    engine = container(engine_pod, "engine")
    config = json.loads(obj(objs, "ConfigMap", "sim-engines")["data"]["sim-engine-0.json"])["directory"]
    keys = {"caFile": "--directory-ca-file", "clientCertFile": "--directory-client-cert-file"}
    keys["clientKeyFile"] = "--directory-client-key-file"
    got = {keys[k]: secret_files(engine_pod, engine)[v] for k, v in config.items() if k in keys}
    assert got == want_client

    # nobody but the directory sees its key; no client sees a CA's key or another Secret's keys
    for pod_spec, c in ((router_pod, router), (router_pod, planner), (engine_pod, engine)):
        assert ("dir-tls", "tls.key") not in secret_files(pod_spec, c).values()


@pytest.mark.parametrize("tls", [TLS, MTLS], ids=["tls", "mtls"])
def test_the_services_own_parsers_take_the_flags_and_files(tls: dict[str, Any], tmp_path: Path) -> None:
    objs = build(tls)
    router_pod = pod(objs, "Deployment", "sim-router")
    args = router_parser().parse_args(container(router_pod, "router")["args"])
    assert args.directory_ca_file == Path("/var/run/agentpool/directory-ca/ca.crt")
    planner = container(router_pod, "planner")["command"]
    p_args = planner_parser().parse_args(planner[planner.index("agentpool.planner") + 1 :])
    assert p_args.directory_ca_file == args.directory_ca_file
    if "clientSecretName" in tls:
        cert = Path("/var/run/agentpool/directory-client-tls/tls.crt")
        assert args.directory_client_cert_file == p_args.directory_client_cert_file == cert
        assert args.directory_client_key_file == p_args.directory_client_key_file == cert.with_name("tls.key")
    else:
        assert args.directory_client_cert_file is None and p_args.directory_client_key_file is None
    # the engine's loader takes its config; the directory's parser takes its flags
    path = tmp_path / "engine.json"
    path.write_text(obj(objs, "ConfigMap", "sim-engines")["data"]["sim-engine-0.json"])
    engine = load_config(path)
    assert engine.directory is not None and engine.directory.ca_file == args.directory_ca_file
    assert engine.directory.client_cert_file == args.directory_client_cert_file
    directory = container(pod(objs, "Deployment", "sim-directory"), "directory")
    token = tmp_path / "token"
    token.write_text("t" * 32)
    local = [a for a in directory["args"] if not a.startswith(("--auth-token-file", "--redis"))]
    config = directory_parse_args([*local, f"--auth-token-file={token}", "--redis-url="])
    assert config.tls_cert_file == Path("/var/run/agentpool/directory-tls/tls.crt")
    assert config.tls_key_file == Path("/var/run/agentpool/directory-tls/tls.key")
    client_ca = Path("/var/run/agentpool/directory-client-ca/ca.crt") if "clientSecretName" in tls else None
    assert config.tls_client_ca_file == client_ca


def test_tls_changes_no_config_map_and_writes_no_key_material() -> None:
    plain, mutual = build(None), build(MTLS)
    assert obj(plain, "ConfigMap", "sim-config") == obj(mutual, "ConfigMap", "sim-config")
    text = json.dumps(mutual)
    assert "BEGIN" not in text and "PRIVATE KEY" not in text
    assert not [o for o in mutual if o["kind"] == "Secret"]  # the operator creates none for TLS


def test_the_spec_rejects_a_bad_secret_name() -> None:
    manifest = copy.deepcopy(SIM)
    manifest["spec"]["auth"] = {"directoryTls": {"secretName": "Not_A_Name"}}
    with pytest.raises(ValueError, match="secretName"):
        AgentServingPool.model_validate(manifest)
