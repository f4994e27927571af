"""Launch arguments of upstream SGLang for one pool node: a pure function of :class:`SglangLaunch`.

A prefill or decode node runs disaggregated (``--disaggregation-mode``) with runtime role switching
(``--enable-pd-role-switch``) over the NIXL transfer backend; a colocated node (role ``both``) runs
without disaggregation. Every node keeps a host KV tier (HiCache, write-through, ``--hicache-size``
GiB), publishes KV events over ZMQ (``--kv-events-config``) and exports Prometheus metrics.

With ``l3_socket`` (and a host tier) SGLang also loads the agent's HiCache L3 storage backend
(``--hicache-storage-backend dynamic``, :func:`storage_extra_config`): the pages it writes through
are kept in the agent's host pool, which SGLang's role switch does not clear (``hicache_backend.py``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from agentpool.node import Role

# options we set ourselves: an extra argument repeating one would silently override our choice
_OWNED = frozenset(
    {
        "--model-path",
        "--served-model-name",
        "--host",
        "--port",
        "--page-size",
        "--chunked-prefill-size",
        "--disaggregation-mode",
        "--enable-pd-role-switch",
        "--disaggregation-transfer-backend",
        "--disaggregation-bootstrap-port",
        "--enable-hierarchical-cache",
        "--enable-hicache",
        "--hicache-size",
        "--hicache-ratio",
        "--hicache-write-policy",
        "--hicache-storage-backend",
        "--hicache-storage-backend-extra-config",
        "--kv-events-config",
        "--enable-metrics",
    }
)


class LaunchError(ValueError):
    """The launch settings cannot make a valid SGLang command line."""


@dataclass(frozen=True, slots=True)
class SglangLaunch:
    model: str
    role: Role
    port: int = 30000
    host: str = "127.0.0.1"
    served_name: str | None = None
    tp_size: int | None = None  # None: SGLang's default, or ``--tp-size`` among ``extra``
    page_size: int = 64
    chunked_prefill_tokens: int = 8192
    context_length: int | None = None  # None: the model's own, or ``--context-length`` among ``extra``
    host_kv_gib: int = 0  # 0: no host tier
    kv_events_endpoint: str = "tcp://127.0.0.1:5557"
    kv_events_topic: str = "kv"
    bootstrap_port: int = 8998
    l3_socket: str | None = None  # the agent's L3 store socket: SGLang's storage backend over our pool
    extra: tuple[str, ...] = ()


DEFAULT_LAUNCHER = ("python3", "-m", "sglang.launch_server")


def kv_events_config(endpoint: str, topic: str) -> str:
    """The JSON SGLang's ``--kv-events-config`` parses (``KVEventsConfig``): a bound ZMQ publisher."""
    return json.dumps(
        {"publisher": "zmq", "endpoint": endpoint, "topic": topic, "bind": True}, sort_keys=True
    )


STORAGE_BACKEND = {
    "backend_name": "agentpool",
    "module_path": "agentpool.engine.sglang.hicache_backend",
    "class_name": "AgentPoolStorage",
}


def storage_extra_config(socket_path: str) -> str:
    """SGLang's ``--hicache-storage-backend-extra-config`` for the ``dynamic`` backend: the class its
    ``StorageBackendFactory`` loads, and the socket of the agent's L3 store it connects to."""
    return json.dumps({**STORAGE_BACKEND, "agentpool_socket": socket_path}, sort_keys=True)


def build_args(s: SglangLaunch, launcher: Sequence[str] = DEFAULT_LAUNCHER) -> list[str]:
    """``launcher`` (``python3 -m sglang.launch_server``) followed by the arguments for ``s``."""
    if not launcher:
        raise LaunchError("the launcher command is empty")
    if not s.model:
        raise LaunchError("a model is required")
    for name, port in (("port", s.port), ("bootstrap_port", s.bootstrap_port)):
        if not 0 < port < 65536:
            raise LaunchError(f"{name} out of range: {port}")
    if (s.tp_size is not None and s.tp_size < 1) or s.page_size < 1 or s.host_kv_gib < 0:
        raise LaunchError("tp_size and page_size must be positive, host_kv_gib non-negative")
    if s.chunked_prefill_tokens < s.page_size:
        raise LaunchError("chunked_prefill_tokens must be at least one page")
    if s.l3_socket is not None and (not s.l3_socket.startswith("/") or not s.host_kv_gib):
        raise LaunchError("l3_socket needs an absolute path and a host tier (host_kv_gib > 0)")
    given = {a.split("=", 1)[0] for a in s.extra if a.startswith("--")}
    clash = sorted(given & _OWNED)
    if clash:
        raise LaunchError(f"extra arguments may not set what the engine agent sets: {', '.join(clash)}")
    if s.tp_size is not None and "--tp-size" in given:
        raise LaunchError("--tp-size is set twice: by tp_size and among the extra arguments")
    if s.context_length is not None and "--context-length" in given:
        raise LaunchError("--context-length is set twice: by context_length and among the extra arguments")
    if s.context_length is not None and s.context_length < 1:
        raise LaunchError("context_length must be positive")
    args = [*launcher, "--model-path", s.model]
    if s.served_name:
        args += ["--served-model-name", s.served_name]
    args += ["--host", s.host, "--port", str(s.port)]
    if s.tp_size is not None:
        args += ["--tp-size", str(s.tp_size)]
    args += ["--page-size", str(s.page_size), "--chunked-prefill-size", str(s.chunked_prefill_tokens)]
    if s.context_length is not None:
        args += ["--context-length", str(s.context_length)]
    if s.role is not Role.BOTH:
        args += [
            "--disaggregation-mode",
            s.role.value,
            "--enable-pd-role-switch",
            "--disaggregation-transfer-backend",
            "nixl",
            "--disaggregation-bootstrap-port",
            str(s.bootstrap_port),
        ]
    if s.host_kv_gib:
        args += [
            "--enable-hierarchical-cache",
            "--hicache-size",
            str(s.host_kv_gib),
            "--hicache-write-policy",
            "write_through",
        ]
        if s.l3_socket is not None:
            args += [
                "--hicache-storage-backend",
                "dynamic",
                "--hicache-storage-backend-extra-config",
                storage_extra_config(s.l3_socket),
            ]
    args += [
        "--kv-events-config",
        kv_events_config(s.kv_events_endpoint, s.kv_events_topic),
        "--enable-metrics",
    ]
    return [*args, *s.extra]


def parse_extra(extra: Sequence[str]) -> tuple[str, ...]:
    return tuple(str(a) for a in extra)
