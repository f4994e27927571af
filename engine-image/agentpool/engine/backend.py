"""What the engine agent needs from a backend (``sim``: the node model; ``sglang``: upstream SGLang).

:class:`EngineApp` owns the HTTP API, the host pool and its NIXL transport, the directory link, the
reports and the role switch; a backend serves generate requests, says what it holds (KV events on
the sink it is given, its block list for a resync) and what load it carries. The config's
``backend`` names the factory in :data:`agentpool.engine.backends.BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentpool.directory.client import DirectoryClient
from agentpool.engine.config import EngineConfig
from agentpool.engine.hostpool import HostPool
from agentpool.engine.jobs import EventStream
from agentpool.engine.kv_peers import KvExporter, PeerFetcher
from agentpool.engine.kvstate import KvEventSink
from agentpool.engine.metrics import EngineMetrics
from agentpool.kv import HeldBlock, Role
from agentpool.wire.engine import GenerateRequest, QueuedItem
from agentpool.wire.iterations import WireIteration


@dataclass(frozen=True, slots=True)
class BackendLoad:
    """The backend's part of a load report (wall seconds)."""

    role: Role
    remaining_batch_s: float
    queue: list[QueuedItem]
    running_decode: int
    kv_room_tokens: int
    kv_used_tokens: int
    t_acc: float | None
    iterations: list[WireIteration]
    decode_waiting_tokens: int = 0  # prefilled, waiting for decode room, not in kv_used_tokens


@dataclass(frozen=True, slots=True)
class BackendParts:
    """What the agent gives a backend when it creates it."""

    cfg: EngineConfig
    pool: HostPool
    exporter: KvExporter
    fetcher: PeerFetcher
    metrics: EngineMetrics
    directory: DirectoryClient | None
    l3_dir: Path | None = None  # the sglang backend's L3 store: the pool is in shared memory there


class Backend(Protocol):
    @property
    def role(self) -> Role: ...

    @property
    def draining(self) -> bool: ...

    @property
    def drained(self) -> bool: ...

    @property
    def gpu_blocks(self) -> int: ...

    async def run(self) -> None:
        """Serve until cancelled (a backend with a child process stops it when cancelled)."""

    def admit(self, g: GenerateRequest) -> EventStream | None:
        """The request's event stream; ``None``: not taken now (the router gets ``requeue``).
        Raises :class:`agentpool.engine.errors.BadRequestError` for bad input."""

    def begin_drain(self) -> None: ...

    async def wait_drained(self) -> None: ...

    async def switch(self, role: Role) -> None:
        """Serve ``role`` (drained before); raises :class:`agentpool.engine.errors.SwitchFailed`
        when the backend refused and still serves the old role."""

    def load(self) -> BackendLoad: ...

    def held_blocks(self) -> list[HeldBlock]: ...

    def attach_sink(self, sink: KvEventSink, request_resync: Callable[[], None]) -> None:
        """Where the backend's KV events go from now on (the directory link), and how it asks for a
        full resync (events were lost)."""

    def not_ready_reason(self) -> str:
        """Why the backend cannot serve yet ("" when it can)."""

    def state(self) -> dict[str, Any]: ...


BackendFactory = Callable[[BackendParts], Backend]
"""Creates a backend; raises :class:`agentpool.engine.errors.BackendUnavailable` when it cannot run."""
