"""Iteration records and t_acc from SGLang's streams (pure): a scheduler of SGLang's kind (a prefill
pass for the waiting requests, else a decode pass for the running ones; outputs after each pass)
with known iteration times; the records it yields fit back to those times."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from agentpool.engine.sglang.iterations import IterationRecorder
from agentpool.models import MoeShape
from agentpool.models.fitting import fit_decode, fit_prefill
from agentpool.wire.iterations import WireDecodeIteration, WirePrefillIteration

P0, P1, D0, D2 = 0.02, 1e-4, 0.01, 1e-3


@dataclass
class Arrival:
    at: float
    rid: str
    prompt: int
    cached: int
    out: int


def serve(arrivals: list[Arrival], rec: IterationRecorder, seed: int = 1, chunk: int = 8192) -> None:
    """SGLang's loop in virtual time; every output reaches the agent up to 0.5 ms late (jitter)."""
    rng = random.Random(seed)
    pending = sorted(arrivals, key=lambda a: a.at)
    events: list[tuple[float, int, str, Arrival | None, int]] = []  # (time, order, kind, arrival, done)
    for a in pending:
        events.append((a.at, 0, "submit", a, 0))
    t = 0.0
    waiting: list[Arrival] = []
    running: dict[str, list[int]] = {}
    by_id = {a.rid: a for a in arrivals}
    while pending or waiting or running:
        while pending and pending[0].at <= t:
            waiting.append(pending.pop(0))
        if waiting:
            batch, total = [], 0
            while waiting and total + waiting[0].prompt - waiting[0].cached <= chunk:
                a = waiting.pop(0)
                batch.append(a)
                total += a.prompt - a.cached
            t += P0 + P1 * total
            for a in batch:
                events.append((t + rng.uniform(0, 5e-4), 1, "out", a, 1))
                running[a.rid] = [1, a.out]
        elif running:
            t += D0 + D2 * len(running)
            for rid in list(running):
                c = running[rid]
                c[0] += 1
                events.append((t + rng.uniform(0, 5e-4), 1, "out", by_id[rid], c[0]))
                if c[0] == c[1]:
                    del running[rid]
        else:
            t = pending[0].at
    for at, _, kind, a, done in sorted(events, key=lambda e: (e[0], e[1])):
        assert a is not None
        if kind == "submit":
            rec.submitted(a.rid, at, a.prompt, prefills_here=True)
            continue
        rec.output(a.rid, at, done, a.cached)
        if done == a.out:
            rec.finished(a.rid, done, None)


def workload(n: int, seed: int = 2) -> list[Arrival]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(4.0)
        prompt = rng.choice([64, 300, 900, 2000, 3500])
        out.append(Arrival(t, f"r{i}", prompt, rng.choice([0, 0, prompt // 2]), rng.randint(10, 60)))
    return out


def test_the_records_of_sglang_like_passes_fit_back_to_their_iteration_times() -> None:
    rec = IterationRecorder(max_prefill_tokens=8192)
    serve(workload(300), rec)
    records = rec.take(1e9)
    prefill = [r.record("n") for r in records if isinstance(r, WirePrefillIteration)]
    decode = [r.record("n") for r in records if isinstance(r, WireDecodeIteration)]
    assert len(prefill) > 100 and len(decode) > 40
    pf = fit_prefill(prefill)
    assert pf.model.c1 == pytest.approx(P1, rel=0.05) and pf.model.c0 == pytest.approx(P0, rel=0.1)
    assert pf.report.mape_held_out < 0.03
    df = fit_decode(decode, MoeShape(experts_active=0, experts_total=0))
    assert df.model.d2 == pytest.approx(D2, rel=0.1) and df.model.d0 == pytest.approx(D0, rel=0.1)
    assert df.report.mape_held_out < 0.05
    assert rec.dropped > 0  # decode gaps that held a prefill pass
    assert rec.take_t_acc() == 1.0 and rec.take_t_acc() is None  # no speculative decoding: 1 per pass


def test_a_batch_of_first_chunks_is_one_prefill_record_with_sglang_cached_tokens() -> None:
    rec = IterationRecorder(max_prefill_tokens=1000)
    for rid in ("a", "b"):
        rec.submitted(rid, 10.0, 600, prefills_here=True)
    rec.output("a", 10.3, 1, 200)
    rec.output("b", 10.301, 1, 0)  # the same pass
    [r] = rec.take(11.0)
    assert isinstance(r, WirePrefillIteration) and r.seconds == pytest.approx(0.3)
    assert [(b.t_uc, b.t_c) for b in r.batch] == [(400, 200), (600, 0)]
    # over SGLang's chunk: several passes, no record
    rec.submitted("c", 12.0, 1500, prefills_here=True)
    rec.output("c", 12.5, 1, 0)
    assert rec.take(13.0) == [] and rec.dropped == 1


def test_decode_nodes_record_decode_passes_only_and_a_switch_cuts_the_gaps() -> None:
    rec = IterationRecorder(max_prefill_tokens=8192)
    rec.submitted("a", 0.0, 100, prefills_here=False)  # the KV came by transfer
    rec.submitted("b", 0.0, 100, prefills_here=False)
    rec.output("a", 0.05, 1, 0)
    rec.output("b", 0.05, 1, 0)
    rec.output("a", 0.07, 2, 0)
    rec.output("b", 0.07, 2, 0)
    rec.output("a", 0.13, 5, 0)  # three passes in one chunk (SGLang coalesced them)
    rec.output("b", 0.1301, 5, 0)
    rec.barrier(0.2)
    rec.output("a", 0.5, 6, 0)  # spans the pause: dropped
    rec.output("b", 0.5, 6, 0)
    for i, t in enumerate((0.52, 0.54, 0.56)):
        rec.output("b", t, 7 + i, 0)
        rec.output("a", t + 1e-4, 7 + i, 0)
    out = rec.take(1.0)
    assert all(isinstance(r, WireDecodeIteration) for r in out)
    # a run of passes with the same batch is one record of their mean time
    assert [(round(r.seconds, 3), r.running) for r in out] == [(0.02, 2), (0.02, 2)]  # type: ignore[union-attr]
    assert [r.seq for r in out] == [0, 1] and rec.dropped == 1


def test_t_acc_is_sglang_accept_length_and_splits_chunks_into_passes() -> None:
    rec = IterationRecorder(max_prefill_tokens=8192)
    rec.submitted("a", 0.0, 10, prefills_here=False)
    rec.output("a", 0.1, 1, 0)
    rec.output("a", 0.2, 9, 0)
    rec.finished("a", 9, 6)  # SGLang: spec_accept_length = 9 / 6
    assert rec.take_t_acc() == pytest.approx(1.5)
    rec.submitted("b", 1.0, 10, prefills_here=False)
    rec.output("b", 1.1, 1, 0)
    rec.output("b", 1.13, 4, 0)
    rec.output("b", 1.16, 7, 0)  # 3 tokens at 1.5 per pass: 2 passes
    rec.output("b", 1.19, 10, 0)
    rec.finished("b", 10, 6)
    rec.output("a", 2.0, 10, 0)  # a finished one: ignored
    [r] = rec.take(3.0)
    assert isinstance(r, WireDecodeIteration) and r.seconds == pytest.approx(0.015) and r.running == 1
    assert rec.take_t_acc() == pytest.approx(10 / 6)


def test_a_stalled_pacer_hands_over_to_a_request_that_still_decodes() -> None:
    rec = IterationRecorder(max_prefill_tokens=8192)
    for rid in ("a", "b"):
        rec.submitted(rid, 0.0, 10, prefills_here=False)
        rec.output(rid, 0.1, 1, 0)
    rec.output("a", 0.12, 2, 0)  # a paces, then SGLang retracts it: b goes on alone
    for i in range(200):
        rec.output("b", 0.12 + 0.02 * i, 2 + i, 0)
    assert rec.take(4.1) == []  # nothing paced yet: a is the pacer
    for i in range(200, 210):
        rec.output("b", 0.12 + 0.02 * i, 2 + i, 0)
    out = rec.take(5.0)
    assert out and all(isinstance(r, WireDecodeIteration) and r.seconds == pytest.approx(0.02) for r in out)
