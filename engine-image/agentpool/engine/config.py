"""The engine agent's configuration file (YAML or JSON), validated with pydantic at the edge.

```yaml
nodeId: node-0                 # the name routers and the directory know this node by (the pod name)
host: 0.0.0.0
port: 8080                     # 0: a free port (printed as "engine listening on http://HOST:PORT")
leasePort: 0                   # peers' lease channel (0: a free port, found at /agentpool/v1/kv/channel)
advertiseUrl: "http://10.0.0.7:8080"  # sent with load reports so routers can register the engine
tokenFile: /var/run/agentpool/engine/token  # the pool's engine token (a mounted Secret): routers and
                               # peers send it, this engine sends it to its peers (auth.py)
insecureAllowUnauthenticated: false  # true instead of tokenFile: an open API (tests and demos only)
                               # neither: the per-user token files (local_tokens.py) for all three tokens
backend: sim                   # sim | sglang
role: both                     # the role served at start: prefill | decode | both
roleFile: /etc/agentpool/role  # desired role as a file (downward-API volume or a plain file)
kube: {namespace: ns, pod: node-0}  # desired role from the pod's agentpool.io/role annotation
routers: [{url: "http://router:8000", tokenFile: /secrets/report-token}]  # + caFile, clientCertFile,
                               # clientKeyFile: an https:// router (mutual TLS with a certificate)
directory: {target: "directory:50061", tokenFile: /secrets/directory-token}  # + caFile, clientCertFile,
                               # clientKeyFile: TLS (mutual with a client certificate)
peers: {node-1: "http://node-1:8080"}         # node id -> engine URL, for fetches from host pools
peerUrlTemplate: "http://{node}.engines:8080"  # for peers not listed
pageSize: 64
hostKvBytes: 1073741824        # host KV pool size
blockBytes: 65536              # bytes per KV block (a page of pageSize tokens)
sim: {timeScale: 1.0, ...}     # the sim backend's node model (below)
fetch: {timeoutS: 5, minBlocks: 1, leaseTtlS: 30, handoverTtlS: 120, verify: true, verifyStride: 512}
sglang:                        # backend sglang only (required there): the SGLang server the agent runs
  model: Qwen/Qwen3-Coder-30B-A3B-Instruct   # --model-path
  servedName: qwen3-coder
  port: 30000                  # SGLang's HTTP port on 127.0.0.1 (the agent forwards to it)
  tpSize: 4
  hostKvGib: 512               # SGLang's host tier (--hicache-size); unset: hostKvBytes in GiB
  kvEventsEndpoint: "tcp://127.0.0.1:5557"   # SGLang binds, the agent subscribes
  bootstrapPort: 8998          # P->D: SGLang's disaggregation bootstrap server
  chunkedPrefillTokens: 8192   # --chunked-prefill-size (bounds the prefill iteration records)
  contextLength: 262144        # --context-length (unset: the model's own)
  args: ["--mem-fraction-static", "0.85"]  # more SGLang flags (not the ones the agent sets)
  readyTimeoutS: 1800          # model load until /health answers 200
  keepHostKv: true             # SGLang's host-tier pages also in this agent's host pool (its L3
                               # storage backend over shared memory): kept across a role switch;
                               # blockBytes must be SGLang's page bytes per TP rank
  l3Dir: /dev/shm              # where the pool's shared-memory file and socket go (default /dev/shm)
```
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from agentpool.engine.errors import EngineError
from agentpool.engine.sglang.args import DEFAULT_LAUNCHER
from agentpool.errors import InvalidInputError
from agentpool.models import DecodeModel, PrefillModel
from agentpool.node import Role


class ConfigError(EngineError, InvalidInputError):
    """The engine configuration is invalid or unreadable (a ValueError, as before)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class RouterTarget(_Model):
    url: str = Field(pattern=r"^https?://[^\s]+$")
    token_file: Path | None = None
    """File holding the bearer token the router wants on load reports (a mounted Secret); unset: the
    per-user ``report`` token file."""
    ca_file: Path | None = None
    """An ``https://`` router: trust this CA (PEM; the system's CAs without it)."""
    client_cert_file: Path | None = None
    """Mutual TLS: the engine's client certificate (PEM), with ``clientKeyFile``; a router with a
    client CA takes it for the report token."""
    client_key_file: Path | None = None

    @model_validator(mode="after")
    def _pair(self) -> RouterTarget:
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("clientCertFile and clientKeyFile go together")
        return self


class DirectoryTarget(_Model):
    target: str = Field(min_length=3, pattern=r"^[^\s]+:\d+$")
    token_file: Path | None = None
    """The directory's bearer token (a mounted Secret); unset: the per-user ``directory`` token file."""
    ca_file: Path | None = None
    """TLS to the directory, trusting this CA (PEM)."""
    client_cert_file: Path | None = None
    """Mutual TLS: the engine's client certificate (PEM), with ``clientKeyFile``."""
    client_key_file: Path | None = None
    heartbeat_s: float = Field(0.5, gt=0, le=1.0)
    """The directory purges a node silent for 3 s; its contract asks for a heartbeat every second."""
    reconnect_s: float = Field(0.5, gt=0)


class KubeSource(_Model):
    namespace: str = Field(min_length=1, max_length=253)
    pod: str = Field(min_length=1, max_length=253)
    kubeconfig: Path | None = None
    """Unset: in-cluster service account. The engine only reads its pod (``get``/``list``/``watch``);
    the role it serves reaches the planner through its load reports to the routers."""


class SimSettings(_Model):
    """The ``sim`` backend: the node model's coefficients (Eq. 1, Eq. 2), batching and memory."""

    time_scale: float = Field(1.0, gt=0, le=1e6)
    """Model seconds per wall second: 10 runs the modelled GPU ten times faster than real time."""
    c0: float = Field(0.008, ge=0)
    c1: float = Field(2.5e-5, ge=0)
    c2: float = Field(1.5e-10, ge=0)
    c3: float = Field(1e-7, ge=0)
    d0: float = Field(0.005, ge=0)
    d1: float = Field(0.004, ge=0)
    d2: float = Field(6e-5, ge=0)
    experts_active: int = Field(8, ge=0)
    experts_total: int = Field(128, ge=0)
    t_fwd: float = Field(1.0, gt=0)
    t_acc: float = Field(1.0, gt=0, le=64)
    chunk_tokens: int = Field(8192, gt=0)
    gpu_kv_tokens: int = Field(700_000, gt=0)
    context_length: int | None = Field(None, gt=0)
    """The longest request (prompt and output) the modelled engine takes, as SGLang's
    ``--context-length``; unset: any that fits ``gpu_kv_tokens``. A longer one is refused (400)."""
    default_max_tokens: int = Field(16, gt=0)
    max_tokens_limit: int = Field(1 << 16, gt=0)

    @model_validator(mode="after")
    def _positive_iterations(self) -> SimSettings:
        if self.d0 + self.d1 + self.d2 <= 0 or self.c0 + self.c1 + self.c2 + self.c3 <= 0:
            raise ValueError("a sim iteration must take some time: some c* and some d* must be positive")
        return self

    def prefill_model(self) -> PrefillModel:
        return PrefillModel(self.c0, self.c1, self.c2, self.c3)

    def decode_model(self) -> DecodeModel:
        return DecodeModel(self.d0, self.d1, self.d2, self.experts_active, self.experts_total, self.t_fwd)


class FetchSettings(_Model):
    timeout_s: float = Field(5.0, gt=0)
    min_blocks: int = Field(1, ge=1)
    """Fetch a prefix from a peer only when it holds at least this many blocks more than this node."""
    lease_ttl_s: float = Field(30.0, gt=0, le=600)
    handover_ttl_s: float = Field(120.0, gt=0, le=3600)
    """How long a prefilled request's KV waits for its decode node."""
    verify: bool = True
    """Check fetched bytes against their block hashes (the ``sim`` backend's bytes)."""
    verify_stride: int = Field(512, ge=1)
    """Check every n-th 8-byte word of each fetched block (1: every byte; 512: one word per 4 KiB)."""


class SglangSettings(_Model):
    """The ``sglang`` backend: the upstream server the agent launches and drives."""

    model: str = Field(min_length=1, max_length=1024)
    served_name: str | None = Field(None, min_length=1, max_length=256)
    port: int = Field(30000, gt=0, le=65535)
    tp_size: int | None = Field(None, ge=1, le=64)
    """``--tp-size``; unset: SGLang's default or a ``--tp-size`` among ``args``."""
    host_kv_gib: int | None = Field(None, ge=0)
    """SGLang's host KV tier (HiCache, write-through) in GiB; unset: ``hostKvBytes`` in GiB."""
    kv_events_endpoint: str = Field("tcp://127.0.0.1:5557", pattern=r"^tcp://[^\s]+:\d+$")
    kv_events_topic: str = Field("kv", min_length=1, max_length=64)
    bootstrap_port: int = Field(8998, gt=0, le=65535)
    chunked_prefill_tokens: int = Field(8192, ge=64, le=1 << 20)
    """SGLang's ``--chunked-prefill-size``: the most tokens one prefill pass computes (a prefill
    batch over it spans passes and gives no iteration record)."""
    context_length: int | None = Field(None, ge=1)
    """SGLang's ``--context-length``: the longest request (prompt and output) it takes; unset: the
    model's own (or a ``--context-length`` among ``args``)."""
    args: list[str] = Field(default_factory=list, max_length=256)
    launcher: list[str] = Field(default_factory=lambda: list(DEFAULT_LAUNCHER), min_length=1, max_length=16)
    """The command that starts SGLang, before its arguments. The default runs the installed
    ``sglang`` package; tests point it at a stand-in."""
    require_gpu: bool = True
    """Refuse to start without a visible NVIDIA GPU (``/dev/nvidia*``); tests with a stand-in turn it off."""
    ready_timeout_s: float = Field(1800.0, gt=0)
    stop_timeout_s: float = Field(30.0, gt=0, le=600)
    load_poll_s: float = Field(0.5, gt=0)
    """How often ``/v1/loads`` is read for the load reports."""
    request_timeout_s: float = Field(3600.0, gt=0)
    keep_host_kv: bool = True
    """SGLang loads the agent's HiCache L3 storage backend (``sglang/hicache_backend.py``): the pages
    it writes through to its host tier are copied into this agent's host pool (a shared-memory file),
    which SGLang's role switch does not clear, and read back on a later request. Needs a host tier;
    ``blockBytes`` must be SGLang's page size in bytes per TP rank (checked when SGLang connects)."""
    l3_dir: Path | None = None
    """Directory for the host pool's shared-memory file and the L3 store's socket (one private
    subdirectory per agent process); unset: ``/dev/shm``, or the temp directory without it."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def host_tier_gib(self, host_kv_bytes: int) -> int:
        return self.host_kv_gib if self.host_kv_gib is not None else host_kv_bytes >> 30


class EngineConfig(_Model):
    node_id: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    host: str = "127.0.0.1"
    advertise_url: str | None = Field(None, pattern=r"^https?://[^\s/]+$")
    """The URL routers reach this engine at (sent with every load report, so a router can register
    it); unset: the listening address unless it is a wildcard (then none is sent)."""
    port: int = Field(8080, ge=0, le=65535)
    lease_port: int = Field(0, ge=0, le=65535)
    """TCP port of the lease channel peers fetch through (0: any free port; peers learn it from
    ``GET /agentpool/v1/kv/channel``)."""
    token_file: Path | None = None
    """The engine token (a mounted Secret): required on the API (but probes, metrics and state) and
    the lease channel, and sent to peers. Unset (and not ``insecureAllowUnauthenticated``): the per-user
    ``engine`` token file (``agentpool.secret_file.local_tokens``), made if absent."""
    insecure_allow_unauthenticated: bool = False
    """Serve the API and the lease channel to anyone (tests and demos only; logged as a warning)."""
    backend: Literal["sim", "sglang"] = "sim"
    role: Role = Role.BOTH
    role_file: Path | None = None
    role_poll_s: float = Field(0.2, gt=0)
    kube: KubeSource | None = None
    routers: list[RouterTarget] = Field(default_factory=list, max_length=64)
    report_interval_s: float = Field(0.5, gt=0)
    directory: DirectoryTarget | None = None
    peers: dict[str, str] = Field(default_factory=dict)
    peer_url_template: str | None = Field(None, pattern=r"^https?://.*\{node\}")
    page_size: int = Field(64, gt=0, le=4096)
    host_kv_bytes: int = Field(64 << 20, gt=0)
    block_bytes: int = Field(64 << 10, gt=0)
    max_body_bytes: int = Field(16 << 20, gt=0)
    max_queue: int = Field(1024, gt=0)
    """Requests queued beyond this are handed back (``requeue``) instead of admitted."""
    stall_log_s: float = Field(10.0, gt=0)
    """A request whose stream sends nothing for this long is logged with what it waits for (``sim``
    and ``sglang`` backends; ``stall_watch.py``), again each time its silence doubles."""
    stall_log_queued_s: float = Field(60.0, gt=0)
    """The same for a request still queued or prefilling (a long prompt under load waits long)."""
    sim: SimSettings = SimSettings()
    fetch: FetchSettings = FetchSettings()
    sglang: SglangSettings | None = None
    """The ``sglang`` backend's server (required with ``backend: sglang``)."""

    @model_validator(mode="after")
    def _check(self) -> EngineConfig:
        if self.block_bytes % 8:
            raise ValueError("blockBytes must be a multiple of 8")
        if self.host_kv_bytes < self.block_bytes:
            raise ValueError("hostKvBytes must hold at least one block (blockBytes)")
        if self.backend == "sglang" and self.sglang is None:
            raise ValueError("backend sglang needs the sglang section (at least sglang.model)")
        if self.backend == "sglang" and self.sglang is not None and self.sglang.port == self.port:
            raise ValueError("sglang.port must differ from the agent's port")
        if self.token_file is not None and self.insecure_allow_unauthenticated:
            raise ValueError("set tokenFile or insecureAllowUnauthenticated, not both")
        return self

    @property
    def host_slots(self) -> int:
        """Slots of the agent's own host pool. With ``sglang`` the host tier is SGLang's (HiCache,
        ``hostKvBytes`` of it): the agent's pool is a small one that peers' lease calls find empty."""
        if self.backend == "sglang":
            return max(1, min(self.host_kv_bytes, 64 * self.block_bytes) // self.block_bytes)
        return self.host_kv_bytes // self.block_bytes

    def peer_url(self, node: str) -> str | None:
        if node in self.peers:
            return self.peers[node].rstrip("/")
        if self.peer_url_template is not None:
            return self.peer_url_template.format(node=node).rstrip("/")
        return None


def load_config(path: Path) -> EngineConfig:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e}") from e
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}") from e
    try:
        return EngineConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: {e}") from e
