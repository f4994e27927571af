"""SGLang launch arguments for a pool node (pure builder)."""

from __future__ import annotations

import json

import pytest

from agentpool.engine.sglang.args import LaunchError, SglangLaunch, build_args
from agentpool.node import Role


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_a_prefill_node_runs_disaggregated_with_role_switching_over_nixl() -> None:
    args = build_args(
        SglangLaunch("Qwen/Qwen3-30B-A3B", Role.PREFILL, port=30001, page_size=64, host_kv_gib=200)
    )
    assert args[:4] == ["python3", "-m", "sglang.launch_server", "--model-path"]
    assert flag(args, "--disaggregation-mode") == "prefill"
    assert "--enable-pd-role-switch" in args
    assert flag(args, "--disaggregation-transfer-backend") == "nixl"
    assert "--enable-hierarchical-cache" in args and flag(args, "--hicache-size") == "200"
    assert flag(args, "--hicache-write-policy") == "write_through"
    assert flag(args, "--page-size") == "64" and flag(args, "--port") == "30001"
    assert flag(args, "--chunked-prefill-size") == "8192"  # bounds the prefill iteration records
    assert "--enable-metrics" in args
    assert flag(args, "--disaggregation-bootstrap-port") == "8998"
    assert "--tp-size" not in args  # SGLang's default unless set
    kv = json.loads(flag(args, "--kv-events-config"))
    assert kv == {"bind": True, "endpoint": "tcp://127.0.0.1:5557", "publisher": "zmq", "topic": "kv"}


def test_a_colocated_node_is_not_disaggregated_and_has_no_host_tier_without_memory() -> None:
    args = build_args(SglangLaunch("m", Role.BOTH, extra=("--mem-fraction-static", "0.8")))
    assert "--disaggregation-mode" not in args and "--enable-pd-role-switch" not in args
    assert "--enable-hierarchical-cache" not in args
    assert args[-2:] == ["--mem-fraction-static", "0.8"]


@pytest.mark.parametrize(
    "launch",
    [
        SglangLaunch("", Role.DECODE),
        SglangLaunch("m", Role.DECODE, port=0),
        SglangLaunch("m", Role.DECODE, tp_size=0),
        SglangLaunch("m", Role.DECODE, extra=("--page-size", "16")),
        SglangLaunch("m", Role.DECODE, extra=("--disaggregation-transfer-backend=mooncake",)),
        SglangLaunch("m", Role.DECODE, tp_size=2, extra=("--tp-size", "4")),
        SglangLaunch("m", Role.DECODE, bootstrap_port=70000),
        SglangLaunch("m", Role.DECODE, chunked_prefill_tokens=32),
        SglangLaunch("m", Role.DECODE, extra=("--chunked-prefill-size", "4096")),
        SglangLaunch("m", Role.DECODE, l3_socket="/run/l3.sock"),  # no host tier to back
        SglangLaunch("m", Role.DECODE, host_kv_gib=1, l3_socket="l3.sock"),
        SglangLaunch("m", Role.DECODE, extra=("--hicache-storage-backend", "file")),
        SglangLaunch("m", Role.DECODE, context_length=0),
        SglangLaunch("m", Role.DECODE, context_length=8192, extra=("--context-length=4096",)),
    ],
)
def test_invalid_settings_are_refused(launch: SglangLaunch) -> None:
    with pytest.raises(LaunchError):
        build_args(launch)


def test_the_launcher_and_tp_size_come_first_and_from_the_settings() -> None:
    args = build_args(SglangLaunch("m", Role.DECODE, tp_size=4), launcher=("/usr/bin/stand-in", "-x"))
    assert args[:4] == ["/usr/bin/stand-in", "-x", "--model-path", "m"]
    assert flag(args, "--tp-size") == "4"
    assert "--context-length" not in args  # the model's own unless set
    args = build_args(SglangLaunch("m", Role.DECODE, context_length=262_144))
    assert flag(args, "--context-length") == "262144"
    with pytest.raises(LaunchError, match="empty"):
        build_args(SglangLaunch("m", Role.DECODE), launcher=())


def test_the_agents_l3_storage_backend_is_loaded_through_sglangs_dynamic_factory() -> None:
    args = build_args(SglangLaunch("m", Role.DECODE, host_kv_gib=8, l3_socket="/dev/shm/agentpool-n/l3.sock"))
    assert flag(args, "--hicache-storage-backend") == "dynamic"
    extra = json.loads(flag(args, "--hicache-storage-backend-extra-config"))
    # the three fields SGLang 0.5.23's StorageBackendFactory requires for "dynamic", and our socket
    assert extra == {
        "backend_name": "agentpool",
        "module_path": "agentpool.engine.sglang.hicache_backend",
        "class_name": "AgentPoolStorage",
        "agentpool_socket": "/dev/shm/agentpool-n/l3.sock",
    }
    assert "interface_v1" not in extra  # SGLang's generic page path: batch_set / batch_get
    assert "--hicache-storage-backend" not in build_args(SglangLaunch("m", Role.DECODE, host_kv_gib=8))
