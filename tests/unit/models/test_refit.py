"""Refit when a window's work leaves the fitted range: the decision, the refit, the node-level pass."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agentpool.models import (
    DecodeIterationRecord,
    DecodeModel,
    NodeModel,
    PrefillBatchItem,
    PrefillIterationRecord,
    PrefillModel,
)
from agentpool.models.refit import (
    NodeRecords,
    RefitPolicy,
    bounded,
    refit_decode,
    refit_nodes,
    refit_prefill,
)

# The truth the records come from, and the model a warmup on Putnam-like batches fitted: the fixed
# cost too high and the per-token cost too low (the simulator's shifting run fitted c0 0.033 s and
# c1 3.5e-5 s/token against the preset's 0.020 and 4.0e-5), no attention term.
TRUTH = PrefillModel(c0=0.020, c1=4.0e-5, c2=1.5e-10, c3=1.0e-6)
PUTNAM_FIT = PrefillModel(c0=0.033, c1=3.5e-5, c2=0.0, c3=1.0e-6)
DECODE_TRUTH = DecodeModel(d0=0.012, d1=0.018, d2=2.5e-4, experts_active=8, experts_total=256)


def prefill(
    n: int, uc: tuple[int, int], ctx: tuple[int, int], seed: int, node: str = "a"
) -> list[PrefillIterationRecord]:
    """``n`` single-request batches of ``uc`` uncached tokens at ``ctx`` cached ones, timed by the
    truth with 2% noise."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        item = PrefillBatchItem(t_uc=float(rng.integers(*uc)), t_c=float(rng.integers(*ctx)))
        t = TRUTH.iteration_time([item]) * (1.0 + 0.02 * rng.standard_normal())
        out.append(PrefillIterationRecord(node, float(k), (item,), t))
    return out


def putnam(n: int = 200, seed: int = 0, node: str = "a") -> list[PrefillIterationRecord]:
    return prefill(n, (200, 1500), (1000, 6000), seed, node)  # short prompts, short contexts


def osworld(n: int = 200, seed: int = 1, node: str = "a") -> list[PrefillIterationRecord]:
    return prefill(n, (6000, 8192), (20_000, 60_000), seed, node)  # full 8K chunks, long contexts


def decode(n: int, running: tuple[int, int], seed: int, node: str = "a") -> list[DecodeIterationRecord]:
    rng = np.random.default_rng(seed)
    return [
        DecodeIterationRecord(
            node,
            float(k),
            b := int(rng.integers(*running)),
            DECODE_TRUTH.iteration_time(b) * (1.0 + 0.02 * rng.standard_normal()),
        )
        for k in range(n)
    ]


@pytest.mark.parametrize(
    ("window", "current", "refit", "reason"),
    [
        (
            prefill(200, (300, 1400), (1500, 5500), 5),
            PUTNAM_FIT,
            False,
            "all 200 window records in the fitted",
        ),
        (putnam(seed=5), PUTNAM_FIT, False, "2 of 200 window records beyond"),  # the same work's tails
        (osworld(), PUTNAM_FIT, True, "beyond the fitted range (uncached tokens, query-key pairs)"),
        (osworld()[:15] + putnam(seed=5), PUTNAM_FIT, False, "too few to refit"),  # 15 < 20 records
        (osworld()[:25] + putnam(300, seed=5), PUTNAM_FIT, False, "too few to refit"),  # 25 < 10% of 325
        (osworld(), TRUTH, False, "within 10%"),  # out of range, but the model extrapolates well
        ([], PUTNAM_FIT, False, "no records in the window"),
    ],
)
def test_prefill_refits_only_on_enough_mispredicted_records_out_of_range(
    window: list[PrefillIterationRecord], current: PrefillModel, refit: bool, reason: str
) -> None:
    r = refit_prefill(putnam(), window, current)
    assert r.check.refit is refit and (r.fit is not None) is refit
    assert reason in r.check.reason
    if not refit:
        assert r.records == tuple(putnam())  # the fitted records stay as they were


def test_refit_on_the_shifting_case_gets_the_per_token_cost_of_the_truth() -> None:
    window = osworld()
    r = refit_prefill(putnam(), window, PUTNAM_FIT)
    assert r.check.out_of_range == len(window) and r.check.error > 0.10
    assert r.fit is not None
    assert r.fit.model.c1 == pytest.approx(TRUTH.c1, rel=0.05)
    assert r.fit.model.c0 == pytest.approx(TRUTH.c0, rel=0.25)
    assert r.fit.model.c3 == TRUTH.c3  # restores on no record: the prior's (the current model's) term
    # the new model predicts the window's 8K chunks within the noise; the old one did not
    errors = [abs(r.fit.model.iteration_time(x.batch) - x.seconds) / x.seconds for x in window]
    assert float(np.mean(errors)) < 0.03
    assert len(r.records) == 400  # fitted on both, and that is now the node's range
    assert not refit_prefill(r.records, osworld(seed=9), r.fit.model).check.refit


def test_decode_refits_when_the_running_requests_leave_the_range() -> None:
    fitted = decode(200, (1, 24), seed=0)
    wrong = dataclasses.replace(DECODE_TRUTH, d2=1.0e-4)  # per-request cost underestimated
    r = refit_decode(fitted, decode(200, (64, 160), seed=1), wrong)
    assert r.check.refit and "running requests" in r.check.reason
    assert r.fit is not None and r.fit.model.d2 == pytest.approx(DECODE_TRUTH.d2, rel=0.05)
    assert not refit_decode(fitted, decode(200, (2, 20), seed=2), wrong).check.refit  # in range
    # fewer running requests than ever fitted is out of range too
    high = decode(200, (100, 200), seed=3)
    low = refit_decode(high, decode(200, (1, 20), seed=4), dataclasses.replace(DECODE_TRUTH, d0=0.03))
    assert low.check.out_of_range > 0 and low.check.refit


def test_refit_nodes_uses_every_nodes_window_for_a_node_without_its_own() -> None:
    """After disaggregation a decode node runs no prefill: its prefill model is refitted on the
    prefill nodes' records, so Eq. 5 values moving it to prefill with the new work."""
    dec = decode(100, (1, 24), seed=0)
    fitted = {
        "p": NodeRecords(tuple(putnam(node="p")), tuple(dec)),
        "d": NodeRecords(tuple(putnam(seed=3, node="d")), tuple(dec)),
    }
    model = NodeModel(prefill=PUTNAM_FIT, decode=DECODE_TRUTH)
    window = [*osworld(node="p"), *decode(100, (1, 24), seed=7, node="d")]
    out = refit_nodes(fitted, window, {"p": model, "d": model, "gone": model})
    assert sorted(out) == ["d", "p"]  # a node without fitted records is not checked
    for name in ("p", "d"):
        assert out[name].prefill.fit is not None and out[name].decode.fit is None
        new = out[name].model(dataclasses.replace(model, t_bar=5000.0, f_restore=0.3))
        assert new.prefill.c1 == pytest.approx(TRUTH.c1, rel=0.05)
        assert (new.decode, new.t_bar, new.f_restore) == (DECODE_TRUTH, 5000.0, 0.3)  # the rest kept
        assert "prefill refitted" in out[name].describe() and "decode kept" in out[name].describe()
        assert all(x.node == "p" for x in out[name].records().prefill[-200:])


def test_refit_records_weigh_the_old_range_and_the_new_alike_and_are_bounded() -> None:
    old, new = putnam(300), osworld(300)
    assert bounded(old, new, 1000) == (*old, *new)
    kept = bounded(old, new, 200)
    assert len(kept) == 200
    assert kept[0] == old[0] and kept[99] == old[-1] and kept[100] == new[0] and kept[-1] == new[-1]
    few_new = bounded(old, new[:40], 1000)  # the fitted records thinned to as many as the window's
    assert len(few_new) == 80 and few_new[0] == old[0] and few_new[39] == old[-1]
    assert few_new[-40:] == tuple(new[:40])
    assert bounded(old[:10], new, 1000) == (*old[:10], *new)
    r = refit_prefill(old, new, PUTNAM_FIT, RefitPolicy(max_records=200))
    assert r.fit is not None and len(r.records) == 200


def test_policy_rejects_settings_that_cannot_work() -> None:
    with pytest.raises(ValueError, match="margin"):
        RefitPolicy(margin=0.5)
    with pytest.raises(ValueError, match="max_records"):
        RefitPolicy(min_records=20, max_records=30)
    with pytest.raises(ValueError, match="min_share"):
        RefitPolicy(min_share=1.5)
