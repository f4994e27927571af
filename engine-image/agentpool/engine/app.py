"""Wiring of one engine agent process: host pool, NIXL, directory link, backend, reports, switch, HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from agentpool.directory.auth import read_client_tls
from agentpool.directory.client import DirectoryClient
from agentpool.engine.auth import engine_auth
from agentpool.engine.backend import Backend, BackendParts
from agentpool.engine.backends import BACKENDS
from agentpool.engine.config import EngineConfig
from agentpool.engine.directory_link import DirectoryLink
from agentpool.engine.hostpool import HostPool
from agentpool.engine.kv_peers import KvExporter, PeerFetcher
from agentpool.engine.metrics import EngineMetrics
from agentpool.engine.nixl_transport import NixlTransport
from agentpool.engine.reports import DispatchSeqs, Reporter, ReportTarget
from agentpool.engine.roles import KubeRoleWatch, RoleFileWatch, Switcher
from agentpool.engine.server import build_app
from agentpool.engine.sglang.l3_store import SHM_NAME, prepare_run_dir
from agentpool.kv import Role, Tier
from agentpool.secret_file.local_tokens import LocalToken, local_or_given_secret
from agentpool.secret_file.tls import optional_client_context
from agentpool.wire.engine import LoadReport

log = logging.getLogger(__name__)


def l3_run_dir(cfg: EngineConfig) -> Path | None:
    """The sglang backend's L3 store directory (the host pool then lives in shared memory there)."""
    s = cfg.sglang
    if cfg.backend != "sglang" or s is None or not s.keep_host_kv or not s.host_tier_gib(cfg.host_kv_bytes):
        return None
    base = s.l3_dir or (Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir()))
    return prepare_run_dir(base, cfg.node_id)


class EngineApp:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.metrics = EngineMetrics()
        self.dispatch_seqs = DispatchSeqs()
        self.l3_dir = l3_run_dir(cfg)
        self.pool = HostPool(
            cfg.host_slots, cfg.block_bytes, None if self.l3_dir is None else self.l3_dir / SHM_NAME
        )
        self.transport = NixlTransport(cfg.node_id, self.pool.buffer, cfg.block_bytes, table=self.pool.table)
        self.auth = engine_auth(cfg)
        self.exporter = KvExporter(
            self.pool,
            self.transport,
            self.auth,
            on_unknown=self.metrics.unknown_transfers.inc,
            on_refused=self.metrics.unauthenticated.labels("lease_channel").inc,
        )
        self.url = ""
        self.advertised_url: str | None = None
        self.started = False
        self.retiring = False
        self._tasks: list[asyncio.Task[Any]] = []
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.directory: DirectoryClient | None = None
        self.link: DirectoryLink | None = None
        self.kube: KubeRoleWatch | None = None
        self.failed = asyncio.Event()  # a task of the agent failed: the process exits (``__main__``)
        self.failure = ""

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.cfg
        await self.transport.start()
        await self.exporter.serve_channel(cfg.host, cfg.lease_port)
        self._session = aiohttp.ClientSession()
        self.fetcher = fetcher = PeerFetcher(
            self.pool,
            self.transport,
            self._session,
            auth=self.auth,
            verify=cfg.fetch.verify,
            verify_stride=cfg.fetch.verify_stride,
            timeout_s=cfg.fetch.timeout_s,
            on_fallback=lambda why: self.metrics.fetch_direct_misses.labels(why).inc(),
        )
        if cfg.directory is not None:
            d = cfg.directory
            tls = read_client_tls(d.ca_file, d.client_cert_file, d.client_key_file)
            self.directory = DirectoryClient(
                d.target,
                token=local_or_given_secret(
                    d.token_file, LocalToken.DIRECTORY, "directory.tokenFile", "directory token"
                ),
                root_certificates=tls.root_certificates,
                client_cert=tls.client_cert,
                client_key=tls.client_key,
            )
        parts = BackendParts(
            cfg, self.pool, self.exporter, fetcher, self.metrics, self.directory, self.l3_dir
        )
        self.backend: Backend = BACKENDS[cfg.backend](parts)
        if self.directory is not None and cfg.directory is not None:
            self.link = DirectoryLink(
                cfg.node_id,
                self.directory,
                lambda: self.backend.role,
                self.backend.held_blocks,
                self.pool.set_counts,
                heartbeat_s=cfg.directory.heartbeat_s,
                reconnect_s=cfg.directory.reconnect_s,
            )
            self.backend.attach_sink(self.link, self.link.request_resync)
        targets = [
            ReportTarget(
                r.url,
                local_or_given_secret(r.token_file, LocalToken.REPORT, "routers[].tokenFile", "report token"),
                tls=optional_client_context(
                    r.ca_file, r.client_cert_file, r.client_key_file, f"the router {r.url}"
                ),
            )
            for r in cfg.routers
        ]
        self.reporter = Reporter(
            targets, self._session, self.build_report, self.metrics, self.dispatch_seqs, cfg.report_interval_s
        )
        self.switcher = Switcher(self.backend, self.metrics, self.reporter.kick, self._switched)
        for r in Role:
            self.metrics.role.labels(r.value).set(1 if r == cfg.role else 0)
        coros: list[Any] = [self.backend.run(), self.reporter.run(), self.switcher.run(), self._gauges()]
        if self.link is not None:
            coros.append(self.link.run())
        if cfg.role_file is not None:
            coros.append(RoleFileWatch(cfg.role_file, self.switcher.set_desired, cfg.role_poll_s).run())
        if cfg.kube is not None:
            k = cfg.kube
            self.kube = KubeRoleWatch(
                k.namespace, k.pod, self.switcher.set_desired, k.kubeconfig, on_drain=self.retire
            )
            coros.append(self.kube.run())
        self._tasks = [asyncio.create_task(c) for c in coros]
        for t in self._tasks:
            t.add_done_callback(self._task_done)
        self._runner = web.AppRunner(build_app(self), shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, cfg.host, cfg.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{cfg.host}:{port}"
        wildcard = cfg.host in ("0.0.0.0", "::", "")
        self.advertised_url = cfg.advertise_url or (None if wildcard else self.url)
        self.started = True

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("engine task failed: %r", task.exception(), exc_info=task.exception())
            self.failure = f"{type(task.exception()).__name__}: {task.exception()}"
            self.failed.set()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._runner is not None:
            await self._runner.cleanup()
        await self.exporter.close()
        if self._session is not None:
            await self.fetcher.close()
            await self._session.close()
        if self.directory is not None:
            await self.directory.close()
        await self.transport.close()
        self.pool.close()
        if self.l3_dir is not None:
            with contextlib.suppress(OSError):
                self.l3_dir.rmdir()

    def retire(self) -> None:
        """The operator removes this pod (``agentpool.io/drain``): stop admitting for good, hand the
        queue back, finish what runs; then /ready answers 503 so the operator sees it drained."""
        if self.retiring:
            return
        log.info("drain for removal: no new work from now on")
        self.retiring = True
        self.switcher.frozen = True
        self.metrics.draining.set(1)
        self.backend.begin_drain()
        self.reporter.kick()

    @property
    def retired(self) -> bool:
        """Nothing runs here and no peer holds a lease here (a decode node still to read a
        hand-over, a prefix fetch in progress): stopping loses no work and no KV a peer was promised."""
        return self.backend.drained and not self.exporter.leases

    async def wait_retired(self, poll_s: float = 0.1) -> None:
        """After :meth:`retire`: until :attr:`retired` (leases expire after their TTL)."""
        await self.backend.wait_drained()
        while not self.retired:
            self.exporter.expire()
            await asyncio.sleep(poll_s)

    async def _switched(self, role: Role) -> None:
        if self.link is not None:
            await self.link.switch_phase(role)

    async def _gauges(self) -> None:
        while True:
            self.metrics.kv_blocks.labels(Tier.GPU.name.lower()).set(self.backend.gpu_blocks)
            self.metrics.kv_blocks.labels(Tier.HOST.name.lower()).set(len(self.pool))
            if self.link is not None:
                self.metrics.directory_resyncs.inc(self.link.resyncs - self._resyncs_seen)
                self._resyncs_seen = self.link.resyncs
            await asyncio.sleep(1.0)

    _resyncs_seen = 0

    # -- views --------------------------------------------------------------------------------
    def build_report(self) -> LoadReport:
        load = self.backend.load()
        pending = self.switcher.pending
        return LoadReport(
            node_id=self.cfg.node_id,
            role=load.role,
            url=self.advertised_url,
            desired_role=pending,
            last_dispatch_seq=-1,  # per router: the reporter sets each router's own
            remaining_batch_s=load.remaining_batch_s,
            queue=load.queue,
            running_decode=load.running_decode,
            kv_room_tokens=load.kv_room_tokens,
            kv_used_tokens=load.kv_used_tokens,
            decode_waiting_tokens=load.decode_waiting_tokens,
            accepting=not self.backend.draining,
            t_acc=load.t_acc,
            iterations=load.iterations,
        )

    def not_ready_reason(self) -> str:
        if not self.started:
            return "starting"
        backend = self.backend.not_ready_reason()
        if backend:
            return backend
        if self.retiring:
            return "drained for removal" if self.backend.drained else "draining for removal"
        if self.switcher.switching:
            return "switching role"
        if self.link is not None and self.link.refused:
            return f"the directory refused the token: {self.link.refused}"
        return ""

    def state(self) -> dict[str, Any]:
        b = self.backend
        return {
            "node_id": self.cfg.node_id,
            "backend": self.cfg.backend,
            "role": b.role.value,
            "desired_role": None if self.switcher.desired is None else self.switcher.desired.value,
            "draining": b.draining,
            "retiring": self.retiring,
            **b.state(),
            "host_blocks": len(self.pool),
            "host_pinned": len(self.pool.pins),
            "host_counted": len(self.pool.counts),
            "leases": len(self.exporter.leases),
            "switches": self.switcher.history,
            "directory_connected": None if self.link is None else self.link.connected,
            "reports_sent": self.reporter.sent,
            "report_error": self.reporter.last_error,
        }
