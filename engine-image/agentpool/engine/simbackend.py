"""The ``sim`` backend: the node model (:mod:`agentpool.node`) driven in real time, with real KV blocks.

Time: ``now = (monotonic - t0) * time_scale`` model seconds; the driver loop sleeps until the node's
next event (or a new request) and calls :meth:`Node.advance`. Iteration times come from Eq. 1/2 with
the configured coefficients; everything reported to routers and the planner is in wall seconds.

KV: a prefill writes its blocks through to the GPU tier (the model's LRU) and the host pool (real
bytes); a queued request whose prefix lies in a peer's host pool (the directory says where) waits in
the queue while the blocks are READ with NIXL, and its prefill starts with them present; a failed
fetch falls back to recomputing. P->D: the prefill node publishes the request's blocks under its
transfer id, the decode node READs them before it starts decoding.

Switch: :meth:`begin_drain` hands queued requests back (``requeue``), running ones finish,
:attr:`drained` says when, :meth:`switch` serves the new role; the host pool and its index stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

from agentpool.directory.client import DirectoryRpcError
from agentpool.engine.backend import BackendParts
from agentpool.engine.errors import BadRequestError, FetchError
from agentpool.engine.jobs import Job, JobState, token_text
from agentpool.engine.kvstate import KvLedger, NoSink
from agentpool.engine.lengths import check_request_length
from agentpool.engine.simstate import SimBackendState
from agentpool.kv import block_hashes
from agentpool.node import GpuCache, Request, Role
from agentpool.wire.engine import GenerateRequest

log = logging.getLogger(__name__)

_MIN_TOKEN_INTERVAL_S = 0.005  # stream at most 200 token events per second and request
_ACCEPTS = {
    Role.PREFILL: {"prefill", "both"},
    Role.DECODE: {"decode"},
    Role.BOTH: {"both", "prefill", "decode"},
}


class SimBackend(SimBackendState):
    @classmethod
    def create(cls, parts: BackendParts) -> SimBackend:
        cfg = parts.cfg
        gpu = GpuCache(max(1, cfg.sim.gpu_kv_tokens // cfg.page_size))
        ledger = KvLedger(gpu, parts.pool, NoSink())
        return cls(cfg, ledger, parts.pool, parts.exporter, parts.fetcher, parts.metrics, parts.directory)

    # -- the driver loop ----------------------------------------------------------------------
    async def run(self) -> None:
        await asyncio.gather(self._drive(), self.stalls.run())

    async def _drive(self) -> None:
        while True:
            t = self.node.wake_time()
            self._wake.clear()
            delay = math.inf if t == math.inf else self.wall(t - self.now())
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), None if delay == math.inf else delay)
            self._step()
            await asyncio.sleep(0)  # let the streams run between steps

    def _step(self) -> None:
        self.last_step_at = time.monotonic()
        now = self.now()
        out = self.node.advance(now)
        started, self.node.started = self.node.started, []
        for r in started:
            job = self.jobs.get(r.rid)
            if job is not None:
                job.state = JobState.PREFILL
                job.cached_at_start = self.ledger.local_prefix(job.hashes) * self.cfg.page_size
                job.emit(
                    {
                        "type": "started",
                        "cached_tokens": r.cached_tokens,
                        "fetched_tokens": job.fetched_tokens,
                    }
                )
        for r in out.prefilled:
            job = self.jobs.get(r.rid)
            if job is not None:
                self._prefilled(job, now)
        for r in out.decoded:
            job = self.jobs.pop(r.rid, None)
            if job is not None:
                self._finish_job(job)
        self._check_drained()
        load = self.node.load(now)
        self.metrics.queue.set(len(load.queue))
        self.metrics.batch.set(load.running)

    def kick(self) -> None:
        self._wake.set()

    def _check_drained(self) -> None:
        if self.draining and self.drained:
            self._drained.set()

    async def wait_drained(self) -> None:
        self._check_drained()
        await self._drained.wait()

    # -- admission ----------------------------------------------------------------------------
    def _max_tokens(self, body: dict[str, Any]) -> int:
        raw = body.get("max_completion_tokens")
        if raw is None:
            raw = body.get("max_tokens")
        if raw is None:
            return self.cfg.sim.default_max_tokens
        if not isinstance(raw, int) or isinstance(raw, bool) or raw < 1:
            raise BadRequestError("max_tokens must be a positive integer")
        return min(raw, self.cfg.sim.max_tokens_limit)

    def admit(self, g: GenerateRequest) -> Job | None:
        """Create the job for ``g``; ``None``: the engine does not take it now (hand it back)."""
        if not g.prompt_token_ids and g.phase != "decode":
            raise BadRequestError("prompt_token_ids is empty")
        ids = g.prompt_token_ids
        if ids and (min(ids) < 0 or max(ids) >= 1 << 32):
            raise BadRequestError("prompt_token_ids must be token ids in [0, 2**32)")
        if g.phase == "decode" and g.kv_source is None:
            raise BadRequestError("a decode request needs kv_source")
        out = self._max_tokens(g.body)
        # one that cannot fit all of the GPU KV would wait for room forever, with the queue behind it
        s = self.cfg.sim
        check_request_length(len(g.prompt_token_ids), out, s.context_length, s.gpu_kv_tokens)
        if self.draining or g.phase not in _ACCEPTS[self.node.role]:
            return None
        if g.phase != "decode" and len(self.node.queue) >= self.cfg.max_queue:
            return None
        hashes = block_hashes(g.prompt_token_ids, self.cfg.page_size)
        self._rid += 1
        now = self.now()
        req = Request(self._rid, len(g.prompt_token_ids), out, hashes, [], "", now)
        job = Job(request_id=g.request_id, phase=g.phase, req=req, hashes=hashes)
        job.on_cancel = lambda: self.cancel(job)
        self.jobs[req.rid] = job
        if g.phase == "decode":
            assert g.kv_source is not None
            req.first_token_at = now
            req.output_tokens = max(1, out)
            self.node.reserve_decode(req)
            self.node.handover_started(req, was_waiting=False)
            self._handovers += 1
            job.state = JobState.HANDOVER
            job.spawn(self._handover(job, g.kv_source.url, g.kv_source.transfer_id))
            return job
        if g.phase == "prefill":
            req.output_tokens = 1
        gpu = self.ledger.gpu_prefix(hashes)
        local = self.ledger.local_prefix(hashes)
        req.cached_tokens = min(local * self.cfg.page_size, len(g.prompt_token_ids) - 1)
        req.restore_tokens = max(0, (local - gpu) * self.cfg.page_size)
        if self.directory is not None and len(hashes) - local >= self.cfg.fetch.min_blocks:
            req.fetch_ready_at = math.inf  # waits in the queue until the lookup (and fetch) ends
            job.fetching = True
            job.spawn(self._fetch_prefix(job, local))
        self.node.submit(req, now)
        self.kick()
        return job

    # -- prefill side -------------------------------------------------------------------------
    def _prefilled(self, job: Job, now: float) -> None:
        self.ledger.computed(job.hashes, now)
        if job.phase == "decode":  # recomputed after a failed hand-over: the first token is out
            self._start_decode(job, now)
            return
        first = token_text(0)
        job.tokens_sent = 1
        if job.phase == "prefill":
            transfer = f"{self.cfg.node_id}.{job.req.rid}.{job.request_id}"[:200]
            self.exporter.lease(job.hashes, self.cfg.fetch.handover_ttl_s, lease_id=transfer)
            self.jobs.pop(job.req.rid, None)
            self.metrics.requests.labels(job.phase, "prefilled").inc()
            job.finish({"type": "prefilled", "text": first, "transfer_id": transfer})
            return
        job.emit({"type": "token", "text": first})
        self._start_decode(job, now)

    def _start_decode(self, job: Job, now: float) -> None:
        job.state = JobState.DECODE
        if job.req.decode_start < 0:
            self.node.join_decode(job.req, now)
        if self.node.decode_iter_s > 0 and job.output_tokens > 1:
            job.spawn(self._stream_tokens(job))
        self.kick()

    async def _fetch_prefix(self, job: Job, local: int) -> None:
        """Find the peer holding the longest host prefix beyond ours and READ it while queued."""
        req, page = job.req, self.cfg.page_size
        assert self.directory is not None
        fetched = planned = 0
        try:
            job.waiting(f"the directory's lookup of {len(job.hashes)} blocks")
            res = await self.directory.resolve(job.hashes)
            best, best_url = local, None
            for node, prefix in res.nodes.items():
                url = self.cfg.peer_url(node)
                if node != self.cfg.node_id and url is not None and prefix.host_blocks > best:
                    best, best_url = prefix.host_blocks, url
            if best_url is not None and best - local >= self.cfg.fetch.min_blocks:
                planned = best - local
                job.waiting(f"a prefix fetch of {len(job.hashes[:best])} blocks from {best_url}")
                r = await self.fetcher.fetch_prefix(best_url, job.hashes[:best], self.cfg.fetch.lease_ttl_s)
                self.ledger.fetched(r.blocks, r.evicted)
                fetched = (len(r.blocks) - r.held_before) * page
                self.metrics.fetch_bytes.labels("prefix").inc(r.bytes)
                self.metrics.fetch_seconds.labels("prefix").observe(r.seconds)
        except FetchError as e:
            self.ledger.evicted_host(e.evicted)  # made room before the fetch failed
            self.metrics.fetch_failures.labels("prefix").inc()
            self.metrics.recomputed_tokens.inc(planned * page)
            log.warning("fetch for %s failed, recomputing: %s", job.request_id, e)
        except DirectoryRpcError as e:
            log.warning("directory lookup for %s failed, recomputing: %s", job.request_id, e)
        finally:
            job.waiting("")
            job.fetching = False
            if req.done_uc == 0 and job.state is JobState.QUEUED:
                gpu = self.ledger.gpu_prefix(job.hashes)
                local_now = self.ledger.local_prefix(job.hashes)
                req.cached_tokens = min(local_now * page, req.input_tokens - 1)
                req.restore_tokens = max(0, (local_now - gpu) * page)
                req.fetch_tokens = fetched
                job.fetched_tokens = fetched
                req.fetch_ready_at = self.now()
                self.kick()

    # -- decode side --------------------------------------------------------------------------
    async def _handover(self, job: Job, url: str, transfer: str) -> None:
        req = job.req
        job.waiting(f"the KV hand-over from {url} (transfer {transfer})")
        try:
            r = await self.fetcher.fetch_transfer(url.rstrip("/"), transfer)
        except BaseException as e:
            # undo handover_started: the node model has no "hand-over failed"
            self._handovers -= 1
            self.node.joining -= 1
            self.node.kv_used_tokens -= req.kv_tokens
            job.waiting("")
            if isinstance(e, FetchError):
                self.ledger.evicted_host(e.evicted)
                self.metrics.fetch_failures.labels("handover").inc()
                self._recompute(job, f"KV hand-over from {url} failed: {e}")
                return
            # not a transfer failure: end the stream now (the job's task log says why) rather than
            # leave the router waiting for its first-event timeout, and let a drain complete
            self.jobs.pop(req.rid, None)
            job.finish({"type": "error", "message": f"KV hand-over from {url}: {type(e).__name__}: {e}"})
            self._check_drained()
            raise
        job.waiting("")
        self._handovers -= 1
        self.ledger.fetched(r.blocks, r.evicted)
        self.ledger.computed(r.blocks, self.now())  # the decode node loads the KV into its GPU tier
        self.metrics.fetch_bytes.labels("handover").inc(r.bytes)
        self.metrics.fetch_seconds.labels("handover").observe(r.seconds)
        job.tokens_sent = 1  # the prefill node produced the first token
        self.node.handover_arrived(req, self.now())
        job.state = JobState.DECODE
        if self.node.decode_iter_s > 0 and job.output_tokens > 1:
            job.spawn(self._stream_tokens(job))
        self.kick()

    def _recompute(self, job: Job, why: str) -> None:
        """The prefill node's KV cannot be read: prefill the prompt here, then decode (the first token
        already went out from the prefill node, so the stream resumes after it)."""
        req, page = job.req, self.cfg.page_size
        if req.input_tokens == 0:
            self.jobs.pop(req.rid, None)
            self.metrics.requests.labels("decode", "error").inc()
            job.finish({"type": "error", "message": f"{why}; no prompt to recompute it from"})
            self.kick()
            return
        log.warning("%s: recomputing %s here", why, job.request_id)
        gpu = self.ledger.gpu_prefix(job.hashes)
        local = self.ledger.local_prefix(job.hashes)
        req.first_token_at = -1.0
        job.tokens_sent = 1
        req.cached_tokens = min(local * page, req.input_tokens - 1)
        req.restore_tokens = max(0, (local - gpu) * page)
        self.metrics.handover_recomputed.inc()
        self.metrics.recomputed_tokens.inc(req.input_tokens - req.cached_tokens)
        job.state = JobState.QUEUED
        self.node.submit(req, self.now())
        self.kick()

    async def _stream_tokens(self, job: Job) -> None:
        """Token events as the node model decodes them. A mixed iteration (a prefill chunk with the
        decodes) is one decode step too, so a node busy prefilling streams slower; before, tokens
        went out at the pure decode pace, ran ahead of the model, and the stream then sent nothing
        until the model caught up (long enough behind long prompts for the router to time out)."""
        node, r = self.node, job.req
        start = r.finish_iter - r.decode_iterations(node.t_acc)
        last = job.output_tokens - 1  # the last one goes with ``done``
        while job.tokens_sent < last:
            await asyncio.sleep(max(self.wall(node.decode_iter_s), _MIN_TOKEN_INTERVAL_S))
            steps = node.decode_position(self.now()) - start
            due = min(last, 1 + int(steps * node.t_acc + 1e-9))
            while job.tokens_sent < due:
                job.emit({"type": "token", "text": token_text(job.tokens_sent)})
                job.tokens_sent += 1

    def _finish_job(self, job: Job) -> None:
        for i in range(job.tokens_sent, job.output_tokens):
            job.emit({"type": "token", "text": token_text(i)})
        usage: dict[str, object] = {
            "prompt_tokens": job.req.input_tokens,
            "completion_tokens": job.output_tokens,
        }
        if job.phase != "decode":  # a decode's prompt came with its KV: the prefill node's hits count
            usage["prompt_tokens_details"] = {"cached_tokens": job.req.cached_tokens}
        self.metrics.requests.labels(job.phase, "done").inc()
        job.finish({"type": "done", "finish_reason": "length", "usage": usage})

    # -- hand back, cancel, switch ------------------------------------------------------------
    def requeue(self, job: Job, reason: str) -> None:
        self.jobs.pop(job.req.rid, None)
        self.metrics.requeued.labels(reason).inc()
        job.finish({"type": "requeue", "reason": reason})

    def cancel(self, job: Job) -> None:
        """The router hung up: drop the request if it has not started; running work finishes."""
        if job.state is JobState.QUEUED and job.req in self.node.queue:
            self.node.queue.remove(job.req)
            self.jobs.pop(job.req.rid, None)
            job.finish()
            self.kick()

    def begin_drain(self) -> None:
        self._drained.clear()
        for r in self.node.begin_drain():
            job = self.jobs.get(r.rid)
            if job is not None:
                self.requeue(job, "draining")
        self.kick()

    async def switch(self, role: Role) -> None:
        self.node.go_down(keep_kv=True)
        self.node.finish_switch(role)
        self.kick()
