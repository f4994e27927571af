from __future__ import annotations

import pytest

from agentpool.models import (
    DecodeModel,
    NodeModel,
    OccupancySample,
    PrefillBatchItem,
    PrefillModel,
    RequestWorkRecord,
    Work,
    WorkSlice,
    mean_work,
    measure_prefill_window,
    slice_window,
    with_window_stats,
)


def test_slices_average_work_and_occupancy_and_leave_out_empty_slices() -> None:
    requests = [
        RequestWorkRecord(at=0.0, work=Work(t_uc=100, t_c=1000, t_out=10)),
        RequestWorkRecord(at=9.99, work=Work(t_uc=300, t_c=3000, t_out=30, t_acc=2)),
        RequestWorkRecord(at=25.0, work=Work(t_uc=50, t_out=5)),
        RequestWorkRecord(at=30.0, work=Work(t_uc=1, t_out=1)),  # at the window end: excluded
        RequestWorkRecord(at=-0.1, work=Work(t_uc=1, t_out=1)),  # before the window: excluded
    ]
    occupancy = [OccupancySample(0.5, 10), OccupancySample(5, 20), OccupancySample(21, 7)]
    w = slice_window(requests, occupancy, start=0.0, end=30.0, m=3)
    assert w.empty_slices == 1  # slice [10, 20) has neither requests nor samples
    assert w.slices == (
        WorkSlice(Work(t_uc=200, t_c=2000, t_out=20, t_acc=1.5), 15.0, start=0.0, end=10.0),
        WorkSlice(Work(t_uc=50, t_out=5), 7.0, start=20.0, end=30.0),  # its time span kept
    )


def test_a_slice_has_both_times_or_neither() -> None:
    with pytest.raises(ValueError, match="both"):
        WorkSlice(Work(t_uc=1, t_out=1), 1.0, start=0.0)
    with pytest.raises(ValueError, match="ends after"):
        WorkSlice(Work(t_uc=1, t_out=1), 1.0, start=5.0, end=5.0)


def test_slice_with_requests_but_no_occupancy_sample_is_left_out() -> None:
    w = slice_window([RequestWorkRecord(1, Work(t_uc=1, t_out=1))], [], 0, 10, 2)
    assert w.slices == () and w.empty_slices == 2


def test_bad_windows_and_slices_are_rejected() -> None:
    with pytest.raises(ValueError):
        slice_window([], [], 10, 10, 2)
    with pytest.raises(ValueError):
        slice_window([], [], 0, 10, 0)
    with pytest.raises(ValueError, match="no requests"):
        WorkSlice(Work(t_uc=0, t_out=3), 1)
    with pytest.raises(ValueError):
        WorkSlice(Work(t_uc=1, t_out=3), -1)
    with pytest.raises(ValueError):
        mean_work([])


def test_prefill_window_remeasures_t_bar_and_restore_fraction() -> None:
    batches = [
        [PrefillBatchItem(t_uc=4000, t_c=10000, t_rst=5000), PrefillBatchItem(t_uc=2000, t_c=0)],
        [PrefillBatchItem(t_uc=2000, t_c=10000, t_rst=0)],
        [PrefillBatchItem(t_uc=0, t_c=5000, t_rst=5000)],  # no new tokens: not an iteration that counts
    ]
    stats = measure_prefill_window(batches)
    assert stats is not None
    assert stats.iterations == 2
    assert stats.t_bar == pytest.approx(4000)
    assert stats.f_restore == pytest.approx(5000 / 20000)
    model = NodeModel(PrefillModel(0.01, 1e-5, 1e-10, 1e-6), DecodeModel(0.01, 0.01, 1e-4))
    updated = with_window_stats(model, stats)
    assert (updated.t_bar, updated.f_restore) == (4000, 0.25)
    assert updated.prefill == model.prefill
    assert measure_prefill_window([]) is None
    assert with_window_stats(model, None) is model


def test_occupancy_of_several_routers_is_summed_per_slice_and_averaged_per_router() -> None:
    from agentpool.models import OccupancyCount

    reqs = [RequestWorkRecord(1, Work(t_uc=10, t_out=5))]
    samples = [
        OccupancySample(1, 40, source="router-a"),
        OccupancySample(3, 60, source="router-a"),  # router-a: 50 on average
        OccupancySample(2, 30, source="router-b"),
        OccupancySample(4, 30, OccupancyCount.IN_DECODE, source="router-b"),  # another count
    ]
    w = slice_window(reqs, samples, 0, 10, 1, counts=OccupancyCount.IN_FLIGHT)
    assert w.slices[0].decode_occupancy == 80.0
    w = slice_window(reqs, samples, 0, 10, 1, counts=OccupancyCount.IN_DECODE)
    assert w.slices[0].decode_occupancy == 30.0
    with pytest.raises(ValueError, match="count different things"):
        slice_window(reqs, samples, 0, 10, 1)


def test_occupancy_sample_names_what_it_counts_and_keeps_the_old_name() -> None:
    from agentpool.models import DEFAULT_OCCUPANCY, OccupancyCount

    s = OccupancySample(2.0, 7.0)  # the simulator's positional call
    assert s.counts is DEFAULT_OCCUPANCY is OccupancyCount.IN_FLIGHT
    assert s.requests == s.in_decode == 7.0 and s.source == ""
    with pytest.raises(ValueError):
        OccupancySample(0.0, -1.0)
    with pytest.raises(ValueError):
        OccupancySample(0.0, float("nan"))
