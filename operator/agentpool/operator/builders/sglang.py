"""The engine agent's `sglang` section for a pool with `backend: sglang` (pure).

The agent launches upstream SGLang itself (`python3 -m sglang.launch_server`, from its own argument
builder) on `127.0.0.1:30000`, subscribes to SGLang's KV events on a local ZMQ socket, and gives
SGLang the disaggregation bootstrap port that decode pods reach on the prefill pod's IP. The
operator fills in what comes from the spec: the model, its served name, the tensor-parallel size
(the node's GPUs, unless `spec.engine.args` sets `--tp-size`) and the extra SGLang arguments.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentpool.api import AgentServingPoolSpec
from agentpool.engine.sglang.args import LaunchError, SglangLaunch, build_args
from agentpool.node import Role

SGLANG_PORT = 30000
BOOTSTRAP_PORT = 8998
KV_EVENTS_ENDPOINT = "tcp://127.0.0.1:5557"
KV_EVENTS_TOPIC = "kv"
STARTUP_PROBE_PERIOD_S = 5
STARTUP_PROBE_FAILURES = 360
READY_TIMEOUT_S = STARTUP_PROBE_PERIOD_S * STARTUP_PROBE_FAILURES
"""Model loading may take this long: the agent and the startup probe wait the same 30 minutes."""
STOP_TIMEOUT_S = 30
"""SIGTERM to SGLang, then SIGKILL; well within the pod's termination grace period."""
TP_FLAGS = ("--tp-size", "--tp", "--tensor-parallel-size")
CHUNK_FLAG = "--chunked-prefill-size"
"""The agent sets it (its iteration records need the chunk size): given in `spec.engine.args`, it
moves to the agent's `chunkedPrefillTokens` instead of passing through."""


def _int_flag(args: list[str], flags: tuple[str, ...]) -> tuple[int, int, int] | None:
    """(value, index, argument count) of the first of `flags` in `args` (`--flag 4` or
    `--flag=4`); ValueError for a value that is not a positive integer."""
    for i, arg in enumerate(args):
        flag, sep, value = arg.partition("=")
        if flag not in flags:
            continue
        if not sep:
            value = args[i + 1] if i + 1 < len(args) else ""
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"spec.engine.args: {flag} needs a positive integer, got {value!r}")
        return int(value), i, 1 if sep else 2
    return None


def tp_size_in_args(args: list[str]) -> int | None:
    """The tensor-parallel size `spec.engine.args` sets (`--tp-size 4` or `--tp-size=4`), if any;
    ValueError for a value that is not a positive integer."""
    found = _int_flag(args, TP_FLAGS)
    return None if found is None else found[0]


def split_chunk_size(args: list[str]) -> tuple[int | None, list[str]]:
    """The prefill chunk size `spec.engine.args` sets (`--chunked-prefill-size`), if any, and the
    arguments without it; ValueError for a value that is not a positive integer."""
    found = _int_flag(args, (CHUNK_FLAG,))
    if found is None:
        return None, args
    value, at, count = found
    return value, args[:at] + args[at + count :]


def launch_problem(spec: AgentServingPoolSpec) -> str | None:
    """Why the engine agent would refuse to launch SGLang with this spec (None: it would not): a
    tensor-parallel size other than the node's GPUs, or `spec.engine.args` that set what the agent
    sets itself (the agent's own check, :func:`agentpool.engine.sglang.args.build_args`)."""
    if spec.engine.backend != "sglang":
        return None
    try:
        tp = tp_size_in_args(list(spec.engine.args))
        chunk, args = split_chunk_size(list(spec.engine.args))
    except ValueError as exc:
        return str(exc)
    gpus = spec.engine.gpus_per_node
    if tp is not None and tp != gpus:
        return f"spec.engine.args sets a tensor-parallel size of {tp}, but spec.engine.gpusPerNode is {gpus}"
    launch = SglangLaunch(
        model=spec.model.name,
        role=Role.PREFILL,
        served_name=spec.model.client_name,
        tp_size=None if tp is not None or gpus < 1 else gpus,
        page_size=spec.kv_pool.page_size,
        context_length=spec.model.context_length,
        extra=tuple(args),
    )
    if chunk is not None:
        launch = dataclasses.replace(launch, chunked_prefill_tokens=chunk)
    try:
        build_args(launch)
    except LaunchError as exc:
        return f"spec.engine.args: {exc}"
    return None


def sglang_settings(spec: AgentServingPoolSpec) -> dict[str, Any]:
    """The engine config's `sglang` section (`agentpool.engine` with `backend: sglang`)."""
    chunk, args = split_chunk_size(list(spec.engine.args))
    values: dict[str, Any] = {
        "model": spec.model.name,
        "servedName": spec.model.client_name,
        "port": SGLANG_PORT,
        "kvEventsEndpoint": KV_EVENTS_ENDPOINT,
        "kvEventsTopic": KV_EVENTS_TOPIC,
        "bootstrapPort": BOOTSTRAP_PORT,
        "args": args,
        "readyTimeoutS": READY_TIMEOUT_S,
        "stopTimeoutS": STOP_TIMEOUT_S,
        "requireGpu": True,
    }
    if tp_size_in_args(args) is None and spec.engine.gpus_per_node > 0:
        values["tpSize"] = spec.engine.gpus_per_node
    if chunk is not None:
        values["chunkedPrefillTokens"] = chunk
    if spec.model.context_length is not None:
        values["contextLength"] = spec.model.context_length
    return values
