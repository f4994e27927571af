"""The ``sglang`` backend: upstream SGLang as the agent's child process, driven over its HTTP API.

- **Launch**: ``sglang.launcher`` (``python3 -m sglang.launch_server``) with the arguments of
  :func:`agentpool.engine.sglang.args.build_args`; the agent refuses to start (exit 2) when the
  ``sglang`` package (default launcher) or a GPU (``requireGpu``) is missing. ``/ready`` answers 503
  until SGLang's ``/health`` does; SGLang exiting stops the agent (exit 1); SIGTERM stops SGLang.
- **Generate**: forwarded to ``/generate`` (:mod:`.forwarding`, :mod:`.generate`), SGLang's stream
  translated to our events. P->D uses SGLang's own bootstrap transfer: the prefill node answers
  ``prefilled`` at once with a transfer id naming its bootstrap room while its SGLang waits for the
  decode node to pull the KV; the decode node asks its SGLang with that room.
- **KV events**: SGLang's ZMQ publisher -> :class:`SglangKvMirror` -> the directory link.
- **Load**: ``/v1/loads`` every ``loadPollS``; the queue is this agent's requests with no output yet
  (cached tokens as the router estimated them).
- **Switch**: drain (queued colocated requests are aborted in SGLang and handed back), then
  ``/pause_generation``, ``/pd_role_switch``, ``/continue_generation``; the mirror keeps the host
  tier across the switch's ``AllBlocksCleared``.
- **Host KV across a switch** (``keepHostKv``): SGLang loads the agent's L3 storage backend
  (``hicache_backend.py``), which copies its write-through pages into this agent's host pool
  (shared memory) through the L3 store (``l3_store.py``); the store keeps them when the switch
  calls the backend's ``clear()``, and SGLang prefetches them back on a later request.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import importlib.util
import itertools
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from agentpool.engine.backend import BackendLoad, BackendParts
from agentpool.engine.config import EngineConfig, SglangSettings
from agentpool.engine.errors import BackendUnavailable, BadRequestError, SwitchFailed
from agentpool.engine.jobs import EventStream, JobState
from agentpool.engine.kvstate import KvEventSink, NoSink
from agentpool.engine.lengths import check_request_length
from agentpool.engine.metrics import EngineMetrics
from agentpool.engine.sglang.args import DEFAULT_LAUNCHER, LaunchError, SglangLaunch, build_args
from agentpool.engine.sglang.control import SglangControl, SglangError, SglangLoad, decode_waiting_tokens
from agentpool.engine.sglang.events import SglangKvMirror
from agentpool.engine.sglang.forwarding import SglangForwarder
from agentpool.engine.sglang.generate import parse_transfer_id, sampling_params, transfer_id
from agentpool.engine.sglang.iterations import IterationRecorder
from agentpool.engine.sglang.job import SglangJob
from agentpool.engine.sglang.l3_index import L3Index
from agentpool.engine.sglang.l3_store import L3StoreServer
from agentpool.engine.sglang.process import SglangProcess
from agentpool.engine.sglang.stalls import sglang_wait
from agentpool.engine.sglang.zmq_bridge import ZmqKvBridge
from agentpool.engine.stall_watch import StallWatch
from agentpool.kv import HeldBlock, Role, Tier
from agentpool.wire.engine import GenerateRequest, QueuedItem

log = logging.getLogger(__name__)

_ACCEPTS = {
    Role.PREFILL: {"prefill", "both"},
    Role.DECODE: {"decode"},
    Role.BOTH: {"both", "prefill", "decode"},
}
_SWITCH_CLEAR_GRACE_S = 30.0  # how long after a switch its AllBlocksCleared may still arrive


def preflight(s: SglangSettings) -> None:
    """Refuse to run where SGLang cannot: a clear reason, no fallback to another backend."""
    if tuple(s.launcher) == DEFAULT_LAUNCHER and importlib.util.find_spec("sglang") is None:
        raise BackendUnavailable(
            "backend sglang: the sglang package is not installed here (python3 -m sglang.launch_server "
            "cannot run); run the engine image, or use backend sim on a machine without GPUs"
        )
    if s.require_gpu and not glob.glob("/dev/nvidia[0-9]*"):
        raise BackendUnavailable(
            "backend sglang needs an NVIDIA GPU and none is visible (no /dev/nvidia* device); "
            "give the pod nvidia.com/gpu, or use backend sim"
        )


def launch_argv(cfg: EngineConfig, s: SglangSettings, l3_socket: str | None = None) -> list[str]:
    launch = SglangLaunch(
        model=s.model,
        role=cfg.role,
        port=s.port,
        served_name=s.served_name,
        tp_size=s.tp_size,
        page_size=cfg.page_size,
        chunked_prefill_tokens=s.chunked_prefill_tokens,
        context_length=s.context_length,
        host_kv_gib=s.host_tier_gib(cfg.host_kv_bytes),
        kv_events_endpoint=s.kv_events_endpoint,
        kv_events_topic=s.kv_events_topic,
        bootstrap_port=s.bootstrap_port,
        l3_socket=l3_socket,
        extra=tuple(s.args),
    )
    try:
        return build_args(launch, s.launcher)
    except LaunchError as e:
        raise BackendUnavailable(f"backend sglang: {e}") from None


class SglangBackend:
    @classmethod
    def create(cls, parts: BackendParts) -> SglangBackend:
        cfg = parts.cfg
        assert cfg.sglang is not None  # the config requires it with backend sglang
        preflight(cfg.sglang)
        store = None if parts.l3_dir is None else L3StoreServer(L3Index(parts.pool), parts.l3_dir)
        argv = launch_argv(cfg, cfg.sglang, None if store is None else str(store.path))
        return cls(cfg, cfg.sglang, argv, parts.metrics, parts.fetcher.authorization, store)

    def __init__(
        self,
        cfg: EngineConfig,
        s: SglangSettings,
        argv: list[str],
        metrics: EngineMetrics,
        authorization: str | None = None,
        store: L3StoreServer | None = None,
    ) -> None:
        """``authorization``: the engine token's header value, sent to the prefill agent that redoes
        a failed hand-over (``handover.py``)."""
        self.cfg = cfg
        self.store = store  # the L3 store SGLang's storage backend uses (keepHostKv)
        self.s = s
        self.argv = argv
        self.metrics = metrics
        self.url = s.url
        self._role = cfg.role
        self._draining = False
        self._ready = False
        self.mirror = SglangKvMirror(cfg.page_size, NoSink())
        self._request_resync: Callable[[], None] = lambda: None
        on_batch = None
        if store is not None:  # its pages take the directory counts of the blocks the mirror maps them to
            store.index.resolve = self.mirror.ours.get
            on_batch = store.index.alias_pending
        self.bridge = ZmqKvBridge(
            s.kv_events_endpoint, s.kv_events_topic, self.mirror, self._on_gap, on_batch=on_batch
        )
        self.process = SglangProcess(argv)
        self.last_load: SglangLoad | None = None
        self.records = IterationRecorder(s.chunked_prefill_tokens)
        self.load_errors = 0
        self.requests = SglangForwarder(s, metrics, self.records, authorization)
        self._control: SglangControl | None = None
        self._seq = itertools.count()
        self._clear_grace: asyncio.TimerHandle | None = None
        self.stalls = StallWatch(  # a prefill answered at once waits for the decode side: not silent
            lambda: [j for j in self.jobs.values() if j.state is not JobState.FINISHED],
            lambda job, now: sglang_wait(self, job, now),
            cfg.stall_log_s,
            cfg.stall_log_queued_s,
        )

    # -- lifecycle ----------------------------------------------------------------------------
    async def run(self) -> None:
        async with aiohttp.ClientSession() as http:
            self.requests.http = http
            self._control = SglangControl(self.url, http)
            bridge = asyncio.create_task(self.bridge.run())  # SUB connects before SGLang binds: fine
            try:
                if self.store is not None:
                    await self.store.start()  # before SGLang: its storage backend connects at start
                await self.process.start()
                await self.process.wait_healthy(http, self.url, self.s.ready_timeout_s)
                self._ready = True
                await self._poll_load_once()
                watches = (self.process.watch(), self._poll_loads(), self.stalls.run())
                loops = [asyncio.create_task(c) for c in watches]
                try:
                    await asyncio.gather(*loops)
                finally:  # SGLang exited (watch raised) or the engine stops: end the other loops too
                    for t in loops:
                        t.cancel()
                    await asyncio.gather(*loops, return_exceptions=True)
            finally:
                self._ready = False
                bridge.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await bridge
                await self.requests.close()  # before SGLang's stop, which they would hold
                await self.process.stop(self.s.stop_timeout_s)
                if self.store is not None:
                    await self.store.close()

    async def _poll_loads(self) -> None:
        while True:
            await asyncio.sleep(self.s.load_poll_s)
            await self._poll_load_once()

    async def _poll_load_once(self) -> None:
        assert self._control is not None
        try:
            self.last_load = await self._control.load()
        except SglangError as e:
            self.load_errors += 1
            log.warning("SGLang load not read: %s", e)

    def _on_gap(self) -> None:
        self._request_resync()

    # -- state --------------------------------------------------------------------------------
    @property
    def jobs(self) -> dict[str, SglangJob]:
        """Our requests in SGLang now, by SGLang rid."""
        return self.requests.jobs

    @property
    def role(self) -> Role:
        return self._role

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def drained(self) -> bool:
        return self._draining and not self.jobs

    @property
    def gpu_blocks(self) -> int:
        return sum(1 for t in self.mirror.tiers.values() if t & Tier.GPU)

    def not_ready_reason(self) -> str:
        return "" if self._ready else "waiting for SGLang to become healthy"

    def held_blocks(self) -> list[HeldBlock]:
        return self.mirror.held_blocks()

    def attach_sink(self, sink: KvEventSink, request_resync: Callable[[], None]) -> None:
        self.mirror.sink = sink
        self._request_resync = request_resync

    def load(self) -> BackendLoad:
        sl = self.last_load
        queued = self.requests.queued()
        return BackendLoad(
            role=self._role,
            remaining_batch_s=0.0,
            queue=[
                QueuedItem(
                    request_id=j.request_id, t_uc=j.prompt_tokens - j.cached_tokens, t_c=j.cached_tokens
                )
                for j in queued
            ][:100_000],
            running_decode=0 if sl is None else sl.running,
            kv_room_tokens=0 if sl is None else max(0, sl.capacity_tokens - sl.used_tokens),
            kv_used_tokens=0 if sl is None else sl.used_tokens,
            t_acc=self.records.take_t_acc(),
            iterations=self.records.take(time.monotonic()),
            decode_waiting_tokens=0 if sl is None else self._decode_waiting(sl.running),
        )

    def _decode_waiting(self, running: int) -> int:
        """:func:`decode_waiting_tokens` of this agent's requests that had output (not prefill-phase
        ones, whose KV left for the decode node)."""
        out = [
            (j.last_output_at, j.prompt_tokens + j.tokens_out)
            for j in self.jobs.values()
            if j.output and j.phase != "prefill" and j.state is not JobState.FINISHED
        ]
        return decode_waiting_tokens(out, running, time.monotonic())

    def state(self) -> dict[str, Any]:
        sl = self.last_load
        return {
            "queue": len(self.requests.queued()),
            "running": len(self.jobs) - len(self.requests.queued()),
            "jobs": len(self.jobs),
            "gpu_blocks": self.gpu_blocks,
            "sglang": {
                "ready": self._ready,
                "pid": self.process.pid,
                "running": None if sl is None else sl.running,
                "waiting": None if sl is None else sl.waiting,
                "kv_event_batches": self.bridge.received,
                "kv_event_gaps": self.mirror.gaps,
                "mirror_blocks": len(self.mirror.tiers),
                "kept_across_switch": self.mirror.kept_across_switch,
                "l3": None if self.store is None else self.store.state(),
            },
        }

    # -- generate -----------------------------------------------------------------------------
    def admit(self, g: GenerateRequest) -> EventStream | None:
        ids = g.prompt_token_ids
        if not ids:
            raise BadRequestError("prompt_token_ids is empty")
        if min(ids) < 0 or max(ids) >= 1 << 32:
            raise BadRequestError("prompt_token_ids must be token ids in [0, 2**32)")
        params = sampling_params(g.body, self.cfg.sim.default_max_tokens, self.cfg.sim.max_tokens_limit)
        # SGLang refuses it too, but mid-stream, as an error the router cannot tell from another
        check_request_length(len(ids), params["max_new_tokens"], self.s.context_length)
        payload: dict[str, Any] = {"input_ids": ids, "sampling_params": params, "stream": True}
        if g.phase == "decode":
            if g.kv_source is None:
                raise BadRequestError("a decode request needs kv_source")
            port, room = parse_transfer_id(g.kv_source.transfer_id)
            host = urlsplit(g.kv_source.url).hostname
            if not host:
                raise BadRequestError(f"kv_source.url has no host: {g.kv_source.url[:200]!r}")
            payload |= {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}
        if not self._ready or self._draining or g.phase not in _ACCEPTS[self._role]:
            return None
        if g.phase != "decode" and len(self.requests.queued()) >= self.cfg.max_queue:
            return None
        rid = f"{self.cfg.node_id}-{next(self._seq)}-{g.request_id}"[:256]
        payload["rid"] = rid
        cached = min(g.cached_tokens, len(ids) - 1)
        job = SglangJob(
            request_id=g.request_id, phase=g.phase, rid=rid, prompt_tokens=len(ids), cached_tokens=cached
        )
        job.on_cancel = lambda: self.requests.abort(job, None)
        if g.phase == "prefill":
            room = secrets.randbits(63)
            payload |= {
                "bootstrap_host": self._bootstrap_host(),
                "bootstrap_port": self.s.bootstrap_port,
                "bootstrap_room": room,
                "stream": False,
            }
        if g.phase == "decode":
            job.handover = (g, payload)
        if g.phase != "prefill":  # streamed: its chunks time SGLang's passes
            self.records.submitted(rid, time.monotonic(), len(ids), prefills_here=g.phase == "both")
        self.requests.start(job, payload)
        if g.phase == "prefill":
            # SGLang's prefill waits for the decode node to pull the KV: the router learns the room now
            job.output = True
            job.emit({"type": "started"})  # SGLang's cache hits are not known at admission
            self.metrics.requests.labels("prefill", "prefilled").inc()
            handover = transfer_id(room, self.s.bootstrap_port)
            job.finish({"type": "prefilled", "text": "", "transfer_id": handover})
        return job

    def _bootstrap_host(self) -> str:
        url = self.cfg.advertise_url
        host = urlsplit(url).hostname if url else None
        return host or self.cfg.host

    # -- drain and switch ---------------------------------------------------------------------
    def begin_drain(self) -> None:
        self._draining = True
        for job in self.requests.queued():
            if job.phase == "both":  # not started in SGLang: another node serves it
                self.requests.abort(job, "draining")

    async def wait_drained(self) -> None:
        await self.requests.idle.wait()

    async def switch(self, role: Role) -> None:
        assert self._control is not None
        if role is self._role:
            self._draining = False
            return
        if Role.BOTH in (role, self._role):
            self._draining = False
            raise SwitchFailed(f"SGLang switches between prefill and decode only ({self._role} -> {role})")
        if self._clear_grace is not None:
            self._clear_grace.cancel()
        self.mirror.expect_switch_clear()
        if self.store is not None:
            self.store.index.switching = True  # SGLang's switch calls its storage backend's clear()
        try:
            await self._control.switch(role)
        except SglangError as e:
            self.mirror.expect_switch_clear(False)
            self._draining = False
            raise SwitchFailed(str(e)) from None
        finally:
            if self.store is not None:
                self.store.index.switching = False
            self.records.barrier(time.monotonic())  # SGLang was paused: no pass spans the switch
        self._clear_grace = asyncio.get_running_loop().call_later(
            _SWITCH_CLEAR_GRACE_S, self.mirror.expect_switch_clear, False
        )
        self._role = role
        self._draining = False
