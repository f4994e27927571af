"""`agentpool up` validates the manifest with the API models: one-line errors naming the field."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from agentpool.engine.__main__ import parse_args as engine_args
from agentpool.kv import Role
from agentpool.local.demo import context_limit, demo_manifest
from agentpool.local.pool import (
    DEFAULT_LOCAL_PORTS,
    LOCAL_PORTS_ENV,
    LocalOptions,
    ManifestError,
    PortInUse,
    free_port,
    initial_roles,
    load_manifest,
    local_ports,
    plan,
    port_free,
)
from agentpool.local.supervisor import HttpReady, Supervisor
from agentpool.router.config import parse_config

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pool-sim.yaml"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "pool.yaml"
    p.write_text(text)
    return p


def example_with(old: str, new: str) -> str:
    text = EXAMPLE.read_text()
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("  nodes: 6\n", "  nodes: 0\n", "spec.nodes"),
        ("  nodes: 6\n", "", "spec.nodes"),
        ("    policy: evolving", "    policy: fastest", "spec.router.policy"),
        ("    window: 2m", "    window: soon", "spec.planner.window"),
        ("    prefill: 3", "    prefill: 9", "spec.initialSplit.prefill"),
        ("    backend: sim", "    backend: sglang", "spec.engine"),
        ("kind: AgentServingPool", "kind: Pod", "kind"),
    ],
)
def test_bad_manifest_is_one_line_naming_the_field(tmp_path: Path, old: str, new: str, field: str) -> None:
    with pytest.raises(ManifestError) as e:
        load_manifest(write(tmp_path, example_with(old, new)))
    msg = str(e.value)
    assert "\n" not in msg
    assert field in msg.split(": ", 1)[1], msg


def test_unreadable_and_non_yaml_manifests(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="cannot read"):
        load_manifest(tmp_path / "missing.yaml")
    with pytest.raises(ManifestError, match="not valid YAML"):
        load_manifest(write(tmp_path, "spec: [unclosed\n"))
    with pytest.raises(ManifestError, match="expected an AgentServingPool object"):
        load_manifest(write(tmp_path, "- a list\n"))


def test_plan_of_the_example(tmp_path: Path) -> None:
    pool = load_manifest(EXAMPLE)
    assert initial_roles(pool) == ["prefill"] * 3 + ["decode"] * 3
    p = plan(pool, LocalOptions(router_port=18000), tmp_path)
    names = [s.name for s in p.specs]
    assert names == ["redis", "directory", *(f"engine-{i}" for i in range(6)), "router", "planner"]
    for secret in ("redis-password", "directory-token", "report-token"):
        assert (tmp_path / secret).stat().st_mode & 0o777 == 0o600
        value = (tmp_path / secret).read_text().strip()
        assert all(value not in " ".join(s.argv) for s in p.specs)  # never on a command line
    assert [(p.roles_dir / f"engine-{i}").read_text().strip() for i in range(6)] == initial_roles(pool)
    router = p.specs[-2]
    assert isinstance(router.ready, HttpReady) and ":18000/" in router.ready.url
    assert len({port for _, port in p.ports()}) == len(p.specs) - 1  # all but the planner listen
    # stopping the pool drains each engine (SIGTERM) for less than the supervisor waits before SIGKILL
    engine = p.specs[2]
    assert engine.argv[1:3] == ["-m", "agentpool.engine"]
    assert 0 < engine_args(engine.argv[3:]).drain_timeout_s < Supervisor().grace_s


def test_free_port_is_outside_the_ephemeral_range_free_and_never_handed_out_twice() -> None:
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    taken: set[int] = set()
    ports = [free_port("127.0.0.1", taken) for _ in range(300)]
    assert len(set(ports)) == 300 and taken == set(ports)
    assert not any(low <= p <= high for p in ports)
    # all but two ports taken, one of the two listened on: the other one is the answer
    outside = [p for p in range(20000, 32768) if not low <= p <= high]
    busy, spare = [p for p in outside if port_free("127.0.0.1", p)][:2]
    with socket.socket() as held:
        held.bind(("127.0.0.1", busy))
        held.listen()
        taken = set(outside) - {busy, spare}
        assert free_port("127.0.0.1", taken) == spare and spare in taken
        # the only port of a range taken: an error that says so, not a port outside the range
        said = rf"no free port on 127.0.0.1 in {busy}-{busy} \(0 handed out already, 1 tried and taken\)"
        with pytest.raises(PortInUse, match=said):
            free_port("127.0.0.1", None, range(busy, busy + 1))


def test_a_range_inside_the_ephemeral_one_is_used_as_asked() -> None:
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    inside = range(low + 1000, low + 1100)
    assert inside[-1] <= high  # every port of it is ephemeral
    assert all(free_port("127.0.0.1", None, inside) in inside for _ in range(20))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, DEFAULT_LOCAL_PORTS),
        ("", DEFAULT_LOCAL_PORTS),
        ("24000-24999", range(24000, 25000)),
        (" 30000-30000 ", range(30000, 30001)),
        ("1023-2000", None),  # below 1024
        ("2000-1999", None),  # empty
        ("60000-70000", None),  # above 65535
        ("24000", None),
        ("24000:25000", None),
        ("a-b", None),
    ],
)
def test_local_ports_from_the_environment(value: str | None, expected: range | None) -> None:
    environ = {} if value is None else {LOCAL_PORTS_ENV: value}
    if expected is None:
        with pytest.raises(ManifestError, match=f"{LOCAL_PORTS_ENV} must be LOW-HIGH within 1024-65535"):
            local_ports(environ)
    else:
        assert local_ports(environ) == expected


def test_a_pool_draws_its_ports_from_its_range(tmp_path: Path) -> None:
    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    span = range(high + 1, high + 401) if high < 65000 else range(low - 400, low)  # outside the ephemeral
    p = plan(load_manifest(EXAMPLE), LocalOptions(router_port=18000, ports=span), tmp_path)
    drawn = {port for name, port in p.ports() if name != "router"}
    assert len(drawn) == len(p.specs) - 2 and drawn <= set(span)  # redis, directory, six engines


def test_the_iteration_model_reaches_the_local_router_and_planner(tmp_path: Path) -> None:
    coefficients = {
        "c0": 0.012,
        "c1": 4e-05,
        "c2": 2e-10,
        "c3": 1e-07,
        "d0": 0.009,
        "d1": 0.004,
        "d2": 0.0002,
    }
    # written as Kubernetes reads them: 4e-05 is a number there (YAML 1.1, PyYAML's default, says string)
    written = ", ".join(f"{k}: {v!r}" for k, v in coefficients.items())
    assert "4e-05" in written
    text = EXAMPLE.read_text().replace("  model:\n", f"  model:\n    iterationModel: {{{written}}}\n", 1)
    pool = load_manifest(write(tmp_path, text))
    plan(pool, LocalOptions(router_port=18000), tmp_path)
    model = parse_config((tmp_path / "router.json").read_text(), "json").node_model
    assert {k: getattr(model, k) for k in coefficients} == pytest.approx(coefficients)
    assert json.loads((tmp_path / "planner.json").read_text())["prior_model"] == pytest.approx(coefficients)


def test_the_models_context_length_caps_the_local_routers_prompts(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("  model:\n", "  model:\n    contextLength: 131072\n", 1)
    plan(load_manifest(write(tmp_path, text)), LocalOptions(router_port=18000), tmp_path)
    config = parse_config((tmp_path / "router.json").read_text(), "json")
    assert config.context_length == config.prompt_cap == 131_072
    # the sim engines refuse longer requests (400), as SGLang's --context-length does
    engine = json.loads((tmp_path / "engine-0.json").read_text())
    assert engine["sim"]["contextLength"] == 131_072


def test_local_sim_engines_take_their_presets_context_without_one_in_the_pool(tmp_path: Path) -> None:
    plan(load_manifest(EXAMPLE), LocalOptions(router_port=18000), tmp_path)
    engine = json.loads((tmp_path / "engine-0.json").read_text())
    assert engine["sim"]["contextLength"] == 262_144  # the default preset's model (Qwen3-Coder-30B-A3B)
    assert engine["sim"]["gpuKvTokens"] == 700_000
    # the router caps prompts at the same context (and says it at GET /v1/models)
    config = parse_config((tmp_path / "router.json").read_text(), "json")
    assert config.context_length == config.prompt_cap == 262_144
    # a preset without a published context (GLM-5.2 class): the router keeps its default cap
    plan(load_manifest(EXAMPLE), LocalOptions(router_port=18000, preset="glm52-4xgb300"), tmp_path)
    config = parse_config((tmp_path / "router.json").read_text(), "json")
    assert "contextLength" not in json.loads((tmp_path / "engine-0.json").read_text())["sim"]
    assert config.context_length is None and config.prompt_cap == 1 << 21  # the default cap


def test_the_demo_replays_within_the_engines_and_the_pools_context(tmp_path: Path) -> None:
    demo = load_manifest(demo_manifest())
    assert demo.spec.model.context_length is None
    assert context_limit(demo, "qwen3-30b-a3b-h200") == 262_144  # the preset's model
    assert context_limit(demo, "glm52-4xgb300") == 2_060_000  # no context set: one node's KV
    text = demo_manifest().read_text().replace("  model:\n", "  model:\n    contextLength: 100000\n", 1)
    assert context_limit(load_manifest(write(tmp_path, text)), "qwen3-30b-a3b-h200") == 100_000


def test_the_colocated_example_plans_smetric_routing_over_engines_that_serve_both(tmp_path: Path) -> None:
    example = EXAMPLE.with_name("pool-sim-colocated.yaml")
    planned = plan(load_manifest(example), LocalOptions(router_port=18000), tmp_path)
    config = parse_config((tmp_path / "router.json").read_text(), "json")
    assert config.policy == "smetric"
    assert {n.role for n in config.nodes} == {Role.BOTH} and len(config.nodes) == 4
    assert {json.loads((tmp_path / f"engine-{i}.json").read_text())["role"] for i in range(4)} == {"both"}
    assert not any("planner" in s.name for s in planned.specs)  # nothing to plan
