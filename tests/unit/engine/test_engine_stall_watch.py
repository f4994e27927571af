"""Silent engine streams: the stall log (what a request waits for) and a hand-over that fails with
something other than a transfer error.

- :class:`StallWatch` reports a stream silent for its threshold, again each time the silence doubles,
  and says when it streams again or ends;
- the ``sim`` backend names what a request waits for (the KV hand-over from its prefill node, the
  NIXL thread, the driver loop); the ``sglang`` backend what its agent knows (SGLang's rid and load);
- a hand-over that raises an unexpected error ends the decode stream with an ``error`` event at once
  (the router fails the request with the cause instead of timing out after 120 s of silence), gives
  its KV reservation back and lets a drain complete (before: the stream stayed silent forever and
  the node could never finish a role switch).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from agentpool.engine.config import EngineConfig
from agentpool.engine.errors import FetchError
from agentpool.engine.hostpool import HostPool
from agentpool.engine.jobs import EventStream, JobState
from agentpool.engine.kvstate import KvLedger, NoSink
from agentpool.engine.metrics import EngineMetrics
from agentpool.engine.sglang.control import SglangLoad
from agentpool.engine.sglang.job import SglangJob
from agentpool.engine.sglang.stalls import sglang_wait
from agentpool.engine.simbackend import SimBackend
from agentpool.engine.stall_watch import StallWatch, sim_wait
from agentpool.node import GpuCache, Role
from agentpool.wire.engine import GenerateRequest, KvSource


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_silent_stream_is_reported_at_the_threshold_then_at_each_doubling() -> None:
    clock = Clock()
    s = EventStream("req-1", "decode", state=JobState.DECODE)
    queued = EventStream("req-2", "prefill")  # queued: waits long normally under load
    s.last_event_at = queued.last_event_at = clock.t
    streams = [s, queued]
    watch = StallWatch(
        lambda: streams,
        lambda _s, _now: "waiting for Godot",
        threshold_s=10,
        queued_threshold_s=60,
        clock=clock,
    )
    clock.t += 9.9
    assert watch.check() == []
    clock.t += 0.2
    (line,) = watch.check()
    assert line.startswith("request req-1 (decode, decode) has sent nothing for 10.1 s: waiting for Godot")
    clock.t += 5
    assert watch.check() == []  # 15.1 s: not yet twice the silence reported
    clock.t += 5.2
    (line,) = watch.check()
    assert "has sent nothing for 20.3 s" in line
    s.last_event_at = clock.t  # it speaks again
    assert watch.check() == ["request req-1 (decode) streams again after a stall"]
    clock.t += 10
    assert "has sent nothing for 10.0 s" in watch.check()[0]
    streams.remove(s)  # it ended
    assert watch.check() == ["request req-1 (decode) ended after a stall (decode)"]
    assert watch.check() == []
    clock.t = queued.last_event_at + 60.1  # the queued one
    (line,) = watch.check()
    assert line.startswith("request req-2 (prefill, queued) has sent nothing for 60.1 s")


def test_an_event_loop_that_ran_nothing_for_the_threshold_is_reported() -> None:
    watch = StallWatch(list, lambda _s, _now: "", threshold_s=10, check_s=2)
    assert watch.lagged(2.0) is None and watch.lagged(11.9) is None
    assert watch.lagged(12.5) == "the event loop ran nothing for 10.5 s (a 2 s sleep took 12.5 s)"


@dataclass
class Transport:
    busy_since: float | None = None
    pending: int = 0


@dataclass
class Fetcher:
    """The backend's seam to peers (``PeerFetcher``): a hand-over that waits, or fails with ``error``."""

    error: BaseException | None = None
    release: asyncio.Event = field(default_factory=asyncio.Event)
    transport: Transport = field(default_factory=Transport)

    async def fetch_transfer(self, peer_url: str, transfer_id: str) -> Any:
        self.transport.pending += 1
        try:
            if self.error is not None:
                raise self.error
            await self.release.wait()
            raise FetchError("released")
        finally:
            self.transport.pending -= 1


def backend(fetcher: Fetcher) -> SimBackend:
    cfg = EngineConfig.model_validate(
        {"nodeId": "d0", "role": "decode", "insecureAllowUnauthenticated": True, "hostKvBytes": 1 << 20,
         "blockBytes": 4096, "stallLogS": 0.05}
    )  # fmt: skip
    pool = HostPool(cfg.host_slots, cfg.block_bytes, None)
    ledger = KvLedger(GpuCache(64), pool, NoSink())
    return SimBackend(cfg, ledger, pool, None, fetcher, EngineMetrics())  # type: ignore[arg-type]


def decode_request() -> GenerateRequest:
    return GenerateRequest(
        request_id="req-7",
        dispatch_seq=1,
        phase="decode",
        endpoint="chat",
        body={"max_tokens": 8},
        prompt_token_ids=list(range(300)),
        kv_source=KvSource(node_id="p0", url="http://127.0.0.1:9/", transfer_id="p0.1.req-7"),
    )


async def test_the_stall_log_names_the_hand_over_a_decode_request_waits_for() -> None:
    fetcher = Fetcher()
    b = backend(fetcher)
    job = b.admit(decode_request())
    assert job is not None and job.state is JobState.HANDOVER
    await asyncio.sleep(0.1)
    text = sim_wait(b, job, job.last_event_at + 0.1)
    assert "waiting for the KV hand-over from http://127.0.0.1:9/ (transfer p0.1.req-7) for 0.1 s" in text
    assert "node decode serving" in text and "KV arriving 1" in text and "1 reads pending" in text
    (line,) = b.stalls.check()
    assert line.startswith("request req-7 (decode, handover) has sent nothing for ")
    fetcher.release.set()  # the transfer fails: recomputed here, as before
    await asyncio.sleep(0.05)
    assert job.state is JobState.QUEUED and b.node.joining == 0


async def test_an_unexpected_hand_over_error_ends_the_stream_at_once_and_the_node_can_drain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    b = backend(Fetcher(error=KeyError("slot")))
    job = b.admit(decode_request())
    assert job is not None
    with caplog.at_level(logging.ERROR, logger="agentpool.engine.jobs"):
        async with asyncio.timeout(2):
            events = [ev async for ev in job.stream()]
        await asyncio.sleep(0.01)  # the task's done callback logs
    assert events == [{"type": "error", "message": "KV hand-over from http://127.0.0.1:9/: KeyError: 'slot'"}]
    assert "request req-7 (decode): task SimBackend._handover failed: KeyError('slot')" in caplog.text
    assert b.jobs == {} and b.node.joining == 0 and b.node.kv_used_tokens == 0
    b.begin_drain()
    async with asyncio.timeout(2):
        await b.wait_drained()
    await b.switch(Role.PREFILL)
    assert b.role is Role.PREFILL


def test_the_sglang_stall_log_says_what_the_agent_knows_of_the_request() -> None:
    """``sglang_wait``: SGLang's rid, no output yet / the last chunk / a hand-over being redone, and
    SGLang's last load (a stand-in backend: only the fields it reads)."""
    job = SglangJob(request_id="r1", phase="both", rid="n0-7-r1", prompt_tokens=9000, cached_tokens=8000)
    b: Any = SimpleNamespace(
        last_load=None, load_errors=2, process=SimpleNamespace(pid=4242), jobs={job.rid: job}
    )
    b.not_ready_reason = lambda: ""
    assert sglang_wait(b, job, 100.0) == (
        "SGLang rid n0-7-r1; no output from SGLang yet (9000 prompt tokens, ~1000 uncached); "
        "no load read from SGLang yet (2 load reads failed); SGLang pid 4242, ready; 1 of our requests in it"
    )
    job.output, job.tokens_out, job.last_output_at = True, 37, 88.0
    b.last_load = SglangLoad(
        running=0, waiting=1, waiting_uncached_tokens=9000, used_tokens=5, capacity_tokens=9
    )
    line = sglang_wait(b, job, 100.0)
    assert "37 tokens out, the last chunk 12.0 s ago" in line
    assert "SGLang's last load: 0 running, 1 waiting, KV 5 of 9 tokens" in line
    job.retrying = True
    assert "its KV hand-over failed: the prefill is being redone at the source" in sglang_wait(b, job, 100.0)
