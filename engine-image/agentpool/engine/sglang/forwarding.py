"""The ``sglang`` backend's requests in SGLang: each forwarded to its ``/generate``, the answer
translated to our events, and ended.

- A streamed request (``both``, ``decode``): SGLang's SSE chunks become ``started``, ``token`` and
  ``done`` events (:mod:`.generate` parses them), and time SGLang's passes (:class:`IterationRecorder`).
- A prefill (``prefill``): answered ``prefilled`` at admission; SGLang's answer comes when the decode
  node pulled the KV, or says it never did (counted as a failed hand-over).
- A decode whose KV never came (SGLang's decode mode cannot prefill): the source prefills it again
  (:mod:`.handover`) and the request goes to SGLang once more with the new bootstrap room; when the
  source cannot, it is handed back to the router (``requeue``, ``kv_source_lost``).
- Aborted in SGLang (``/abort_request``) when the router hangs up or a drain hands it back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

import aiohttp

from agentpool.engine.config import SglangSettings
from agentpool.engine.errors import BadRequestError, FetchError
from agentpool.engine.jobs import JobState
from agentpool.engine.lengths import sglang_says_too_long
from agentpool.engine.metrics import EngineMetrics
from agentpool.engine.sglang.generate import Chunk, parse_answer, parse_sse_line, parse_transfer_id
from agentpool.engine.sglang.handover import prefill_again
from agentpool.engine.sglang.iterations import IterationRecorder
from agentpool.engine.sglang.job import SglangJob
from agentpool.wire.engine import KV_SOURCE_LOST, TOO_LONG

log = logging.getLogger(__name__)


class SglangForwarder:
    """Our requests in SGLang (``jobs``, by SGLang rid) and the tasks that forward them; ``idle`` is
    set while there are none. ``http`` is set when the backend runs."""

    def __init__(
        self,
        s: SglangSettings,
        metrics: EngineMetrics,
        records: IterationRecorder,
        authorization: str | None = None,
    ) -> None:
        """``authorization``: the engine token's header value, sent to the prefill agent that redoes
        a failed hand-over (``handover.py``)."""
        self.s = s
        self.url = s.url
        self.metrics = metrics
        self.records = records
        self._authorization = authorization
        self.http: aiohttp.ClientSession | None = None
        self.jobs: dict[str, SglangJob] = {}  # by SGLang rid: in SGLang now
        self._calls: set[asyncio.Task[None]] = set()  # our calls to SGLang (requests, aborts) until they end
        self.idle = asyncio.Event()
        self.idle.set()

    def _hold(self, call: Coroutine[Any, Any, None]) -> None:
        """Run ``call`` as a task held until it ends (the loop keeps only weak references to tasks)."""
        task = asyncio.get_running_loop().create_task(call)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    def start(self, job: SglangJob, payload: dict[str, Any]) -> None:
        """Forward ``job`` (``payload``: SGLang's ``/generate`` body, ``rid`` included)."""
        self.jobs[job.rid] = job
        self.idle.clear()
        self._hold(self._forward(job, payload))

    def queued(self) -> list[SglangJob]:
        """Our requests with no output yet."""
        return [j for j in self.jobs.values() if not j.output]

    async def close(self) -> None:
        """End every request: the engine stops (our requests still open in SGLang would hold its
        HTTP server's shutdown: the stop then waits its whole timeout and kills it)."""
        for job in list(self.jobs.values()):
            job.finish({"type": "error", "message": "the engine is stopping"})
        for t in self._calls:
            t.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)

    async def _forward(self, job: SglangJob, payload: dict[str, Any]) -> None:
        assert self.http is not None
        timeout = aiohttp.ClientTimeout(total=self.s.request_timeout_s, sock_connect=10)
        try:
            async with self.http.post(self.url + "/generate", json=payload, timeout=timeout) as r:
                if r.status != 200:
                    text = (await r.text())[:500]
                    status = r.status if 400 <= r.status < 500 else 502
                    too_long = status == 400 and sglang_says_too_long(text)
                    self._fail(job, f"SGLang answered HTTP {r.status}: {text}", status, too_long)
                    return
                if not payload["stream"]:
                    self._prefill_answer(job, parse_answer(await r.json(content_type=None)))
                    return
                last: Chunk | None = None
                async for line in r.content:
                    chunk = parse_sse_line(line)
                    if chunk is None:
                        continue
                    last = chunk
                    if chunk.error is not None:
                        # SGLang refuses a request for its content mid-stream (over its context
                        # length, a bad parameter): the request's fault, never the engine's
                        too_long = sglang_says_too_long(chunk.error)
                        status = 400 if too_long else (chunk.error_status or 502)
                        self._fail(job, f"SGLang: {chunk.error}", status, too_long)
                        return
                    if chunk.finish_reason == "abort":  # no output: not "started"
                        break
                    self._chunk(job, chunk)
                    if chunk.finish_reason is not None:
                        break
                if last is None or last.finish_reason is None:
                    self._fail(job, "SGLang's stream ended without a finish reason", 502)
                else:
                    self._done(job, last)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            self._fail(job, f"SGLang request failed: {type(e).__name__}: {e}", 502)
        finally:
            self._gone(job)

    def _chunk(self, job: SglangJob, c: Chunk) -> None:
        now = time.monotonic()
        self.records.output(job.rid, now, c.completion_tokens, c.cached_tokens)
        job.tokens_out = c.completion_tokens
        job.last_output_at = now
        if not job.output:
            job.output = True
            job.state = JobState.DECODE
            job.emit({"type": "started", "cached_tokens": c.cached_tokens, "fetched_tokens": 0})
        delta = c.text[len(job.text) :] if c.text.startswith(job.text) else c.text
        job.text = c.text
        if delta:
            job.emit({"type": "token", "text": delta})

    def _done(self, job: SglangJob, c: Chunk) -> None:
        if c.finish_reason == "abort":
            self._fail(job, "SGLang aborted the request", 502)
            return
        self.records.finished(job.rid, c.completion_tokens, c.spec_verify_ct)
        usage = {
            "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
        }
        self.metrics.requests.labels(job.phase, "done").inc()
        job.finish({"type": "done", "finish_reason": c.finish_reason, "usage": usage})

    def _prefill_answer(self, job: SglangJob, c: Chunk) -> None:
        """The prefill request ended (its KV went to the decode node, or SGLang gave up on it)."""
        if c.error is not None or c.finish_reason == "abort":
            self.metrics.fetch_failures.labels("handover").inc()
            log.warning("SGLang prefill %s ended without a hand-over: %s", job.rid, c.error or "aborted")

    def _fail(self, job: SglangJob, message: str, status: int, too_long: bool = False) -> None:
        """End ``job`` with an error event (``too_long``: SGLang refused it for its length)."""
        if (
            job.handover is not None
            and not job.output
            and status >= 500
            and job.state is not JobState.FINISHED
        ):
            # the KV never came (SGLang's decode mode cannot prefill): the source prefills it again
            self.metrics.fetch_failures.labels("handover").inc()
            job.retrying = True
            job.spawn(self._prefill_again(job, message))
            return
        self._fail_now(job, message, status, too_long)

    async def _prefill_again(self, job: SglangJob, why: str) -> None:
        assert job.handover is not None and self.http is not None
        g, payload = job.handover
        job.handover = None  # once
        assert g.kv_source is not None
        source = g.kv_source.url
        log.warning("%s: KV hand-over failed (%s); prefilling it again at %s", g.request_id, why, source)
        try:
            transfer = await prefill_again(
                self.http, source, g, self.s.request_timeout_s, self._authorization
            )
            port, room = parse_transfer_id(transfer)
        except (FetchError, BadRequestError) as e:
            # nothing went to the router yet: it places the request again from the start
            job.retrying = False
            message = f"KV hand-over failed ({why}); the prefill node could not redo it: {e}"
            log.warning("%s: %s; handing it back (%s)", g.request_id, message, KV_SOURCE_LOST)
            self.metrics.requeued.labels(KV_SOURCE_LOST).inc()
            job.finish({"type": "requeue", "reason": KV_SOURCE_LOST, "message": message})
            self._gone(job)
            return
        self.metrics.handover_recomputed.inc()
        self.metrics.recomputed_tokens.inc(len(g.prompt_token_ids))
        self.jobs.pop(job.rid, None)
        self.records.gone(job.rid)
        job.rid = f"{job.rid}-again"[:256]
        job.retrying = False
        self.jobs[job.rid] = job
        self.records.submitted(job.rid, time.monotonic(), len(g.prompt_token_ids), prefills_here=False)
        payload = payload | {"rid": job.rid, "bootstrap_port": port, "bootstrap_room": room}
        self._hold(self._forward(job, payload))

    def _fail_now(self, job: SglangJob, message: str, status: int, too_long: bool = False) -> None:
        self.metrics.requests.labels(job.phase, "error").inc()
        log.warning("%s (%s): %s", job.request_id, job.phase, message)
        event: dict[str, Any] = {"type": "error", "message": message}
        if status < 500:
            event["status"] = status
        if too_long:
            event["reason"] = TOO_LONG
        job.finish(event)

    def _gone(self, job: SglangJob) -> None:
        if job.retrying:  # stays (a drain waits for it) until the new prefill's answer
            return
        self.jobs.pop(job.rid, None)
        self.records.gone(job.rid)
        job.finish()
        if not self.jobs:
            self.idle.set()

    def abort(self, job: SglangJob, requeue: str | None) -> None:
        """Take ``job`` out of SGLang (the router hung up, or a drain hands it back)."""
        if requeue is not None:
            self.metrics.requeued.labels(requeue).inc()
            job.finish({"type": "requeue", "reason": requeue})
        else:
            job.finish()  # cancels a new prefill under way
        if job.retrying:
            job.retrying = False
            self._gone(job)
            return
        if self.http is not None and job.rid in self.jobs:
            self._hold(self._abort_in_sglang(job.rid))

    async def _abort_in_sglang(self, rid: str) -> None:
        assert self.http is not None
        try:
            async with self.http.post(
                self.url + "/abort_request", json={"rid": rid}, timeout=aiohttp.ClientTimeout(total=10)
            ) as r:
                if r.status != 200:
                    log.warning("SGLang /abort_request %s: HTTP %d", rid, r.status)
        except (aiohttp.ClientError, TimeoutError) as e:
            log.warning("SGLang /abort_request %s: %s", rid, e)
