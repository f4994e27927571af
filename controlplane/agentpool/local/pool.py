"""The local pool: an `AgentServingPool` manifest turned into processes on one machine.

:func:`load_manifest` validates the manifest with the API models (one-line errors naming the
field). :func:`plan` turns it into the process specs the :class:`~agentpool.local.supervisor.Supervisor`
runs, in start order: Redis (unless one is given), the directory (gRPC), the engines (``sim``
backend, HTTP + NIXL host pools), the router and the planner. Secrets (the directory's token,
the engines' report token, the engine token of the engines' own API and lease channel, Redis'
password) are generated into files (0600) in the pool's work directory (0700); no secret is on a
command line. Roles flow as in a cluster: the desired role
of each engine is a file in ``roles/`` (the local stand-in for the pod annotation); the planner
writes it and the engine reads it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import secrets
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from agentpool.api import AgentServingPool
from agentpool.local.supervisor import HttpReady, ProcessSpec, TcpReady
from agentpool.planner.from_spec import moe_shape, planner_config
from agentpool.router.config import NodeConfig, config_from_settings, render_config
from agentpool.sim.presets import preset

DEFAULT_PRESET = "qwen3-30b-a3b-h200"
ENGINE_DRAIN_S = 5.0
"""How long a local engine's requests may run after SIGTERM (``--drain-timeout-s``): under the
supervisor's 10 s before SIGKILL, so that stopping the pool stops every engine cleanly."""


class ManifestError(ValueError):
    """The manifest cannot be read or is not a valid AgentServingPool (one line, names the field)."""


class PortInUse(ValueError):
    """A port the pool needs is taken."""


class ManifestLoader(yaml.SafeLoader):
    """YAML as Kubernetes reads a manifest: also ``4e-5`` (no decimal point) is a number, which
    YAML 1.1's float pattern, and so PyYAML's safe loader, leaves a string."""


ManifestLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_manifest(path: Path) -> AgentServingPool:
    """The manifest at ``path``, validated (any backend)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ManifestError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        raw = yaml.load(text, Loader=ManifestLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as e:
        raise ManifestError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: expected an AgentServingPool object, got {type(raw).__name__}")
    try:
        pool = AgentServingPool.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise ManifestError(f"{path}: {where}: {first['msg'].removeprefix('Value error, ')}{more}") from None
    return pool


def load_manifest(path: Path) -> AgentServingPool:
    """The manifest at ``path``, validated, for a local pool (the sim backend)."""
    pool = read_manifest(path)
    if pool.spec.engine.backend != "sim":
        raise ManifestError(
            f"{path}: spec.engine.backend: the local pool runs the sim backend, "
            f"not {pool.spec.engine.backend!r}"
        )
    return pool


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


LOCAL_PORTS_ENV = "AGENTPOOL_LOCAL_PORTS"
DEFAULT_LOCAL_PORTS = range(20000, 32768)


def local_ports(environ: Mapping[str, str] = os.environ) -> range:
    """The ports a local pool hands its services: ``AGENTPOOL_LOCAL_PORTS`` as ``LOW-HIGH`` (both
    included, within 1024-65535), by default 20000-32767. Two pools, or two test runs, started at the
    same time on one machine each draw from a range of their own."""
    given = environ.get(LOCAL_PORTS_ENV, "").strip()
    if not given:
        return DEFAULT_LOCAL_PORTS
    m = re.fullmatch(r"(\d{1,5})-(\d{1,5})", given)
    low, high = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if not 1024 <= low <= high <= 65535:
        raise ManifestError(f"{LOCAL_PORTS_ENV} must be LOW-HIGH within 1024-65535, got {given!r}")
    return range(low, high + 1)


def free_port(
    host: str = "127.0.0.1", taken: set[int] | None = None, ports: range = DEFAULT_LOCAL_PORTS
) -> int:
    """A port of ``ports`` free now and outside the kernel's ephemeral range, so that no connection
    or ``bind(0)`` of another program takes it between now and when the service binds it (a pool
    starts in seconds, and NIXL's UCX alone binds several ephemeral ports per engine). ``taken``:
    ports already handed out and perhaps not bound yet; the one returned is added to it. When every
    port of ``ports`` is in the ephemeral range, they are drawn from all the same (they were asked
    for); when none is free, :class:`PortInUse` says so (never a port outside ``ports``)."""
    low, high = _ephemeral_range()
    skip = taken if taken is not None else set()
    outside = [p for p in ports if not low <= p <= high] or list(ports)
    candidates = [p for p in outside if p not in skip]
    tried = secrets.SystemRandom().sample(candidates, min(200, len(candidates)))
    for port in tried:
        if port_free(host, port):
            skip.add(port)
            return port
    handed = len(outside) - len(candidates)
    raise PortInUse(
        f"no free port on {host} in {ports.start}-{ports.stop - 1} ({handed} handed out already, "
        f"{len(tried)} tried and taken); {LOCAL_PORTS_ENV}=LOW-HIGH gives the pool other ports"
    )


def engine_available() -> bool:
    """Whether the engine agent (``python -m agentpool.engine``) is installed."""
    return importlib.util.find_spec("agentpool.engine.__main__") is not None


@dataclass(frozen=True, slots=True)
class LocalOptions:
    host: str = "127.0.0.1"
    router_port: int = 8000
    redis_url: str | None = None  # None: start a redis-server
    redis_password_file: Path | None = None
    time_scale: float = 1.0  # the sim engines' model seconds per wall second
    host_kv_bytes: int | None = None  # None: the manifest's hostKvSize
    engines: bool = True  # False: the control plane only (no engine processes)
    preset: str = DEFAULT_PRESET  # the node class the sim engines model (agentpool.sim presets)
    # real bytes per KV block in the engines' host pools (NIXL moves them); a GPU's real KV block is
    # megabytes, which one machine cannot hold for a whole pool: the sim engines' bytes stand in
    block_bytes: int = 4096
    planner: bool = True
    ports: range = DEFAULT_LOCAL_PORTS  # what the services are given (the router's is router_port)


@dataclass(slots=True)
class PoolPlan:
    """Everything ``up`` starts, and where it listens."""

    name: str
    workdir: Path
    specs: list[ProcessSpec] = field(default_factory=list)
    endpoints: dict[str, str] = field(default_factory=dict)
    engine_urls: dict[str, str] = field(default_factory=dict)
    roles_dir: Path = Path()
    router_url: str = ""
    directory_target: str = ""
    model: str = ""

    def ports(self) -> list[tuple[str, int]]:
        out = []
        for s in self.specs:
            if isinstance(s.ready, TcpReady):
                out.append((s.name, s.ready.port))
            elif isinstance(s.ready, HttpReady):
                out.append((s.name, int(s.ready.url.split(":")[2].split("/")[0])))
        return out


def write_secret(path: Path, value: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    return path


def initial_roles(pool: AgentServingPool) -> list[str]:
    spec = pool.spec
    if spec.mode == "colocated":
        return ["both"] * spec.nodes
    return ["prefill"] * spec.initial_prefill + ["decode"] * spec.initial_decode


def plan(pool: AgentServingPool, options: LocalOptions, workdir: Path) -> PoolPlan:
    """The processes of ``pool`` on this machine; writes their config and secret files in ``workdir``."""
    spec = pool.spec
    name = str(pool.metadata.get("name") or "pool")
    host = options.host
    ports: set[int] = {options.router_port}  # handed out below, bound only when each service starts
    py = sys.executable
    logs = workdir / "logs"
    out = PoolPlan(name=name, workdir=workdir, roles_dir=workdir / "roles", model=spec.model.client_name)
    out.roles_dir.mkdir(parents=True, exist_ok=True)

    # Redis
    redis_url = options.redis_url
    password_file = options.redis_password_file
    if redis_url is None:
        redis_port = free_port(host, ports, options.ports)
        password = secrets.token_urlsafe(24)
        password_file = write_secret(workdir / "redis-password", password)
        conf = (
            f'bind {host}\nport {redis_port}\nrequirepass {password}\nsave ""\nappendonly no\n'
            f"dir {workdir}\nprotected-mode yes\n"
        )
        out.specs.append(
            ProcessSpec(
                "redis", ["redis-server", "-"], TcpReady(host, redis_port), logs / "redis.log", conf.encode()
            )
        )
        redis_url = f"redis://{host}:{redis_port}/0"
    out.endpoints["redis"] = redis_url

    # directory
    dir_port = free_port(host, ports, options.ports)
    dir_token = write_secret(workdir / "directory-token", secrets.token_urlsafe(32))
    dir_argv = [
        py,
        "-m",
        "agentpool.directory",
        "--host",
        host,
        "--port",
        str(dir_port),
        "--redis-url",
        redis_url,
        "--namespace",
        f"agentpool:local:{name}:{secrets.token_hex(4)}",
        "--page-size",
        str(spec.kv_pool.page_size),
        "--auth-token-file",
        str(dir_token),
        "--node-timeout-s",
        "5",
    ]
    if password_file is not None:
        dir_argv += ["--redis-password-file", str(password_file)]
    out.specs.append(ProcessSpec("directory", dir_argv, TcpReady(host, dir_port), logs / "directory.log"))
    out.directory_target = f"{host}:{dir_port}"
    out.endpoints["directory"] = f"grpc://{out.directory_target}"

    # engines (listed in the router's config, which the router re-reads on change)
    report_token = write_secret(workdir / "report-token", secrets.token_urlsafe(32))
    engine_token = write_secret(workdir / "engine-token", secrets.token_urlsafe(32))
    router_url = f"http://{host}:{options.router_port}"
    roles = initial_roles(pool)
    nodes: list[NodeConfig] = []
    node_names = [f"engine-{i}" for i in range(spec.nodes)] if options.engines else []
    engine_ports = {node: free_port(host, ports, options.ports) for node in node_names}
    out.engine_urls = {n: f"http://{host}:{p}" for n, p in engine_ports.items()}
    for i, (node, port) in enumerate(engine_ports.items()):
        role_file = out.roles_dir / node
        role_file.write_text(roles[i] + "\n")
        cfg = engine_config(pool, options, node, port, role_file, router_url, report_token, out, dir_token)
        cfg["tokenFile"] = str(engine_token)  # the router and the peer engines send it
        cfg_file = workdir / f"{node}.json"
        cfg_file.write_text(json.dumps(cfg, indent=1))
        out.specs.append(
            ProcessSpec(
                node,
                [
                    py,
                    "-m",
                    "agentpool.engine",
                    "--config",
                    str(cfg_file),
                    "--drain-timeout-s",
                    str(ENGINE_DRAIN_S),
                ],
                HttpReady(f"{out.engine_urls[node]}/health"),
                logs / f"{node}.log",
                essential=False,
            )
        )
        nodes.append(NodeConfig.model_validate({"id": node, "url": out.engine_urls[node], "role": roles[i]}))
        out.endpoints[node] = out.engine_urls[node]

    # router
    router_cfg = config_from_settings(
        spec.router.settings(),
        spec.slo.ttft_slo(),
        tpot_s=spec.slo.tpot_s,
        model=spec.model.client_name,
        nodes=nodes,
        page_size=spec.kv_pool.page_size,
        node_model=spec.model.iteration_coefficients(),
        context_length=model_context_length(pool, options.preset),  # what the sim engines take
    )
    router_file = workdir / "router.json"
    router_file.write_text(render_config(router_cfg))
    out.specs.append(
        ProcessSpec(
            "router",
            [
                py,
                "-m",
                "agentpool.router",
                "--config",
                str(router_file),
                "--host",
                host,
                "--port",
                str(options.router_port),
                "--directory",
                out.directory_target,
                "--directory-token-file",
                str(dir_token),
                "--report-token-file",
                str(report_token),
                "--engine-token-file",
                str(engine_token),
            ],
            HttpReady(f"{router_url}/health"),
            logs / "router.log",
        )
    )
    out.router_url = router_url
    out.endpoints["router (OpenAI API)"] = f"{router_url}/v1"

    # planner (a disaggregated pool with the planner enabled and engines to plan)
    if options.planner and out.engine_urls and spec.mode == "disaggregated" and spec.planner.enabled:
        out.specs.append(planner_spec(pool, out, workdir, report_token, dir_token))
        out.endpoints["planner"] = f"roles in {out.roles_dir}, events in {workdir / 'events.log'}"
    return out


def planner_spec(
    pool: AgentServingPool, out: PoolPlan, workdir: Path, report_token: Path, dir_token: Path
) -> ProcessSpec:
    """``python -m agentpool.local.planner`` with the manifest's planner section as its settings file."""
    config = planner_config(pool.spec)
    settings = workdir / "planner.json"
    settings.write_text(json.dumps({**dataclasses.asdict(config), "occupancy": config.occupancy.value}))
    shape = moe_shape(pool.spec)
    argv = [
        sys.executable,
        "-m",
        "agentpool.local.planner",
        "--pool",
        out.name,
        "--roles-dir",
        str(out.roles_dir),
        "--router",
        out.router_url,
        "--router-token-file",
        str(report_token),
        "--directory",
        out.directory_target,
        "--directory-token-file",
        str(dir_token),
        "--settings",
        str(settings),
        "--experts-active",
        str(shape.experts_active),
        "--experts-total",
        str(shape.experts_total),
    ]
    for node, url in out.engine_urls.items():
        argv += ["--engine", f"{node}={url}"]
    return ProcessSpec("planner", argv, None, workdir / "logs" / "planner.log", essential=False)


def engine_config(
    pool: AgentServingPool,
    options: LocalOptions,
    node: str,
    port: int,
    role_file: Path,
    router_url: str,
    report_token: Path,
    out: PoolPlan,
    dir_token: Path,
) -> dict[str, Any]:
    """The engine agent's config file (``python -m agentpool.engine --config``) for one node."""
    spec = pool.spec
    peers = {n: u for n, u in out.engine_urls.items() if n != node}
    return {
        "nodeId": node,
        "host": options.host,
        "port": port,
        "backend": "sim",
        "role": role_file.read_text().strip(),
        "roleFile": str(role_file),
        "routers": [{"url": router_url, "tokenFile": str(report_token)}],
        "directory": {"target": out.directory_target, "tokenFile": str(dir_token)},
        "peers": peers,
        "pageSize": spec.kv_pool.page_size,
        "hostKvBytes": options.host_kv_bytes or spec.engine.host_kv_bytes,
        "blockBytes": options.block_bytes,
        "sim": sim_settings(pool, options),
    }


def model_context_length(pool: AgentServingPool, preset_name: str) -> int | None:
    """The longest request the pool's sim engines take by their model: the smaller of the preset
    model's context and the pool's ``spec.model.contextLength`` (None: neither is set)."""
    limits = [
        n for n in (preset(preset_name).context_tokens, pool.spec.model.context_length) if n is not None
    ]
    return min(limits) if limits else None


def sim_settings(pool: AgentServingPool, options: LocalOptions) -> dict[str, Any]:
    """The sim backend's node model: the preset's Eq. 1/2 coefficients, acceptance, chunk and GPU KV
    size (the simulator's ``--fit preset`` model of the same node class), the manifest's MoE shape
    and the time scale."""
    shape = moe_shape(pool.spec)
    p = preset(options.preset)
    out: dict[str, Any] = {"timeScale": options.time_scale, **p.prefill.model_dump()}
    out |= {k: v for k, v in p.decode.model_dump().items() if k in ("d0", "d1", "d2")}
    out |= {"tAcc": p.t_acc, "chunkTokens": p.chunk_tokens, "gpuKvTokens": p.gpu_kv_tokens}
    context = model_context_length(pool, options.preset)
    if context is not None:  # the engine refuses what its model would (SGLang's --context-length)
        out["contextLength"] = context
    if shape.experts_total:
        out |= {"expertsActive": shape.experts_active, "expertsTotal": shape.experts_total}
    return out
