"""A pool with `backend: sglang` (examples/pool-sglang.yaml): the engine pods run the engine image's
agent with GPUs, /dev/shm, the bootstrap port and startup time for a model load, and each node's
file is what the agent's own loader takes for the sglang backend."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentpool.api import AgentServingPool
from agentpool.engine.config import load_config
from agentpool.operator.builders import BuildSettings, InvalidPoolError, children
from agentpool.operator.builders.sglang import READY_TIMEOUT_S, split_chunk_size, tp_size_in_args
from agentpool.operator.names import PoolRef

ROOT = Path(__file__).resolve().parents[3]
SGLANG = yaml.safe_load((ROOT / "examples" / "pool-sglang.yaml").read_text())
REF = PoolRef("qwen3-coder", "agents", "0000-uid")


def build(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return children(REF, AgentServingPool.model_validate(manifest).spec, 1, BuildSettings())


def engine_pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (sts,) = [o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "qwen3-coder-engine"]
    spec: dict[str, Any] = sts["spec"]["template"]["spec"]
    return spec


def with_args(args: list[str], gpus: int = 4) -> dict[str, Any]:
    manifest = copy.deepcopy(SGLANG)
    manifest["spec"]["engine"]["args"] = args
    manifest["spec"]["engine"]["gpusPerNode"] = gpus
    return manifest


def test_the_engine_pod_runs_the_agent_with_gpus_shm_and_the_bootstrap_port() -> None:
    pod = engine_pod(build(SGLANG))
    (engine,) = pod["containers"]
    assert engine["image"] == "ghcr.io/agentpool/engine:0.1.0"  # built from engine-image/Dockerfile
    assert engine["command"][:3] == ["python3", "-m", "agentpool.engine"]  # the image's interpreter
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in engine["volumeMounts"]
    (shm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {(p["name"], p["containerPort"]) for p in engine["ports"]} == {("http", 8080), ("bootstrap", 8998)}
    startup = engine["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == READY_TIMEOUT_S  # the agent's wait
    assert pod["terminationGracePeriodSeconds"] >= 30 + 5  # SGLang's stop timeout and some


@pytest.mark.parametrize(
    ("args", "gpus", "tp", "chunk"),
    [
        (["--tp-size", "4", "--mem-fraction-static", "0.85"], 4, None, 8192),  # args say the TP size
        (["--tp-size=4"], 4, None, 8192),
        (["--mem-fraction-static", "0.85"], 4, 4, 8192),  # from the node's GPUs
        ([], 8, 8, 8192),
        (["--chunked-prefill-size", "4096"], 8, 8, 4096),  # moved to the agent, which sets it
    ],
)
def test_each_node_file_loads_in_the_agent_with_the_sglang_section(
    args: list[str], gpus: int, tp: int | None, chunk: int, tmp_path: Path
) -> None:
    objs = build(with_args(args, gpus))
    (engines,) = [
        o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "qwen3-coder-engines"
    ]
    for i in (0, 8):
        path = tmp_path / f"qwen3-coder-engine-{i}.json"
        path.write_text(engines["data"][path.name])
        config = load_config(path)  # the agent's own loader
        assert config.backend == "sglang"
        sglang = config.sglang
        assert sglang is not None
        assert (sglang.model, sglang.served_name) == ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3-coder")
        assert (sglang.port, sglang.bootstrap_port, sglang.tp_size) == (30000, 8998, tp)
        assert sglang.args == [a for a in args if a not in ("--chunked-prefill-size", "4096")]
        assert sglang.chunked_prefill_tokens == chunk
        assert sglang.context_length == 262_144  # spec.model.contextLength: SGLang's --context-length
        assert sglang.ready_timeout_s == READY_TIMEOUT_S and sglang.require_gpu
        assert config.page_size == 64 and config.host_kv_bytes == 512 * 2**30
        assert config.role.value == ("prefill" if i < 4 else "decode")
        assert "sglangUrl" not in json.loads(path.read_text())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tp-size", "8"], "tensor-parallel size of 8, but spec.engine.gpusPerNode is 4"),
        (["--tp-size"], "--tp-size needs a positive integer"),
        (["--tp=0"], "--tp needs a positive integer"),
        (["--port", "31000"], "may not set what the engine agent sets: --port"),  # the agent's own check
        (["--page-size=16", "--kv-events-config", "{}"], "--kv-events-config, --page-size"),
        (["--context-length", "131072"], "--context-length is set twice"),  # spec.model.contextLength
    ],
)
def test_a_tensor_parallel_size_that_does_not_fit_the_node_is_an_invalid_pool(
    args: list[str], message: str
) -> None:
    with pytest.raises(InvalidPoolError, match=message):
        build(with_args(args))


def test_tp_size_in_args() -> None:
    assert tp_size_in_args(["--chunked-prefill-size", "8192", "--tp-size", "2"]) == 2
    assert tp_size_in_args(["--tensor-parallel-size=4"]) == 4
    assert tp_size_in_args(["--mem-fraction-static", "0.85"]) is None


@pytest.mark.parametrize(
    ("args", "chunk", "rest"),
    [
        (["--tp-size", "4", "--chunked-prefill-size", "4096", "--x"], 4096, ["--tp-size", "4", "--x"]),
        (["--chunked-prefill-size=2048"], 2048, []),
        (["--mem-fraction-static", "0.85"], None, ["--mem-fraction-static", "0.85"]),
    ],
)
def test_the_chunk_size_moves_from_the_args_to_the_agent(
    args: list[str], chunk: int | None, rest: list[str]
) -> None:
    assert split_chunk_size(args) == (chunk, rest)


def test_a_bad_chunk_size_is_refused() -> None:
    with pytest.raises(ValueError, match="--chunked-prefill-size needs a positive integer"):
        split_chunk_size(["--chunked-prefill-size", "lots"])
