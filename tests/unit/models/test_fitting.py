from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agentpool.models import DecodeModel, NodeModel, PrefillModel
from agentpool.models.fitting import (
    DecodeIterationRecord,
    MoeShape,
    PrefillIterationRecord,
    fit_decode,
    fit_nodes,
    fit_prefill,
    nnls_relative,
    prefill_regressors,
)
from agentpool.models.iteration import PrefillBatchItem, moe_fraction
from agentpool.models.synthetic import SyntheticWorkload, decode_records, prefill_records

TRUE = NodeModel(
    prefill=PrefillModel(c0=0.015, c1=4e-5, c2=2e-10, c3=1e-6),
    decode=DecodeModel(d0=0.012, d1=0.018, d2=2.5e-4, experts_active=8, experts_total=256),
)
SHAPE = MoeShape(experts_active=8, experts_total=256)


def _coefs(m: PrefillModel | DecodeModel) -> list[float]:
    if isinstance(m, PrefillModel):
        return [m.c0, m.c1, m.c2, m.c3]
    return [m.d0, m.d1, m.d2]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_known_coefficients_within_two_percent(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pf = fit_prefill(prefill_records("a", TRUE, 1500, noise=0.015, rng=rng))
    df = fit_decode(decode_records("a", TRUE, 1500, noise=0.015, rng=rng), SHAPE)
    assert _coefs(pf.model) == pytest.approx(_coefs(TRUE.prefill), rel=0.02)
    assert _coefs(df.model) == pytest.approx(_coefs(TRUE.decode), rel=0.02)
    assert (df.model.experts_active, df.model.experts_total) == (8, 256)
    # With 1.5% noise the held-out error is about 0.8 * 1.5% (mean |N(0, s)| = 0.8 s).
    assert 0.005 < pf.report.mape_held_out < 0.02
    assert 0.005 < df.report.mape_held_out < 0.02


def test_reported_held_out_error_is_the_error_on_every_fifth_record() -> None:
    rng = np.random.default_rng(4)
    recs = prefill_records("a", TRUE, 103, noise=0.05, rng=rng)
    pf = fit_prefill(recs, holdout_every=5)
    held = [r for i, r in enumerate(recs) if i % 5 == 4]
    apes = [abs(pf.model.iteration_time(r.batch) - r.seconds) / r.seconds for r in held]
    assert pf.report.records_held_out == len(held) == 20
    assert pf.report.records_fit == 83
    assert pf.report.mape_held_out == pytest.approx(float(np.mean(apes)), rel=1e-9)
    assert pf.report.max_ape_held_out == pytest.approx(max(apes), rel=1e-9)

    drecs = decode_records("a", TRUE, 50, noise=0.05, rng=rng)
    df = fit_decode(drecs, SHAPE, holdout_every=4)
    dheld = [r for i, r in enumerate(drecs) if i % 4 == 3]
    dapes = [abs(df.model.iteration_time(r.running) - r.seconds) / r.seconds for r in dheld]
    assert df.report.mape_held_out == pytest.approx(float(np.mean(dapes)), rel=1e-9)


def test_held_out_records_do_not_influence_the_fit() -> None:
    rng = np.random.default_rng(5)
    recs = prefill_records("a", TRUE, 100, noise=0.02, rng=rng)
    spoiled = [
        PrefillIterationRecord(r.node, r.at, r.batch, r.seconds * 10) if i % 5 == 4 else r
        for i, r in enumerate(recs)
    ]
    clean, dirty = fit_prefill(recs), fit_prefill(spoiled)
    assert dirty.model == clean.model
    assert dirty.report.mape_held_out == pytest.approx(0.9, abs=0.01)  # measured 10x: |1 - 10| / 10


def test_unused_regressor_gets_zero_and_dense_decode_keeps_fixed_cost_in_d0() -> None:
    rng = np.random.default_rng(6)
    no_restore = PrefillModel(c0=0.02, c1=3e-5, c2=1e-10, c3=0.0)
    recs = [
        PrefillIterationRecord(
            r.node, r.at, tuple(type(i)(t_uc=i.t_uc, t_c=i.t_c, t_rst=0) for i in r.batch), r.seconds
        )
        for r in prefill_records("a", NodeModel(no_restore, TRUE.decode), 300, noise=0.01, rng=rng)
    ]
    assert fit_prefill(recs).model.c3 == 0.0
    dense = DecodeModel(d0=0.03, d1=0.0, d2=3e-4, experts_total=0, experts_active=0)
    drecs = decode_records("a", NodeModel(TRUE.prefill, dense), 300, noise=0.01, rng=rng)
    fitted = fit_decode(drecs, MoeShape(experts_active=0, experts_total=0)).model
    assert fitted.d1 == 0.0
    assert [fitted.d0, fitted.d2] == pytest.approx([0.03, 3e-4], rel=0.02)


def test_fit_nodes_fits_each_node_from_its_own_records() -> None:
    rng = np.random.default_rng(8)
    slow = NodeModel(
        PrefillModel(0.03, 8e-5, 4e-10, 2e-6),
        DecodeModel(0.024, 0.036, 5e-4, experts_active=8, experts_total=256),
    )
    records = [
        *prefill_records("fast", TRUE, 400, 0.01, rng),
        *decode_records("fast", TRUE, 400, 0.01, rng),
        *prefill_records("slow", slow, 400, 0.01, rng),
        *decode_records("slow", slow, 400, 0.01, rng),
    ]
    fits = fit_nodes(records, SHAPE)
    assert sorted(fits) == ["fast", "slow"]
    assert fits["slow"].prefill.model.c1 == pytest.approx(8e-5, rel=0.02)
    assert fits["fast"].prefill.model.c1 == pytest.approx(4e-5, rel=0.02)
    assert fits["slow"].decode.model.d2 == pytest.approx(5e-4, rel=0.05)
    assert fits["fast"].node_model(t_bar=4096).t_bar == 4096


def test_a_node_short_of_its_own_records_gets_the_pools_fit_of_that_phase() -> None:
    """A node that ran a phase too little in the warmup (or not at all, or is only named) is fitted
    on every node's records of that phase; enough of its own and it keeps its own fit."""
    rng = np.random.default_rng(10)
    slow = NodeModel(
        PrefillModel(0.03, 8e-5, 4e-10, 2e-6),
        DecodeModel(0.024, 0.036, 5e-4, experts_active=8, experts_total=256),
    )
    records = [
        *prefill_records("a", TRUE, 300, 0.01, rng),
        *decode_records("a", TRUE, 300, 0.01, rng),
        *prefill_records("b", TRUE, 300, 0.01, rng),
        *decode_records("b", slow, 5, 0.01, rng),  # too few of its own: the pool's decode fit
        *decode_records("c", slow, 300, 0.01, rng),  # no prefill at all
    ]
    fits = fit_nodes(records, SHAPE, nodes=["a", "b", "c", "d"], min_own=20)
    assert list(fits) == ["a", "b", "c", "d"]
    own = {n: (f.prefill_own, f.decode_own) for n, f in fits.items()}
    assert own == {"a": (True, True), "b": (True, False), "c": (False, True), "d": (False, False)}
    assert fits["c"].decode.model.d2 == pytest.approx(5e-4, rel=0.05)  # its own: the slow node's
    pooled_p = fits["c"].prefill
    assert fits["d"].prefill is pooled_p and len(fits["d"].prefill_records) == 600
    assert pooled_p.model.c1 == pytest.approx(4e-5, rel=0.02)
    assert fits["b"].decode is fits["d"].decode and len(fits["b"].decode_records) == 605
    assert fits["a"].prefill_records == tuple(r for r in records[:300])
    assert fit_nodes(records, SHAPE, nodes=["b"], min_own=5)["b"].decode_own  # 5 of its own suffice


def test_fitting_rejects_what_it_cannot_fit() -> None:
    rng = np.random.default_rng(9)
    with pytest.raises(ValueError, match="too few decode records from the whole pool to fit \\(0\\)"):
        fit_nodes(prefill_records("a", TRUE, 20, 0.01, rng), SHAPE)
    with pytest.raises(ValueError, match="at least 4 fitted"):
        fit_prefill(prefill_records("a", TRUE, 4, 0.01, rng))
    with pytest.raises(ValueError, match="holdout_every"):
        fit_prefill(prefill_records("a", TRUE, 20, 0.01, rng), holdout_every=1)
    with pytest.raises(ValueError):
        DecodeIterationRecord("a", 0.0, running=0, seconds=0.01)
    with pytest.raises(ValueError):
        DecodeIterationRecord("a", 0.0, running=1, seconds=0.0)


def test_synthetic_context_effect_adds_kv_read_time_per_context_token() -> None:
    work = SyntheticWorkload(decode_s_per_context_token=1e-9, max_context=8192)
    for r in decode_records("a", TRUE, 50, noise=0.0, rng=np.random.default_rng(10), workload=work):
        extra = r.seconds - TRUE.decode.iteration_time(r.running)
        assert 1e-9 * 4096 * r.running <= extra + 1e-15
        assert extra <= 1e-9 * 8192 * r.running + 1e-15


@pytest.mark.parametrize("seed", [0, 1])
def test_records_stamped_far_too_short_are_dropped_not_fitted(seed: int) -> None:
    """A live engine's clock can stamp an iteration far too short; with relative residuals one such
    record weighs 1/t and drags the plain NNLS fit (held-out error ~0.9 seen live)."""
    rng = np.random.default_rng(seed)
    recs = prefill_records("a", TRUE, 400, noise=0.02, rng=rng)
    bad = set(range(7, 400, 37))  # 11 records measured at 2% of their time
    stamped = [
        dataclasses.replace(r, seconds=r.seconds * 0.02) if i in bad else r for i, r in enumerate(recs)
    ]
    plain = nnls_relative(
        np.array([prefill_regressors(r.batch) for r in stamped]), np.array([r.seconds for r in stamped])
    )
    # the plain fit is far off (the test would pass trivially if it were not)
    assert abs(plain[1] - TRUE.prefill.c1) / TRUE.prefill.c1 > 0.3
    pf = fit_prefill(stamped)
    assert _coefs(pf.model) == pytest.approx(_coefs(TRUE.prefill), rel=0.05)
    assert pf.report.records_dropped == len(bad)
    assert pf.report.mape_held_out < 0.03
    assert pf.report.records_fit + pf.report.records_held_out + pf.report.records_dropped == len(stamped)


def test_clean_records_drop_nothing_and_fit_as_before() -> None:
    rng = np.random.default_rng(3)
    recs = decode_records("a", TRUE, 300, noise=0.05, rng=rng)
    df = fit_decode(recs, SHAPE)
    assert df.report.records_dropped == 0
    held = np.arange(len(recs)) % 5 == 4
    x = np.array(
        [(1.0, moe_fraction(r.running, 8, 256, SHAPE.t_fwd), float(r.running)) for r in recs],
        dtype=np.float64,
    )
    y = np.array([r.seconds for r in recs])
    assert _coefs(df.model) == pytest.approx(list(nnls_relative(x[~held], y[~held])), rel=1e-12)


def test_a_term_the_records_cannot_tell_keeps_the_priors_coefficient() -> None:
    """Short contexts only (the attention term is a few % of each iteration): plain NNLS cannot
    tell c2 and predicts a long-context prefill too fast; with the prior, c2 is the prior's and
    the other terms are fitted around it."""
    rng = np.random.default_rng(5)
    short = SyntheticWorkload(max_cached=2_000, restore_fraction=0.5)
    recs = prefill_records("a", TRUE, 600, noise=0.03, rng=rng, workload=short)
    prior = PrefillModel(c0=0.02, c1=3e-5, c2=2.2e-10, c3=2e-6)  # a prior 10-50% off on each term
    plain = fit_prefill(recs)
    fitted = fit_prefill(recs, prior=prior)
    assert plain.report.terms_from_prior == 0
    assert fitted.report.terms_from_prior == 1
    assert fitted.model.c2 == prior.c2
    # the terms the records do show are fitted, not copied from the prior
    assert fitted.model.c1 == pytest.approx(TRUE.prefill.c1, rel=0.05)
    assert fitted.model.c0 == pytest.approx(TRUE.prefill.c0, rel=0.1)
    long_batch = [PrefillBatchItem(t_uc=8192, t_c=200_000, t_rst=0)]
    truth = TRUE.prefill.iteration_time(long_batch)
    plain_error = abs(plain.model.iteration_time(long_batch) - truth) / truth
    assert abs(plain.model.c2 - TRUE.prefill.c2) / TRUE.prefill.c2 > 0.3  # NNLS cannot tell c2 here
    assert abs(fitted.model.iteration_time(long_batch) - truth) / truth < min(0.15, plain_error / 2)


def test_a_prior_changes_nothing_when_every_term_shows() -> None:
    rng = np.random.default_rng(6)
    recs = prefill_records("a", TRUE, 500, noise=0.02, rng=rng)
    prior = PrefillModel(c0=0.02, c1=3e-5, c2=2.2e-10, c3=2e-6)
    with_prior = fit_prefill(recs, prior=prior)
    assert with_prior.report.terms_from_prior == 0
    assert _coefs(with_prior.model) == _coefs(fit_prefill(recs).model)


def test_decode_batches_that_span_too_little_keep_the_priors_batch_terms() -> None:
    """Light load: every iteration runs 1-2 requests, so d0, d1*phi(B) and d2*B cannot be told
    apart; plain NNLS puts the time where it likes (here it can give a decode at B=64 several
    times its true time); with the prior, d1 and d2 are the prior's and d0 is fitted around them."""
    rng = np.random.default_rng(7)
    light = SyntheticWorkload(max_running=2)
    recs = decode_records("a", TRUE, 400, noise=0.03, rng=rng, workload=light)
    prior = DecodeModel(d0=0.02, d1=0.015, d2=3e-4, experts_active=8, experts_total=256)  # 20-70% off
    plain = fit_decode(recs, SHAPE)
    fitted = fit_decode(recs, SHAPE, prior=prior)
    assert plain.report.terms_from_prior == 0 and fitted.report.terms_from_prior == 2
    assert (fitted.model.d1, fitted.model.d2) == (prior.d1, prior.d2)
    # d0 is fitted: the model meets the records it saw
    assert fitted.report.mape_held_out < 0.05
    truth = TRUE.decode.iteration_time(64)
    plain_error = abs(plain.model.iteration_time(64) - truth) / truth
    fitted_error = abs(fitted.model.iteration_time(64) - truth) / truth
    assert fitted_error < 0.5 * plain_error, (plain.model, fitted.model)


@pytest.mark.parametrize("max_running", [4, 64])
def test_decode_batches_that_span_enough_are_fitted_whole_with_or_without_a_prior(max_running: int) -> None:
    rng = np.random.default_rng(8)
    recs = decode_records(
        "a", TRUE, 400, noise=0.02, rng=rng, workload=SyntheticWorkload(max_running=max_running)
    )
    prior = DecodeModel(d0=0.02, d1=0.015, d2=3e-4, experts_active=8, experts_total=256)
    with_prior = fit_decode(recs, SHAPE, prior=prior)
    assert with_prior.report.terms_from_prior == 0
    assert _coefs(with_prior.model) == _coefs(fit_decode(recs, SHAPE).model)


def test_fit_nodes_hands_each_node_its_decode_prior() -> None:
    rng = np.random.default_rng(9)
    light = SyntheticWorkload(max_running=2)
    records = [
        *prefill_records("a", TRUE, 300, noise=0.02, rng=rng),
        *decode_records("a", TRUE, 300, noise=0.02, rng=rng, workload=light),
    ]
    prior = dataclasses.replace(TRUE, decode=DecodeModel(0.02, 0.015, 3e-4, 8, 256))
    fits = fit_nodes(records, SHAPE, priors={"a": prior})
    assert fits["a"].decode.report.terms_from_prior == 2
    assert (fits["a"].decode.model.d1, fits["a"].decode.model.d2) == (0.015, 3e-4)
    assert fit_nodes(records, SHAPE)["a"].decode.report.terms_from_prior == 0
