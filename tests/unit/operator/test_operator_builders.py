"""The pure builders: a table of pools -> the key fields of every child they make."""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentpool.api import AgentServingPool, AgentServingPoolSpec
from agentpool.engine.config import EngineConfig
from agentpool.models.refit import RefitPolicy
from agentpool.operator.builders import BuildSettings, InvalidPoolError, children
from agentpool.operator.builders.secrets import (
    generated_secret,
    generated_secret_keys,
    missing_keys,
    new_secret_values,
)
from agentpool.operator.names import ENGINE_SETTINGS_ANNOTATION, ROLE_ANNOTATION, PoolRef
from agentpool.planner.settings_file import build_config, split_generation
from agentpool.router.config import parse_config

ROOT = Path(__file__).resolve().parents[3]
SIM = yaml.safe_load((ROOT / "examples" / "pool-sim.yaml").read_text())
SGLANG = yaml.safe_load((ROOT / "examples" / "pool-sglang.yaml").read_text())
SETTINGS = BuildSettings(control_plane_image="registry.test/agentpool:1")


def edited(manifest: dict[str, Any], **spec: Any) -> dict[str, Any]:
    out = copy.deepcopy(manifest)
    out["spec"].update(spec)
    return out


def colocated(manifest: dict[str, Any]) -> dict[str, Any]:
    out = edited(manifest, mode="colocated", planner={"enabled": False})
    del out["spec"]["initialSplit"]
    return out


@dataclass(frozen=True)
class Case:
    name: str
    manifest: dict[str, Any]
    gpus: int
    roles: list[str]
    memory_limit: str
    shm_limit: str | None
    planner: bool
    managed_redis: bool = True
    secret_names: dict[str, str] = field(default_factory=dict)
    """volume -> Secret name, where it is not the generated one."""


def _engine_memory_default(manifest: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(manifest)
    del out["spec"]["engine"]["scheduling"]["resources"]["limits"]
    del out["spec"]["engine"]["scheduling"]["resources"]["requests"]["memory"]
    return out


CASES = [
    Case("sim example", SIM, 0, ["prefill"] * 3 + ["decode"] * 3, "4Gi", "3072Mi", planner=True),
    Case("sglang example", SGLANG, 4, ["prefill"] * 4 + ["decode"] * 5, "900Gi", "525312Mi", planner=True),
    Case(
        "sglang, memory from the KV pool",
        _engine_memory_default(SGLANG),
        4,
        ["prefill"] * 4 + ["decode"] * 5,
        f"{(512 + 16) * 1024}Mi",
        "525312Mi",
        planner=True,
    ),
    Case("colocated sim", colocated(SIM), 0, ["both"] * 6, "4Gi", "3072Mi", planner=False),
    Case(
        "existing Redis and tokens",
        edited(
            SIM,
            redis={"existing": {"secretName": "cache", "passwordKey": "pw"}},
            auth={
                "reportToken": {"name": "tokens", "key": "report"},
                "directoryToken": {"name": "tokens", "key": "dir"},
                "engineToken": {"name": "tokens", "key": "engine"},
            },
        ),
        0,
        ["prefill"] * 3 + ["decode"] * 3,
        "4Gi",
        "3072Mi",
        planner=True,
        managed_redis=False,
        secret_names={
            "report-token": "tokens",
            "directory-token": "tokens",
            "engine-token": "tokens",
            "redis-password": "cache",
        },
    ),
    Case(
        "host KV as an integer of bytes",
        edited(SIM, engine={**SIM["spec"]["engine"], "hostKvSize": 1073741824}),
        0,
        ["prefill"] * 3 + ["decode"] * 3,
        "4Gi",
        "2048Mi",
        planner=True,
    ),
]


def build(
    manifest: dict[str, Any], generation: int = 1
) -> tuple[PoolRef, AgentServingPoolSpec, list[dict[str, Any]]]:
    pool = AgentServingPool.model_validate(manifest)
    ref = PoolRef(manifest["metadata"]["name"], "team-a", "0000-uid", {"team": "search"})
    return ref, pool.spec, children(ref, pool.spec, generation, SETTINGS)


def by_kind(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def containers(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in obj["spec"]["template"]["spec"]["containers"]}


def volumes(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in obj["spec"]["template"]["spec"]["volumes"]}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_child_is_owned_and_labelled(case: Case) -> None:
    ref, _, objs = build(case.manifest)
    for obj in objs:
        meta = obj["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "agentpool.io/v1alpha1",
                "kind": "AgentServingPool",
                "name": ref.name,
                "uid": "0000-uid",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"]["agentpool.io/pool"] == ref.name
        assert meta["labels"]["team"] == "search"
        assert meta["name"].startswith(ref.name + "-")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_child_is_a_valid_kubernetes_object(case: Case) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    _, _, objs = build(case.manifest)
    for obj in objs:
        kubernetes_validate.validate(obj, "1.28", strict=True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_engine_pods(case: Case) -> None:
    ref, spec, objs = build(case.manifest)
    sts = by_kind(objs, "StatefulSet")[f"{ref.name}-engine"]
    assert sts["spec"]["replicas"] == spec.nodes
    assert sts["spec"]["serviceName"] == f"{ref.name}-engine"
    engine = containers(sts)["engine"]
    resources = engine["resources"]
    if case.gpus:
        assert resources["limits"]["nvidia.com/gpu"] == str(case.gpus)
        assert resources["requests"]["nvidia.com/gpu"] == str(case.gpus)
    else:
        assert "nvidia.com/gpu" not in resources["limits"] and "nvidia.com/gpu" not in resources["requests"]
    assert resources["limits"]["memory"] == case.memory_limit
    vols = volumes(sts)
    assert vols["dshm"]["emptyDir"].get("sizeLimit") == case.shm_limit
    assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in engine["volumeMounts"]
    role_item = vols["podinfo"]["downwardAPI"]["items"][0]
    assert role_item["fieldRef"]["fieldPath"] == "metadata.annotations['agentpool.io/role']"
    # the template never sets a role: the planner owns the pods' annotations
    assert ROLE_ANNOTATION not in sts["spec"]["template"]["metadata"]["annotations"]
    # SGLang's disaggregation bootstrap port only where SGLang runs
    assert {p["containerPort"] for p in engine["ports"]} == ({8080, 8998} if case.gpus else {8080})
    assert engine["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert engine["livenessProbe"]["httpGet"]["path"] == "/health"
    assert sts["spec"]["template"]["spec"]["serviceAccountName"] == f"{ref.name}-engine"
    headless = by_kind(objs, "Service")[f"{ref.name}-engine"]
    assert headless["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_initial_roles_reach_the_router(case: Case) -> None:
    ref, _, objs = build(case.manifest)
    cm = by_kind(objs, "ConfigMap")[f"{ref.name}-config"]
    config = parse_config(cm["data"]["router.json"], "json")  # the router's own parser
    assert [n.role.value for n in config.nodes] == case.roles
    assert [n.id for n in config.nodes] == [f"{ref.name}-engine-{i}" for i in range(len(case.roles))]
    assert config.nodes[0].url == f"http://{ref.name}-engine-0.{ref.name}-engine.team-a.svc:8080"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_planner_beside_the_router(case: Case) -> None:
    ref, spec, objs = build(case.manifest)
    router = by_kind(objs, "Deployment")[f"{ref.name}-router"]
    pod = router["spec"]["template"]["spec"]
    cs = containers(router)
    assert pod["automountServiceAccountToken"] is False
    assert not any(
        m["mountPath"].startswith("/var/run/secrets/kubernetes.io") for m in cs["router"]["volumeMounts"]
    )
    cm = by_kind(objs, "ConfigMap")[f"{ref.name}-config"]
    if not case.planner:
        assert set(cs) == {"router"}
        assert "planner.json" not in cm["data"]
        return
    planner = cs["planner"]
    assert {
        "name": "planner-api",
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly": True,
    } in planner["volumeMounts"]
    command = planner["command"]
    lease_end = command.index("--")
    assert command[:3] == ["python", "-m", "agentpool.operator.lease"]
    assert f"--name={ref.name}-planner" in command[:lease_end]
    assert command[lease_end + 1 : lease_end + 4] == ["python", "-m", "agentpool.planner"]
    assert "--pool-uid=0000-uid" in command
    assert f"--selector=agentpool.io/pool={ref.name},app.kubernetes.io/component=engine" in command
    assert f"--router-selector=agentpool.io/pool={ref.name},app.kubernetes.io/component=router" in command
    assert "--router-token-file=/var/run/agentpool/report/token" in command
    # the planner reads its settings through its own loader
    values, generation = split_generation(json.loads(cm["data"]["planner.json"]))
    assert generation == 1  # what it reports as the generation it runs
    config = build_config(values, {})
    assert config.initial_prefill == spec.initial_prefill
    assert config.window_s == spec.planner.settings().window_s


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_redis_and_credentials(case: Case) -> None:
    ref, _, objs = build(case.manifest)
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert (("StatefulSet", f"{ref.name}-redis") in names) == case.managed_redis
    assert (("Service", f"{ref.name}-redis") in names) == case.managed_redis
    directory = by_kind(objs, "Deployment")[f"{ref.name}-directory"]
    d = containers(directory)["directory"]
    if case.managed_redis:
        assert f"--redis-url=redis://{ref.name}-redis.team-a.svc:6379/0" in d["args"]
        redis = by_kind(objs, "StatefulSet")[f"{ref.name}-redis"]
        assert containers(redis)["redis"]["command"] == ["redis-server", "/etc/redis/redis.conf"]
    else:
        assert "--redis-url=$(AGENTPOOL_REDIS_URL)" in d["args"]
        assert d["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "cache", "key": "url"}
    assert "--redis-password-file=/var/run/agentpool/redis/password" in d["args"]
    generated = {k: f"{ref.name}-auth" for k in ("report-token", "directory-token", "engine-token")}
    if case.managed_redis:
        generated["redis-password"] = f"{ref.name}-redis"
    expected = {**generated, **case.secret_names}
    for obj in objs:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            for name, vol in volumes(obj).items():
                if name in expected:
                    assert vol["secret"]["secretName"] == expected[name], (obj["metadata"]["name"], name)


def test_no_credential_in_a_config_map_or_command_line() -> None:
    ref, spec, objs = build(SIM)
    secrets = {
        name: new_secret_values(keys, lambda: "S3CRET-" + "x" * 20)
        for name, keys in generated_secret_keys(ref, spec).items()
    }
    assert set(secrets) == {"sim-auth", "sim-redis"}
    assert "requirepass S3CRET-" in secrets["sim-redis"]["redis.conf"]
    text = json.dumps(objs)
    assert "S3CRET" not in text
    router = json.loads(by_kind(objs, "ConfigMap")["sim-config"]["data"]["router.json"])
    assert router.get("reportToken") is None  # engines' token: a mounted file, never the config
    secret = generated_secret(ref, "sim-auth", "auth", secrets["sim-auth"])
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "0000-uid"


def test_named_secrets_are_not_generated() -> None:
    manifest = CASES[4].manifest
    ref, spec, _ = build(manifest)
    assert generated_secret_keys(ref, spec) == {}
    ref, spec, _ = build(edited(SIM, auth={"reportToken": {"name": "t", "key": "k"}}))
    assert generated_secret_keys(ref, spec) == {
        "sim-auth": ("directory-token", "engine-token"),
        "sim-redis": ("password", "redis.conf"),
    }


def test_least_privilege() -> None:
    _, _, objs = build(SIM)
    roles = by_kind(objs, "Role")
    assert set(roles) == {"sim-engine", "sim-planner"}
    engine_pods = [f"sim-engine-{i}" for i in range(6)]
    # engines: read their pool's engine pods only, by name; they write nothing to the API
    assert roles["sim-engine"]["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["get", "list", "watch"],
            "resourceNames": engine_pods,
        }
    ]
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    pod_writers = [
        (name, rule["verbs"], rule["resourceNames"])
        for name, role in roles.items()
        for rule in role["rules"]
        if "pods" in rule["resources"] and writes & set(rule["verbs"])
    ]
    assert pod_writers == [("sim-planner", ["patch"], engine_pods)]  # only the planner patches pods
    engine_verbs = {v for rule in roles["sim-engine"]["rules"] for v in rule["verbs"]}
    assert not engine_verbs & writes  # engines cannot patch (nor write) anything
    for rule in roles["sim-planner"]["rules"]:
        assert (
            "*" not in rule["verbs"] and "delete" not in rule["verbs"] and "secrets" not in rule["resources"]
        )
    accounts = by_kind(objs, "ServiceAccount")
    assert accounts["sim-directory"]["automountServiceAccountToken"] is False
    assert accounts["sim-redis"]["automountServiceAccountToken"] is False
    bindings = by_kind(objs, "RoleBinding")
    assert {b["roleRef"]["name"]: b["subjects"][0]["name"] for b in bindings.values()} == {
        "sim-engine": "sim-engine",
        "sim-planner": "sim-planner",
    }


def test_an_slo_or_policy_edit_changes_only_the_config_map() -> None:
    _, _, before = build(SIM, generation=1)
    edit = edited(SIM, slo={"ttft": {"base": "3s"}, "tpot": "40ms"}, router={"policy": "smetric"})
    edit["spec"]["planner"] = {**SIM["spec"]["planner"], "cooldown": "5m"}
    _, _, after = build(edit, generation=2)
    changed = [a["metadata"]["name"] for a, b in zip(after, before, strict=True) if a != b]
    assert changed == ["sim-config"]  # not the engines' ConfigMap, not a pod template
    cm = by_kind(after, "ConfigMap")["sim-config"]
    assert cm["metadata"]["annotations"]["agentpool.io/generation"] == "2"
    router = parse_config(cm["data"]["router.json"], "json")
    assert (router.policy, router.generation) == ("smetric", 2)  # the router reports the generation
    planner = json.loads(cm["data"]["planner.json"])
    assert (planner["cooldown_s"], planner["generation"]) == (300.0, 2)
    before_cm = by_kind(before, "ConfigMap")["sim-config"]
    assert parse_config(before_cm["data"]["router.json"], "json").generation == 1


def test_the_refit_thresholds_reach_the_planners_settings_file_and_only_it() -> None:
    _, _, before = build(SIM, generation=1)
    edit = edited(SIM)
    refit = {"margin": 2, "minRecords": 50, "minShare": 0.25, "maxError": 0.2, "maxRecords": 1000}
    edit["spec"]["planner"] = {**SIM["spec"]["planner"], "refit": refit}
    _, _, after = build(edit, generation=2)
    changed = [a["metadata"]["name"] for a, b in zip(after, before, strict=True) if a != b]
    assert changed == ["sim-config"]  # read live by the planner: no pod restarts
    values, _ = split_generation(
        json.loads(by_kind(after, "ConfigMap")["sim-config"]["data"]["planner.json"])
    )
    config = build_config(values, {})  # through the planner's own loader
    assert config.refit and config.refit_policy() == RefitPolicy(
        margin=2.0, min_records=50, min_share=0.25, max_error=0.2, max_records=1000
    )
    values, _ = split_generation(
        json.loads(by_kind(before, "ConfigMap")["sim-config"]["data"]["planner.json"])
    )
    assert build_config(values, {}).refit_policy() == RefitPolicy()  # left out: the defaults


def test_the_iteration_model_reaches_the_routers_node_model_and_the_planners_prior() -> None:
    coefficients = {"c0": 0.012, "c1": 4e-5, "c2": 2e-10, "c3": 1e-7, "d0": 0.009, "d1": 0.004, "d2": 2e-4}
    _, _, before = build(SIM, generation=1)
    edit = edited(SIM)
    edit["spec"]["model"] = {**SIM["spec"]["model"], "iterationModel": coefficients}
    _, _, after = build(edit, generation=2)
    changed = [a["metadata"]["name"] for a, b in zip(after, before, strict=True) if a != b]
    assert changed == ["sim-config"]  # both read it live: no pod restarts
    cm = by_kind(after, "ConfigMap")["sim-config"]
    model = parse_config(cm["data"]["router.json"], "json").node_model
    assert {k: getattr(model, k) for k in coefficients} == coefficients
    values, _ = split_generation(json.loads(cm["data"]["planner.json"]))
    prior = build_config(values, {}).prior_model  # through the planner's own loader
    assert prior is not None and dataclasses.asdict(prior) == coefficients
    values, _ = split_generation(
        json.loads(by_kind(before, "ConfigMap")["sim-config"]["data"]["planner.json"])
    )
    assert build_config(values, {}).prior_model is None  # left out: no prior
    default = parse_config(
        by_kind(before, "ConfigMap")["sim-config"]["data"]["router.json"], "json"
    ).node_model
    assert default.c0 != coefficients["c0"]  # the router's generic defaults


def test_the_models_context_length_caps_the_routers_prompts() -> None:
    _, _, before = build(SIM, generation=1)
    edit = edited(SIM)
    edit["spec"]["model"] = {**SIM["spec"]["model"], "contextLength": 262_144}
    _, _, after = build(edit, generation=2)
    changed = [a["metadata"]["name"] for a, b in zip(after, before, strict=True) if a != b]
    # the router reads it live; the engines read it at start, so their template's digest rolls them
    assert changed == ["sim-config", "sim-engines", "sim-engine"]
    assert engine_settings(after) != engine_settings(before)
    data = by_kind(after, "ConfigMap")["sim-config"]["data"]["router.json"]
    assert parse_config(data, "json").prompt_cap == parse_config(data, "json").context_length == 262_144
    # the sim engines refuse a longer request (400), as SGLang's --context-length does
    engines = by_kind(after, "ConfigMap")["sim-engines"]["data"]
    assert {EngineConfig.model_validate_json(v).sim.context_length for v in engines.values()} == {262_144}
    engines = by_kind(before, "ConfigMap")["sim-engines"]["data"]
    assert {EngineConfig.model_validate_json(v).sim.context_length for v in engines.values()} == {None}
    data = by_kind(before, "ConfigMap")["sim-config"]["data"]["router.json"]
    assert parse_config(data, "json").context_length is None  # left out: the default cap
    assert parse_config(data, "json").prompt_cap == 1 << 21


def test_a_scale_changes_engines_and_who_may_be_patched() -> None:
    _, _, before = build(SIM)
    _, _, after = build(edited(SIM, nodes=8))
    changed = sorted(
        {(a["kind"], a["metadata"]["name"]) for a, b in zip(after, before, strict=True) if a != b}
    )
    assert changed == [
        ("ConfigMap", "sim-config"),
        ("ConfigMap", "sim-engines"),
        ("Role", "sim-engine"),
        ("Role", "sim-planner"),
        ("StatefulSet", "sim-engine"),
    ]
    assert engine_settings(after) == engine_settings(before)  # no engine restarts for a scale


def engine_settings(objs: list[dict[str, Any]]) -> str:
    """The engine pod template's digest of the settings engines read at start."""
    template = by_kind(objs, "StatefulSet")["sim-engine"]["spec"]["template"]
    digest: str = template["metadata"]["annotations"][ENGINE_SETTINGS_ANNOTATION]
    return digest


SIM_ENGINE = SIM["spec"]["engine"]


@pytest.mark.parametrize(
    ("edit", "rolls"),
    [
        ({"engine": {**SIM_ENGINE, "hostKvSize": "1Gi"}}, True),
        ({"model": {**SIM["spec"]["model"], "contextLength": 32_768}}, True),
        ({"kvPool": {**SIM["spec"].get("kvPool", {}), "pageSize": 128}}, True),
        ({"nodes": 9}, False),
        ({"initialSplit": {"prefill": 2}}, False),
        ({"slo": {"ttft": {"base": "3s"}, "tpot": "40ms"}}, False),
        ({"router": {"policy": "smetric"}}, False),
    ],
    ids=["host KV size", "context length", "page size", "scale", "initial split", "SLO", "router policy"],
)
def test_engine_settings_roll_the_engines_and_nothing_else_does(edit: dict[str, Any], rolls: bool) -> None:
    """The engines read their ConfigMap only at start: a change to what they read changes the pod
    template (the StatefulSet then replaces them one at a time, each draining on SIGTERM)."""
    _, _, before = build(SIM)
    _, _, after = build(edited(SIM, **edit))
    assert (engine_settings(after) != engine_settings(before)) is rolls


def test_sglang_arguments_roll_the_engines() -> None:
    _, _, before = build(SGLANG)
    edit = edited(SGLANG)
    edit["spec"]["engine"] = {**SGLANG["spec"]["engine"], "args": ["--mem-fraction-static", "0.7"]}
    _, _, after = build(edit)
    digests = [
        by_kind(objs, "StatefulSet")[f"{SGLANG['metadata']['name']}-engine"]["spec"]["template"]["metadata"][
            "annotations"
        ][ENGINE_SETTINGS_ANNOTATION]
        for objs in (before, after)
    ]
    assert digests[0] != digests[1]


@pytest.mark.parametrize(
    ("manifest", "name", "message"),
    [
        (SIM, "p" * 46, "metadata.name is 46 characters"),
        (
            edited(SIM, engine={**SIM["spec"]["engine"], "hostKvSize": 0}),
            "sim",
            "hostKvSize (0) is below one KV block",
        ),
        (
            edited(SIM, engine={**SIM["spec"]["engine"], "hostKvSize": "8Gi"}),
            "sim",
            "limits.memory (4Gi) is smaller than spec.engine.hostKvSize (8Gi)",
        ),
        (
            edited(
                SIM,
                engine={
                    **SIM["spec"]["engine"],
                    "scheduling": {"resources": {"requests": {"memory": "5Gi"}, "limits": {"memory": "4Gi"}}},
                },
            ),
            "sim",
            "requests.memory (5Gi) exceeds its limit (4Gi)",
        ),
    ],
)
def test_deeper_validation(manifest: dict[str, Any], name: str, message: str) -> None:
    pool = AgentServingPool.model_validate(manifest)
    with pytest.raises(InvalidPoolError, match=message.replace("(", r"\(").replace(")", r"\)")):
        children(PoolRef(name, "ns", "uid"), pool.spec, 1, SETTINGS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_engine_configs_load_in_the_engine_agent(case: Case, tmp_path: Path) -> None:
    """Every node's file passes the engine agent's own loader, with the right id, role and peers."""
    from agentpool.engine.config import load_config

    ref, spec, objs = build(case.manifest)
    engines = by_kind(objs, "ConfigMap")[f"{ref.name}-engines"]
    assert sorted(engines["data"]) == sorted(f"{ref.name}-engine-{i}.json" for i in range(spec.nodes))
    for i in range(spec.nodes):
        pod = f"{ref.name}-engine-{i}"
        path = tmp_path / f"{pod}.json"
        path.write_text(engines["data"][f"{pod}.json"])
        config = load_config(path)
        assert config.node_id == pod
        assert config.advertise_url == f"http://{pod}.{ref.name}-engine.team-a.svc:8080"
        assert config.role.value == case.roles[i]
        assert config.host_kv_bytes == spec.engine.host_kv_bytes
        assert config.kube is not None and config.kube.pod == pod
        assert (
            config.peer_url(f"{ref.name}-engine-0")
            == f"http://{ref.name}-engine-0.{ref.name}-engine.team-a.svc:8080"
        )
        assert str(config.routers[0].token_file) == "/var/run/agentpool/report/token"
        assert str(config.token_file) == "/var/run/agentpool/engine/token"  # its API's (a Secret)
    sts = by_kind(objs, "StatefulSet")[f"{ref.name}-engine"]
    command = containers(sts)["engine"]["command"]
    assert command[command.index("--config") + 1] == "/etc/agentpool/config/$(POD_NAME).json"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_command_line_parses_in_its_service(case: Case, tmp_path: Path) -> None:
    """The flags the pods run with are the services' own (their parsers, not a copy of them)."""
    from agentpool.directory.server import parse_args as directory_args
    from agentpool.engine.__main__ import parse_args as engine_parse_args
    from agentpool.operator.lease import parse_args as lease_args
    from agentpool.planner.process import parser as planner_parser
    from agentpool.router.__main__ import parser as router_parser

    ref, _, objs = build(case.manifest)
    deployments = by_kind(objs, "Deployment")
    directory = containers(deployments[f"{ref.name}-directory"])["directory"]
    assert directory["command"] == ["python", "-m", "agentpool.directory"]
    for mounted in ("directory/token", "redis/password", "report/token"):  # the mounted Secrets
        (tmp_path / mounted).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / mounted).write_text("t" * 43)
    config = directory_args([a.replace("/var/run/agentpool", str(tmp_path)) for a in directory["args"]])
    assert config.port == 50061
    assert config.max_nodes >= 4096  # no pool is refused by its own directory
    engine = containers(by_kind(objs, "StatefulSet")[f"{ref.name}-engine"])["engine"]
    assert engine["command"][:3] == ["python3", "-m", "agentpool.engine"]
    engine_args = engine_parse_args(engine["command"][3:])
    assert engine_args.drain_timeout_s < engine_pod_grace(by_kind(objs, "StatefulSet")[f"{ref.name}-engine"])
    router = containers(deployments[f"{ref.name}-router"])
    args = router_parser().parse_args(router["router"]["args"])
    assert args.directory == f"{ref.name}-directory.team-a.svc:50061"
    if case.planner:
        lease = lease_args(router["planner"]["command"][3:])
        assert lease.command[:3] == ["python", "-m", "agentpool.planner"]
        planner = planner_parser().parse_args(lease.command[3:])
        assert planner.pool == ref.name and planner.in_cluster
        # every router replica by label, with the routers' token; the directory with its own
        assert planner.router == []
        assert planner.router_selector == f"agentpool.io/pool={ref.name},app.kubernetes.io/component=router"
        assert planner.router_port == 8000
        assert str(planner.router_token_file) == "/var/run/agentpool/report/token"
        assert planner.directory == f"{ref.name}-directory.team-a.svc:50061"
        assert str(planner.directory_token_file) == "/var/run/agentpool/directory/token"
        mounts = {m["mountPath"] for m in router["planner"]["volumeMounts"]}
        assert {"/var/run/agentpool/report", "/var/run/agentpool/directory"} <= mounts


def engine_pod_grace(stateful_set: dict[str, Any]) -> float:
    grace: float = stateful_set["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    return grace


def test_the_engine_token_reaches_the_engines_and_the_routers_as_a_mounted_secret() -> None:
    ref, _, objs = build(SIM)
    engines = by_kind(objs, "StatefulSet")[f"{ref.name}-engine"]
    router_pod = by_kind(objs, "Deployment")[f"{ref.name}-router"]
    for obj, container in ((engines, "engine"), (router_pod, "router")):
        vol = volumes(obj)["engine-token"]["secret"]
        assert vol["secretName"] == f"{ref.name}-auth" and vol["items"][0]["key"] == "engine-token"
        mounts = {m["name"]: m["mountPath"] for m in containers(obj)[container]["volumeMounts"]}
        assert mounts["engine-token"] == "/var/run/agentpool/engine"
    assert "--engine-token-file=/var/run/agentpool/engine/token" in containers(router_pod)["router"]["args"]
    # the planner beside the router and the directory never see it
    assert "engine-token" not in {m["name"] for m in containers(router_pod)["planner"]["volumeMounts"]}
    directory = by_kind(objs, "Deployment")[f"{ref.name}-directory"]
    assert "engine-token" not in volumes(directory)


def test_an_auth_secret_from_an_older_operator_gets_only_the_keys_it_lacks() -> None:
    ref, spec, _ = build(SIM)
    keys = generated_secret_keys(ref, spec)
    older = {"data": {"report-token": "cg==", "directory-token": "ZA=="}}
    assert missing_keys(older, keys["sim-auth"]) == ("engine-token",)
    assert missing_keys({"data": {k: "eA==" for k in keys["sim-auth"]}}, keys["sim-auth"]) == ()
    assert missing_keys({"data": {"password": "cA=="}}, keys["sim-redis"]) == ()  # a pair: never half
