"""The router's work log: one record per finished request, occupancy, a bounded ring buffer, cursors."""

from __future__ import annotations

import pytest

from agentpool.models import OccupancyCount, Work
from agentpool.router.work_log import WorkLog
from agentpool.wire.work import parse_cursor


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_finished_request_is_one_record_with_measured_output_and_the_last_dispatch_work() -> None:
    clock = Clock()
    log = WorkLog("r0", clock=clock)
    log.routed("a", Work(t_uc=900, t_c=100, t_out=4096))
    log.routed("a", Work(t_uc=200, t_c=800, t_out=4096))  # retried on a node with more cached
    assert log.in_flight == 1
    clock.now = 1010.0
    log.finished("a", output_tokens=51)
    log.finished("a", output_tokens=51)  # reported twice: counted once
    log.routed("b", Work(t_uc=5, t_out=100))
    log.finished("b", output_tokens=0)  # failed before its first token: no record
    log.finished("never-routed", output_tokens=3)
    batch = log.batch(None)
    assert [(r.at, r.t_uc, r.t_c, r.t_out, r.t_acc) for r in batch.requests] == [(1010.0, 200, 800, 50, 1.0)]
    assert log.in_flight == 0 and batch.occupancy == []


def test_occupancy_counts_requests_in_flight_and_drops_requests_never_finished() -> None:
    clock = Clock()
    log = WorkLog(clock=clock, max_request_s=60)
    log.routed("a", Work(t_uc=1))
    clock.now += 30
    log.routed("b", Work(t_uc=1))
    log.sample()
    clock.now += 40  # "a" is 70 s old: its end was never reported
    log.sample()
    samples = log.batch(None).occupancy
    assert [(s.requests, s.counts) for s in samples] == [(2, OccupancyCount.IN_FLIGHT), (1, "in_flight")]
    assert log.abandoned == 1 and log.in_flight == 1


def test_in_flight_tracking_is_bounded() -> None:
    log = WorkLog(max_in_flight=3)
    for i in range(10):
        log.routed(str(i), Work(t_uc=1))
    assert log.in_flight == 3 and log.abandoned == 7
    log.finished("9", 2)
    log.finished("0", 2)  # forgotten: no record
    assert len(log.batch(None).requests) == 1


def test_cursor_returns_only_newer_entries_in_pages_and_reports_what_the_ring_overwrote() -> None:
    log = WorkLog(capacity=5)
    for _ in range(3):
        log.sample()
    first = log.batch(None, limit=2)
    assert [s.seq for s in first.occupancy] == [1, 2] and first.more and first.reset
    second = log.batch(first.next)
    assert [s.seq for s in second.occupancy] == [3] and not second.more and not second.reset
    assert log.batch(second.next).occupancy == [] and log.batch(second.next).next == second.next
    for _ in range(7):  # seq 4..10; the ring keeps 6..10
        log.sample()
    late = log.batch(second.next)
    assert late.dropped == 2 and [s.seq for s in late.occupancy] == [6, 7, 8, 9, 10]
    assert parse_cursor(late.next) == (log.epoch, 10)


def test_a_cursor_from_another_router_process_starts_over() -> None:
    old, new = WorkLog(), WorkLog()
    old.sample()
    new.sample()
    batch = new.batch(old.batch(None).next)
    assert batch.reset and batch.dropped == 0 and [s.seq for s in batch.occupancy] == [1]


@pytest.mark.parametrize("cursor", ["", "abc", "e.x", ".5", "e.-1"])
def test_malformed_cursors_and_limits_are_rejected(cursor: str) -> None:
    with pytest.raises(ValueError):
        WorkLog().batch(cursor)
    with pytest.raises(ValueError):
        WorkLog().batch(None, limit=0)


def test_every_batch_carries_the_role_each_engine_last_said_it_serves() -> None:
    clock = Clock()
    log = WorkLog("r0", clock=clock)
    assert log.batch(None).served == []
    log.served_role("e-1", "decode")
    log.served_role("e-0", "both")
    clock.now = 1005.0
    log.served_role("e-0", "prefill", 80_000)  # its report after a switch, with its KV capacity
    first = log.batch(None)
    assert [(s.node, s.role, s.at, s.kv_capacity_tokens) for s in first.served] == [
        ("e-0", "prefill", 1005.0, 80_000),
        ("e-1", "decode", 1000.0, None),
    ]
    # not part of the log: a poll with the latest cursor still gets them
    assert log.batch(first.next).served == first.served


def test_finished_records_leave_the_cyclic_gc_after_one_collection() -> None:
    """A full ring (65,536 records by default) is not walked by every full collection: each finished
    request's record holds numbers only, which the GC stops tracking (fails if a record is an object)."""
    import gc

    log = WorkLog("r0", capacity=1000, clock=Clock())
    for i in range(1000):
        log.routed(f"r{i}", Work(t_uc=10, t_c=5, t_out=3))
        log.finished(f"r{i}", output_tokens=4)
    gc.collect()
    assert not any(gc.is_tracked(e) for e in log._entries)
    batch = log.batch(None)
    assert len(batch.requests) == 1000
    assert (batch.requests[-1].seq, batch.requests[-1].t_uc, batch.requests[-1].t_out) == (1000, 10, 3)
