"""The wire between engines, routers and the planner: iteration records, t_acc, fitted models."""

from __future__ import annotations

import collections

import pytest
from pydantic import TypeAdapter, ValidationError

from agentpool.models import DecodeIterationRecord, DecodeModel, NodeModel, PrefillModel, Work
from agentpool.planner.router_source import IterationDeduper
from agentpool.router.work_log import WorkLog
from agentpool.wire.engine import LoadReport
from agentpool.wire.fits import ModelSet, WireNodeModel
from agentpool.wire.iterations import WireDecodeIteration, WireIteration, WirePrefillIteration
from agentpool.wire.work import WireNodeIteration, WorkBatch

ITERATION: TypeAdapter[WireIteration] = TypeAdapter(WireIteration)


def test_a_load_report_carries_t_acc_and_both_kinds_of_iteration() -> None:
    report = LoadReport.model_validate(
        {
            "node_id": "e0",
            "role": "both",
            "t_acc": 1.7,
            "iterations": [
                {
                    "phase": "prefill",
                    "seq": 0,
                    "at": 10.0,
                    "seconds": 0.2,
                    "batch": [{"t_uc": 900, "t_c": 100}],
                },
                {"phase": "decode", "seq": 1, "at": 10.2, "seconds": 0.02, "running": 7},
            ],
        }
    )
    assert report.t_acc == 1.7
    prefill, decode = (it.record("e0") for it in report.iterations)
    assert prefill.node == "e0" and prefill.at == 10.0 and prefill.seconds == 0.2
    assert not isinstance(prefill, DecodeIterationRecord)
    assert (prefill.batch[0].t_uc, prefill.batch[0].t_c, prefill.batch[0].t_rst) == (900, 100, 0)
    assert decode == DecodeIterationRecord("e0", 10.2, 7, 0.02)
    assert LoadReport(node_id="e0", role="both").t_acc is None  # absent: no decode ran


@pytest.mark.parametrize(
    "bad",
    [
        {"phase": "prefill", "seq": 0, "at": 1.0, "seconds": 0.1, "batch": []},  # no request
        {"phase": "decode", "seq": 0, "at": 1.0, "seconds": 0.1, "running": 0},
        {"phase": "decode", "seq": 0, "at": 1.0, "seconds": 0.0, "running": 1},
        {"phase": "decode", "seq": -1, "at": 1.0, "seconds": 0.1, "running": 1},
        {"phase": "mixed", "seq": 0, "at": 1.0, "seconds": 0.1, "running": 1},
        {"phase": "decode", "seq": 0, "at": 1.0, "seconds": float("inf"), "running": 1},
    ],
)
def test_malformed_iterations_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ITERATION.validate_python(bad)


@pytest.mark.parametrize("t_acc", [0.0, -1.0, float("nan"), 1000.0])
def test_a_report_rejects_impossible_t_acc(t_acc: float) -> None:
    with pytest.raises(ValidationError):
        LoadReport(node_id="e0", role="both", t_acc=t_acc)


def test_the_work_log_records_the_decode_nodes_t_acc_and_passes_iterations_on() -> None:
    log = WorkLog("r0", clock=lambda: 5.0)
    log.routed("a", Work(t_uc=100, t_out=64))
    log.decoding("a", 1.7)  # the decode node reported 1.7 tokens per iteration (MTP)
    log.finished("a", 33)
    log.routed("b", Work(t_uc=100, t_out=64))
    log.finished("b", 9)  # never decoded on a node that reported: 1
    its = [
        WirePrefillIteration(seq=0, at=1.0, seconds=0.1, batch=[{"t_uc": 5}]),  # type: ignore[list-item]
        WireDecodeIteration(seq=1, at=2.0, seconds=0.01, running=3),
    ]
    log.iterations("e0", its)
    log.models_version = 7
    batch = WorkBatch.model_validate_json(log.batch(None).model_dump_json())
    assert [(r.t_out, r.t_acc) for r in batch.requests] == [(32, 1.7), (8, 1.0)]
    assert [(i.node, i.iteration) for i in batch.iterations] == [("e0", its[0]), ("e0", its[1])]
    assert [i.seq for i in batch.iterations] == [3, 4]  # one sequence with the request records
    assert batch.models_version == 7
    again = log.batch(batch.next)
    assert again.iterations == [] and again.models_version == 7


def test_iterations_that_reach_the_planner_through_two_routers_count_once() -> None:
    dedupe = IterationDeduper()
    it = WireDecodeIteration(seq=4, at=50.0, seconds=0.01, running=2)
    via_r0 = [WireNodeIteration(seq=1, node="e0", iteration=it)]
    via_r1 = [
        WireNodeIteration(seq=9, node="e0", iteration=it),  # the same iteration
        WireNodeIteration(seq=10, node="e1", iteration=it),  # another engine's, same numbers
        # e0 restarted: its numbering starts again, at another time
        WireNodeIteration(seq=11, node="e0", iteration=it.model_copy(update={"at": 80.0})),
    ]
    assert len(dedupe.new(via_r0)) == 1
    fresh = dedupe.new(via_r1)
    assert [(r.node, r.at) for r in fresh] == [("e1", 50.0), ("e0", 80.0)]
    assert dedupe.duplicates == 1


def test_a_model_set_round_trips_each_nodes_model() -> None:
    m = NodeModel(
        prefill=PrefillModel(0.01, 4e-5, 2e-10, 1e-6),
        decode=DecodeModel(0.012, 0.018, 2.5e-4, experts_active=8, experts_total=256),
        t_bar=3000.0,
        f_restore=0.25,
    )
    s = ModelSet(version=3, fitted_at=100.0, models={"e0": WireNodeModel.of(m)})
    back = ModelSet.model_validate_json(s.model_dump_json())
    assert back.models["e0"].node_model() == m
    with pytest.raises(ValidationError):
        WireNodeModel.model_validate({**WireNodeModel.of(m).model_dump(), "f_restore": 1.5})
    with pytest.raises(ValidationError):
        ModelSet.model_validate({"version": 0, "fitted_at": 1.0, "models": {}})


def test_the_work_log_keeps_a_bounded_sample_of_each_engines_iterations() -> None:
    log = WorkLog("r0", iterations_per_s=10.0, iterations_burst=5)
    decode = [WireDecodeIteration(seq=i, at=100.0 + i * 0.01, seconds=0.01, running=4) for i in range(300)]
    prefill = [
        WirePrefillIteration(seq=1000 + i, at=100.0 + i, seconds=0.2, batch=[{"t_uc": 8192}])  # type: ignore[list-item]
        for i in range(3)
    ]
    log.iterations("e0", decode)  # 100 iterations per second for 3 s: about 5 + 3 * 10 kept
    log.iterations("e0", prefill)  # rare prefill iterations have a bucket of their own: all kept
    log.iterations("e1", decode[:4])  # another engine: its own bucket
    kept = log.batch(None).iterations
    by = collections.Counter((i.node, i.iteration.phase) for i in kept)
    assert 33 <= by["e0", "decode"] <= 36 and by["e0", "prefill"] == 3 and by["e1", "decode"] == 4
    assert log.iterations_dropped == 300 - by["e0", "decode"]
    with pytest.raises(ValueError):
        WorkLog(iterations_per_s=0)
