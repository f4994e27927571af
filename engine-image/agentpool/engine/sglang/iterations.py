"""Iteration records and ``t_acc`` for the planner, derived from what SGLang shows its only client (pure).

SGLang keeps no per-iteration record it would hand out: its Prometheus gauges are sampled at its log
interval (``sglang:gen_throughput``, ``sglang:spec_accept_length``, every ``decode_log_interval``
batches), its per-request ``meta_info`` carries counts and request-level times, and its device timer
(``sglang:gpu_execution_seconds_total``, behind ``SGLANG_ENABLE_METRICS_DEVICE_TIMER``) sums forward
passes without their batch composition. What the agent does see, as SGLang's only client, is every
request's stream: SGLang sends each request's new tokens after each forward pass (``stream_interval``
1, its default), with ``meta_info`` (``completion_tokens``, ``cached_tokens``) on every chunk. From
those arrival times (this agent's monotonic clock) it derives:

- **decode** records: the chunks of one request (the *pacer*, one decoding request at a time, so
  that a pass is counted once, not once per request) time the passes: a chunk spans as many passes
  as it has new tokens (with speculative decoding new tokens / the accept length so far). Passes in a
  row with the same number of decoding requests (this agent's, with output and not finished: the
  batch, since the agent is SGLang's only client) and no prefill finishing on this node in between
  make one record of their mean time (:data:`MIN_SEGMENT_PASSES` to :data:`SEGMENT_PASSES`
  passes; shorter runs are dropped): averaging over a run
  of passes keeps the jitter of the path SGLang's scheduler -> detokenizer -> HTTP -> agent (and of
  this agent's event loop) small against a pass; in steady state the chunk period is the pass
  period and the path's offset cancels. A gap across which the batch changed, a prefill finished
  (another request's first chunk arrived: the gap holds a prefill pass) or SGLang was paused is
  dropped, and so is a run whose passes seem to last under ``group_s`` (its chunks were read in
  bursts: this agent's loop lagged). ``running`` can be off by a request whose last chunk of a
  pass arrived after the pacer's (the run then ends one pass early), and counts a request SGLang
  retracted (memory pressure) until it finishes; a pacer silent for :data:`PACER_STALL_S` while
  others get output hands over to the most recently active request.
- **prefill** records, where prefills stream (a colocated node): the requests whose first chunks
  arrive within ``group_s`` of each other ran in one prefill pass; it began at the later of the
  previous output of any request (the end of the pass before) and the last submission among them,
  and ended at the first arrival. Batch: per request ``t_uc = prompt - cached``, ``t_c = cached``
  (SGLang's own ``cached_tokens``; host-tier hits count as cached, ``t_rst`` is 0). A batch over
  ``max_prefill_tokens`` uncached tokens (SGLang's ``--chunked-prefill-size``) ran in several passes
  and is dropped, and so is one that seems to last under ``group_s`` (its first chunk and the
  output before were read in one burst: this agent's loop lagged). Approximate by the submission
  overhead when the node was idle (HTTP to SGLang, its scheduler's wake-up: milliseconds) and the
  same path jitter as decode; the agent needs CPU of its own for its stamps to be close (on a
  starved machine a late stamp on the output before shortens the pass it measures).
- **t_acc**: SGLang's own per-request accept length, ``completion_tokens / spec_verify_ct`` (the
  ``meta_info`` of a finished request under speculative decoding), summed over the requests that
  finished since the last report; without speculative decoding (no ``spec_verify_ct``) 1.0, since
  every decode pass emits one token per request. ``None`` when nothing finished decoding.

A prefill-role node's requests (answered after the KV left for the decode node) give no records; a
decode-role node's first chunks are decode passes (the KV came by transfer), not prefills.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from agentpool.wire.iterations import (
    MAX_ITERATIONS_PER_REPORT,
    WireDecodeIteration,
    WireIteration,
    WirePrefillItem,
    WirePrefillIteration,
)

GROUP_S = 0.004  # first chunks this close together came out of one prefill pass
SEGMENT_PASSES = 16  # decode passes averaged into one record at most
MIN_SEGMENT_PASSES = 3  # fewer: the jitter of one chunk's arrival weighs too much
PACER_STALL_S = 2.0  # a pacer silent this long while others get output (SGLang retracted it) is replaced


@dataclass(slots=True)
class _Req:
    submitted: float
    prompt: int
    prefills_here: bool
    decoding: bool = False
    last_at: float = 0.0
    completion: int = 0


@dataclass(slots=True)
class _Segment:
    start: float
    end: float
    passes: int
    running: int


@dataclass(slots=True)
class _Group:
    first_at: float
    start: float
    items: list[tuple[int, int]]


class IterationRecorder:
    def __init__(self, max_prefill_tokens: int, group_s: float = GROUP_S) -> None:
        self.max_prefill_tokens = max_prefill_tokens
        self.group_s = group_s
        self.epoch_offset = time.time() - time.monotonic()
        self._held: list[WireIteration] = []  # finished, not yet in time order with what may come
        self.dropped = 0  # gaps and prefill groups not recorded (mixed passes, chunked, after a pause)
        self._reqs: dict[str, _Req] = {}
        self._pacer: str | None = None
        self._seq = 0
        self._last_output = -math.inf  # the last chunk of any request: the end of a pass
        self._last_prefill = -math.inf  # the last first chunk of a request prefilled here
        self._barrier = -math.inf  # nothing before (a pause for a switch) counts
        self._group: _Group | None = None
        self._decoding = 0
        self._segment: _Segment | None = None  # the pacer's passes in a row, same batch
        self._spec_tokens = 0
        self._spec_steps = 0
        self._plain_finished = 0
        self._accept_tokens = 0  # since start: the accept length that splits a chunk into passes
        self._accept_steps = 0

    # -- what the backend tells it --------------------------------------------------------------
    def submitted(self, rid: str, now: float, prompt_tokens: int, prefills_here: bool) -> None:
        self._reqs[rid] = _Req(now, prompt_tokens, prefills_here)

    def output(self, rid: str, now: float, completion_tokens: int, cached_tokens: int) -> None:
        """A chunk of ``rid``'s stream arrived (``completion_tokens`` so far, SGLang's ``cached_tokens``)."""
        self._close_group(now)
        r = self._reqs.get(rid)
        if r is None:
            return
        if not r.decoding:
            r.decoding = True
            self._decoding += 1
            if self._pacer is None:
                self._pacer = rid
            r.last_at, r.completion = now, completion_tokens
            if r.prefills_here:
                self._prefill_done(r, now, cached_tokens)
            self._last_output = max(self._last_output, now)
            return
        new, prev = completion_tokens - r.completion, r.last_at
        r.last_at, r.completion = now, completion_tokens
        self._last_output = max(self._last_output, now)
        if new <= 0 or rid != self._pacer:
            return
        passes = new
        if self._accept_steps:
            passes = max(1, round(new * self._accept_steps / self._accept_tokens))
        clean = self._last_prefill <= prev and prev >= self._barrier and now > prev
        seg = self._segment
        if seg is not None and clean and seg.end == prev and seg.running == self._decoding:
            seg.end = now
            seg.passes += passes
            if seg.passes >= SEGMENT_PASSES:
                self._close_segment(reopen=True)
            return
        self._close_segment()
        if not clean:
            self.dropped += 1
        self._segment = _Segment(now, now, 0, self._decoding)

    def finished(self, rid: str, completion_tokens: int, spec_verify_ct: int | None) -> None:
        r = self._remove(rid)
        if r is None or not r.decoding:
            return
        if spec_verify_ct:
            self._spec_tokens += completion_tokens
            self._spec_steps += spec_verify_ct
            self._accept_tokens += completion_tokens
            self._accept_steps += spec_verify_ct
        elif spec_verify_ct is None:
            self._plain_finished += 1

    def gone(self, rid: str) -> None:
        """``rid`` ended without a finish (aborted, failed, handed back)."""
        self._remove(rid)

    def barrier(self, now: float) -> None:
        """SGLang was paused (a switch): no gap or prefill group reaching back before ``now`` counts."""
        self._close_segment()
        self._group = None
        self._barrier = now

    # -- what the load report takes ---------------------------------------------------------------
    def take(self, now: float) -> list[WireIteration]:
        self._close_group(now)
        pacer = self._reqs.get(self._pacer) if self._pacer is not None else None
        if pacer is not None and self._last_output - pacer.last_at > PACER_STALL_S:
            self._close_segment()
            live = [k for k, o in self._reqs.items() if o.decoding]
            self._pacer = max(live, key=lambda k: self._reqs[k].last_at)
        if self._segment is not None and self._segment.passes >= MIN_SEGMENT_PASSES:
            self._close_segment(reopen=True)
        # what is still open starts no earlier than this: records before it are final, in order
        opened = [self._last_output]
        if self._segment is not None:
            opened.append(self._segment.start)
        if self._group is not None:
            opened.append(self._group.start)
        mark = self._epoch(min(opened))
        self._held.sort(key=lambda r: r.at)
        n = next((i for i, r in enumerate(self._held) if r.at > mark), len(self._held))
        ready, self._held = self._held[:n], self._held[n:]
        out = []
        for r in ready[-MAX_ITERATIONS_PER_REPORT:]:  # numbered in time order (the planner's order)
            out.append(r.model_copy(update={"seq": self._seq}))
            self._seq += 1
        return out

    def take_t_acc(self) -> float | None:
        if self._spec_steps:
            t = self._spec_tokens / self._spec_steps
        elif self._plain_finished:
            t = 1.0
        else:
            t = None
        self._spec_tokens = self._spec_steps = self._plain_finished = 0
        return t

    # -- inside -----------------------------------------------------------------------------------
    def _remove(self, rid: str) -> _Req | None:
        r = self._reqs.pop(rid, None)
        if r is not None and r.decoding:
            self._decoding -= 1
            if self._pacer == rid:  # another decoding request paces from its next chunk on
                self._close_segment()
                self._pacer = next((k for k, o in self._reqs.items() if o.decoding), None)
        return r

    def _close_segment(self, reopen: bool = False) -> None:
        """Record the run of passes so far (``reopen``: the run goes on from its end)."""
        seg, self._segment = self._segment, None
        if seg is None:
            return
        seconds = (seg.end - seg.start) / max(1, seg.passes)
        if seg.passes >= MIN_SEGMENT_PASSES and seg.running >= 1 and seconds > self.group_s:
            at = self._epoch(seg.start)
            self._add(WireDecodeIteration(seq=0, at=at, seconds=seconds, running=seg.running))
        elif seg.passes:
            self.dropped += 1
        if reopen:
            self._segment = _Segment(seg.end, seg.end, 0, seg.running)

    def _epoch(self, mono: float) -> float:
        return max(0.0, mono + self.epoch_offset)

    def _add(self, rec: WireIteration) -> None:
        if len(self._held) < 4 * MAX_ITERATIONS_PER_REPORT:
            self._held.append(rec)

    def _prefill_done(self, r: _Req, now: float, cached: int) -> None:
        item = (max(0, r.prompt - cached), max(0, cached))
        g = self._group
        if g is not None and now - g.first_at <= self.group_s:
            g.items.append(item)
            g.start = max(g.start, r.submitted)
        else:
            self._group = _Group(now, max(self._last_output, r.submitted, self._barrier), [item])
        self._last_prefill = now

    def _close_group(self, now: float) -> None:
        g = self._group
        if g is None or now - g.first_at <= self.group_s:
            return
        self._group = None
        seconds = g.first_at - g.start
        uncached = sum(uc for uc, _ in g.items)
        # within group_s of the output before: both were read in one burst (this agent's loop lagged)
        # and the pass cannot be told from the lag
        if (
            seconds <= self.group_s
            or not math.isfinite(g.start)
            or not 0 < uncached <= self.max_prefill_tokens
        ):
            self.dropped += 1
            return
        batch = [WirePrefillItem(t_uc=uc, t_c=c) for uc, c in g.items]
        self._add(WirePrefillIteration(seq=0, at=self._epoch(g.start), seconds=seconds, batch=batch))
