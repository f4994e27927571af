"""The ``sim`` backend's state (:class:`agentpool.engine.simbackend.SimBackend` is the backend): the
node model (:mod:`agentpool.node`) with its KV ledger, host pool, peers and jobs; its clock in model
and wall seconds; and what it reports of itself (role, drain, load with the iteration records,
held blocks).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from agentpool.directory.client import DirectoryClient
from agentpool.engine.backend import BackendLoad
from agentpool.engine.config import EngineConfig
from agentpool.engine.hostpool import HostPool
from agentpool.engine.jobs import Job
from agentpool.engine.kv_peers import KvExporter, PeerFetcher
from agentpool.engine.kvstate import KvEventSink, KvLedger
from agentpool.engine.metrics import EngineMetrics
from agentpool.engine.stall_watch import StallWatch, sim_wait
from agentpool.kv import HeldBlock
from agentpool.node import Iteration, Node, NodeLoad, NodeStatus, Role
from agentpool.wire.engine import QueuedItem
from agentpool.wire.iterations import (
    MAX_ITERATIONS_PER_REPORT,
    WireDecodeIteration,
    WireIteration,
    WirePrefillItem,
    WirePrefillIteration,
)


def decode_waiting_tokens(n: NodeLoad) -> int:
    """KV tokens of prefilled requests waiting for decode room on a colocated node. This node model
    decodes a prefilled request at once, past its KV capacity (it has no wait for room), so the KV
    over the capacity is what would wait: the simulator's colocated nodes hold that much waiting
    (their free KV is then 0, as here), and SMetric's KV shortfall comes out the same."""
    if n.role is not Role.BOTH:
        return 0
    return max(0, n.kv_used_tokens - n.kv_capacity_tokens)


class SimBackendState:
    """The ``sim`` backend's node model in real time and what it reports;
    :class:`~agentpool.engine.simbackend.SimBackend` (its subclass) serves requests on it."""

    def __init__(
        self,
        cfg: EngineConfig,
        ledger: KvLedger,
        pool: HostPool,
        exporter: KvExporter,
        fetcher: PeerFetcher,
        metrics: EngineMetrics,
        directory: DirectoryClient | None = None,
    ) -> None:
        s = cfg.sim
        self.cfg = cfg
        self.scale = s.time_scale
        self.node = Node(
            0,
            cfg.node_id,
            s.prefill_model(),
            s.decode_model(),
            role=cfg.role,
            chunk_tokens=s.chunk_tokens,
            t_acc=s.t_acc,
            gpu_cache_blocks=ledger.gpu.capacity,
            kv_capacity_tokens=s.gpu_kv_tokens,
            on_iteration=self._on_iteration,
        )
        self.node.gpu = ledger.gpu
        self.ledger = ledger
        self.pool = pool
        self.exporter = exporter
        self.fetcher = fetcher
        self.metrics = metrics
        self.directory = directory
        self.jobs: dict[int, Job] = {}
        self.iterations: deque[WireIteration] = deque(maxlen=MAX_ITERATIONS_PER_REPORT)
        self.decoded_since_report = False
        self._iter_seq = 0
        self._rid = 0
        self._t0 = time.monotonic()
        self._epoch0 = time.time()
        self._wake = asyncio.Event()
        self._handovers = 0
        self._drained = asyncio.Event()
        self.last_step_at = time.monotonic()
        self.stalls = StallWatch(
            lambda: list(self.jobs.values()),
            lambda job, now: sim_wait(self, job, now),
            cfg.stall_log_s,
            cfg.stall_log_queued_s,
        )

    # -- clock --------------------------------------------------------------------------------
    def now(self) -> float:
        return (time.monotonic() - self._t0) * self.scale

    def wall(self, model_s: float) -> float:
        return model_s / self.scale

    # -- state --------------------------------------------------------------------------------
    @property
    def role(self) -> Role:
        return self.node.role

    @property
    def draining(self) -> bool:
        return self.node.status is not NodeStatus.SERVING

    @property
    def drained(self) -> bool:
        return self.node.drained and self._handovers == 0

    def node_load(self) -> NodeLoad:
        return self.node.load(self.now())

    def request_id_of(self, rid: int) -> str:
        job = self.jobs.get(rid)
        return job.request_id if job is not None else str(rid)

    def take_iterations(self) -> list[WireIteration]:
        out = list(self.iterations)
        self.iterations.clear()
        return out

    def _on_iteration(self, it: Iteration) -> None:
        seconds = self.wall(it.end - it.start)
        at = self._epoch0 + self.wall(it.start)
        if it.batch:
            self.metrics.iteration_seconds.labels("prefill").observe(seconds)
            if seconds > 0:
                items = [
                    WirePrefillItem(t_uc=int(b.t_uc), t_c=int(b.t_c), t_rst=int(b.t_rst)) for b in it.batch
                ]
                self.iterations.append(
                    WirePrefillIteration(seq=self._iter_seq, at=at, seconds=seconds, batch=items)
                )
        else:
            self.decoded_since_report = True
            per_iter = self.wall(it.decode_s)
            self.metrics.iteration_seconds.labels("decode").observe(per_iter)
            if per_iter > 0:
                self.iterations.append(
                    WireDecodeIteration(seq=self._iter_seq, at=at, seconds=per_iter, running=it.running)
                )
        self._iter_seq += 1

    # -- views --------------------------------------------------------------------------------
    @property
    def gpu_blocks(self) -> int:
        return len(self.ledger.gpu)

    def held_blocks(self) -> list[HeldBlock]:
        return self.ledger.held_blocks()

    def attach_sink(self, sink: KvEventSink, request_resync: Callable[[], None]) -> None:
        self.ledger.sink = sink

    def not_ready_reason(self) -> str:
        return ""

    def load(self) -> BackendLoad:
        n = self.node_load()
        decoded, self.decoded_since_report = self.decoded_since_report, False
        return BackendLoad(
            role=n.role,
            remaining_batch_s=self.wall(n.remaining_batch_s),
            queue=[
                QueuedItem(request_id=self.request_id_of(q.rid), t_uc=q.uncached_tokens, t_c=q.cached_tokens)
                for q in n.queue
            ][:100_000],
            running_decode=n.running + n.joining,
            kv_room_tokens=n.kv_room_tokens,
            kv_used_tokens=n.kv_used_tokens,
            t_acc=self.cfg.sim.t_acc if decoded else None,
            iterations=self.take_iterations(),
            decode_waiting_tokens=decode_waiting_tokens(n),
        )

    def state(self) -> dict[str, Any]:
        n = self.node_load()
        return {
            "queue": len(n.queue),
            "running": n.running,
            "jobs": len(self.jobs),
            "gpu_blocks": len(self.ledger.gpu),
        }
