"""Online fitting of the iteration-time models (evolving-infra §5.1 "Online fitting").

Engines report one record per iteration: the batch composition and the measured time. During the
warmup every node serves both phases; the coefficients of Eq. 1 and Eq. 2 are fitted per node by
nonnegative least squares (``scipy.optimize.nnls``) and then frozen (:mod:`agentpool.models.refit`
refits a node whose later work leaves the range they were fitted on). A node with too few records of
a phase of its own is given the fit of every node's records of that phase (:func:`fit_nodes`): the
live planner and the simulator both fit through it.

Two choices, both documented here because they change the numbers:

- Relative residuals: each row is divided by its measured time, so the fit minimizes relative
  error. Iteration times span orders of magnitude (a short decode step vs. an 8K-token prefill at
  a 256K prefix), and the paper judges the models by mean relative error.
- Column scaling: the regressors (1, tokens, query-key pairs ~1e9) differ by up to ten orders of
  magnitude; columns are scaled to unit norm before the solve and the coefficients scaled back.
  A regressor that is zero on every record (e.g. no restored tokens) gets coefficient 0.

- Records stamped far too short are dropped: relative residuals give a record weight ``1/t``, so
  one iteration measured at a tenth of its true time (a live engine's clock or stream timing gone
  wrong) pulls the whole fit towards it. After a fit, a record whose prediction is more than
  ``OUTLIER_RATIO`` times its measured time and whose relative error is more than
  ``OUTLIER_MEDIANS`` times the median one is dropped, and the rest fitted again (at most
  ``OUTLIER_ROUNDS`` times; the first judgement against a fit of absolute residuals, which a few
  tiny times cannot pull). Records measured too long need no rule: their relative error is
  at most 1. On clean records (the simulator's: noise of a few percent) nothing is dropped and the
  fit is the plain one.

- Terms the records cannot tell, taken from a prior: with a prior model (the coefficients the
  planner and router used before the fit), a prefill term other than the constant that makes at
  most ``IDENTIFIABLE_SHARE`` of every record's time under the prior (e.g. attention when the warmup
  saw only short contexts) is fixed at the prior's coefficient and the others fitted around it.
  NNLS would set such a term to about 0, and a model fitted on short contexts would then predict a
  long-context prefill many times too fast once the workload changes (the simulator's shifting
  run: 155% mean prefill error against its ground truth). Counted in
  ``FitReport.terms_from_prior``. Without a prior (or when every term shows) the fit is as before.
  Decode likewise: when the records' running batch sizes span less than a factor of
  ``MIN_BATCH_SPAN`` (a light load decodes one or two requests at a time), the constant, the MoE term
  ``phi(B)`` and ``B`` are nearly collinear and NNLS puts the time on any of them (the simulator's
  open loop at 2 agents a minute: all of it on ``d1``, 137% mean decode error against the ground
  truth, and a planner swinging between 1P8D and 7P2D on predictions of larger batches); there
  ``d1`` and ``d2`` keep the prior's coefficients and ``d0`` is fitted.

The fit report gives the mean absolute percentage error on records held out from the fit: every
``holdout_every``-th record (deterministic, so a fit is reproducible), outliers (same rule) not
counted there but in ``records_dropped``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt

from agentpool.models.iteration import DecodeModel, NodeModel, PrefillBatchItem, PrefillModel, moe_fraction
from agentpool.models.records import DecodeIterationRecord, IterationRecord, MoeShape, PrefillIterationRecord
from agentpool.models.work import attention_pairs

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

OUTLIER_RATIO = 2.0  # predicted / measured above this (and ...)
OUTLIER_MEDIANS = 10.0  # ... relative error above this many times the median's: an outlier
OUTLIER_ROUNDS = 3
MIN_BATCH_SPAN = 4.0  # decode batch sizes spanning less than this factor cannot tell d1, d2 from d0
IDENTIFIABLE_SHARE = 0.05  # a term at most this share of every record's time (under the prior): prior's
MIN_OWN_RECORDS = 20  # a node's own records of a phase it needs to be fitted on them (else: the pool's)


@dataclass(frozen=True, slots=True)
class FitReport:
    """How well a fitted model predicts records it was not fitted on."""

    records_fit: int
    records_held_out: int
    mape_held_out: float  # mean |predicted - measured| / measured over the held-out records
    max_ape_held_out: float
    records_dropped: int = 0  # outliers (measured far too short), fitted or held out
    terms_from_prior: int = 0  # coefficients fixed at the prior's: too small a share to be fitted


@dataclass(frozen=True, slots=True)
class PrefillFit:
    model: PrefillModel
    report: FitReport


@dataclass(frozen=True, slots=True)
class DecodeFit:
    model: DecodeModel
    report: FitReport


@dataclass(frozen=True, slots=True)
class NodeFit:
    """A node's frozen models, the report of each fit, and the records each was fitted on: the node's
    own, or every node's of that phase when it had fewer than ``MIN_OWN_RECORDS`` (``*_own`` False)."""

    node: str
    prefill: PrefillFit
    decode: DecodeFit
    prefill_own: bool = True
    decode_own: bool = True
    prefill_records: tuple[PrefillIterationRecord, ...] = ()
    decode_records: tuple[DecodeIterationRecord, ...] = ()

    def node_model(self, t_bar: float = 8192.0, f_restore: float = 0.0) -> NodeModel:
        return NodeModel(
            prefill=self.prefill.model, decode=self.decode.model, t_bar=t_bar, f_restore=f_restore
        )


def prefill_regressors(batch: Iterable[PrefillBatchItem]) -> tuple[float, float, float, float]:
    """The row of Eq. 1's design matrix: ``(1, sum t_uc, sum A, sum t_rst)``."""
    s_uc = s_a = s_rst = 0.0
    for item in batch:
        s_uc += item.t_uc
        s_a += attention_pairs(item.t_uc, item.t_c)
        s_rst += item.t_rst
    return (1.0, s_uc, s_a, s_rst)


def fit_prefill(
    records: Sequence[PrefillIterationRecord], holdout_every: int = 5, prior: PrefillModel | None = None
) -> PrefillFit:
    """Fit Eq. 1 by NNLS on all records but every ``holdout_every``-th; report error on those.
    ``prior``: terms the records cannot tell keep its coefficients (see the module's notes)."""
    x = np.array([prefill_regressors(r.batch) for r in records], dtype=np.float64).reshape(-1, 4)
    y = np.array([r.seconds for r in records], dtype=np.float64)
    fixed = (
        None if prior is None else unidentified_terms(x, np.array([prior.c0, prior.c1, prior.c2, prior.c3]))
    )
    coef, report = _fit_and_report(x, y, holdout_every, what="prefill", fixed=fixed)
    return PrefillFit(model=PrefillModel(*(float(c) for c in coef)), report=report)


def unidentified_terms(x: FloatArray, prior: FloatArray) -> FloatArray | None:
    """The prior's coefficients of the terms (not the constant, column 0) whose share of every
    record's time under ``prior`` is at most ``IDENTIFIABLE_SHARE``; NaN for the terms to fit (and
    for a term the prior has at 0, which says nothing about it: a refit's prior may be a fit that
    set the term to 0).
    None when every term can be fitted."""
    pred = x @ prior
    if np.any(pred <= 0):
        return None
    share = ((x * prior) / pred[:, None]).max(axis=0)
    low = (share <= IDENTIFIABLE_SHARE) & (prior > 0)  # a prior of 0 tells nothing: fitted
    low[0] = False
    if not low.any():
        return None
    return np.where(low, prior, np.nan)


def fit_decode(
    records: Sequence[DecodeIterationRecord],
    shape: MoeShape,
    holdout_every: int = 5,
    prior: DecodeModel | None = None,
) -> DecodeFit:
    """Fit Eq. 2 (``d0 + d1*phi(B) + d2*B``) by NNLS; report error on the held-out records.
    ``prior``: when the records' batch sizes span too little to tell the batch terms from the
    constant, they keep its coefficients (see the module's notes)."""
    x = decode_regressors(records, shape)
    y = np.array([r.seconds for r in records], dtype=np.float64)
    fixed = None if prior is None else unidentified_batch_terms(records, prior)
    coef, report = _fit_and_report(x, y, holdout_every, what="decode", fixed=fixed)
    model = DecodeModel(
        d0=float(coef[0]),
        d1=float(coef[1]),
        d2=float(coef[2]),
        experts_active=shape.experts_active,
        experts_total=shape.experts_total,
        t_fwd=shape.t_fwd,
    )
    return DecodeFit(model=model, report=report)


def unidentified_batch_terms(
    records: Sequence[DecodeIterationRecord], prior: DecodeModel
) -> FloatArray | None:
    """The prior's ``d1`` and ``d2`` (NaN for ``d0``, fitted) when the records' running batch sizes
    span less than a factor of ``MIN_BATCH_SPAN``; None when they span enough to fit all three."""
    sizes = [r.running for r in records if r.running > 0]
    if sizes and max(sizes) >= MIN_BATCH_SPAN * min(sizes):
        return None
    return np.array([np.nan, prior.d1, prior.d2])


def decode_regressors(records: Sequence[DecodeIterationRecord], shape: MoeShape) -> FloatArray:
    """Eq. 2's design matrix: a row ``(1, phi(B), B)`` per record (``phi`` column 0 for a dense
    model: it would duplicate the constant, so the fixed cost stays in ``d0``)."""
    running = [r.running for r in records]
    k, e, t_fwd = shape.experts_active, shape.experts_total, shape.t_fwd
    phi = {b: moe_fraction(b, k, e, t_fwd) for b in set(running)}  # a few distinct batch sizes
    x = np.empty((len(running), 3), dtype=np.float64)
    x[:, 0] = 1.0
    x[:, 1] = [phi[b] for b in running]
    x[:, 2] = running
    if shape.experts_total == 0:
        x[:, 1] = 0.0
    return x


def split_by_node(
    records: Iterable[IterationRecord],
) -> tuple[dict[str, list[PrefillIterationRecord]], dict[str, list[DecodeIterationRecord]]]:
    """Each node's prefill records and its decode records, in order (nodes in order of their first
    record of the phase)."""
    prefill: dict[str, list[PrefillIterationRecord]] = {}
    decode: dict[str, list[DecodeIterationRecord]] = {}
    for r in records:
        if isinstance(r, PrefillIterationRecord):
            prefill.setdefault(r.node, []).append(r)
        else:
            decode.setdefault(r.node, []).append(r)
    return prefill, decode


def fit_nodes(
    records: Iterable[IterationRecord],
    shape: MoeShape,
    holdout_every: int = 5,
    nodes: Iterable[str] | None = None,
    min_own: int = MIN_OWN_RECORDS,
    priors: Mapping[str, NodeModel] | None = None,
) -> dict[str, NodeFit]:
    """Fit both models of every node in ``nodes`` (default: every node with records), in that order.

    A phase is fitted on the node's own records of it when it has at least ``min_own``; else on
    every node's records of that phase, one fit shared by all such nodes (a pool's nodes run one
    engine spec: a node that ran a phase too little in the warmup, or not at all, gets the pool's
    model of it rather than none). ``priors``: each node's models before the fit (the terms its
    records cannot tell keep them); a pooled fit takes the prior of the first node that needs it.
    Raises ``ValueError`` when a phase has too few records in all to be fitted."""
    prefill, decode = split_by_node(records)
    names = sorted(set(prefill) | set(decode)) if nodes is None else list(nodes)
    pooled_p: tuple[PrefillFit, tuple[PrefillIterationRecord, ...]] | None = None
    pooled_d: tuple[DecodeFit, tuple[DecodeIterationRecord, ...]] | None = None
    out: dict[str, NodeFit] = {}
    for node in names:
        own_p, own_d = prefill.get(node, []), decode.get(node, [])
        prior = None if priors is None else priors.get(node)
        prior_p = None if prior is None else prior.prefill
        prior_d = None if prior is None else prior.decode
        if len(own_p) >= min_own:
            pf, p_recs = fit_prefill(own_p, holdout_every, prior_p), tuple(own_p)
        else:
            if pooled_p is None:
                every_p = tuple(r for rs in prefill.values() for r in rs)
                pooled_p = _too_few("prefill", every_p, fit_prefill, every_p, holdout_every, prior_p), every_p
            pf, p_recs = pooled_p
        if len(own_d) >= min_own:
            df, d_recs = fit_decode(own_d, shape, holdout_every, prior_d), tuple(own_d)
        else:
            if pooled_d is None:
                every_d = tuple(r for rs in decode.values() for r in rs)
                pooled_d = (
                    _too_few("decode", every_d, fit_decode, every_d, shape, holdout_every, prior_d),
                    every_d,
                )
            df, d_recs = pooled_d
        out[node] = NodeFit(node, pf, df, len(own_p) >= min_own, len(own_d) >= min_own, p_recs, d_recs)
    return out


F = TypeVar("F", PrefillFit, DecodeFit)
P = ParamSpec("P")


def _too_few(
    phase: str, every: Sequence[IterationRecord], fit: Callable[P, F], *args: P.args, **kwargs: P.kwargs
) -> F:
    """``fit(*args)``; its ``ValueError`` said as the whole pool's records of ``phase`` being too few."""
    try:
        return fit(*args, **kwargs)
    except ValueError as exc:
        raise ValueError(f"too few {phase} records from the whole pool to fit ({len(every)}): {exc}") from exc


def mape(x: FloatArray, y: FloatArray, coef: FloatArray) -> tuple[float, float]:
    """Mean and max absolute percentage error of ``x @ coef`` against ``y``."""
    ape = np.abs(x @ coef - y) / y
    return float(ape.mean()), float(ape.max())


def _fit_and_report(
    x: FloatArray, y: FloatArray, holdout_every: int, what: str, fixed: FloatArray | None = None
) -> tuple[FloatArray, FitReport]:
    if holdout_every < 2:
        raise ValueError(f"holdout_every must be >= 2 to hold records out, got {holdout_every}")
    held = np.arange(len(y)) % holdout_every == holdout_every - 1
    n_fit, n_held = int((~held).sum()), int(held.sum())
    if n_fit < x.shape[1] or n_held < 1:
        raise ValueError(
            f"{what} fit needs at least {x.shape[1]} fitted and 1 held-out record, got {n_fit} and {n_held}"
        )
    coef, kept = nnls_trimmed(x[~held], y[~held], fixed)
    held_kept = ~outliers(x[held], y[held], coef)
    if not held_kept.any():
        held_kept[:] = True  # every held-out record an outlier: report them as they are
    mean_ape, max_ape = mape(x[held][held_kept], y[held][held_kept], coef)
    dropped = int((~kept).sum() + (~held_kept).sum())
    return coef, FitReport(
        records_fit=int(kept.sum()),
        records_held_out=int(held_kept.sum()),
        mape_held_out=mean_ape,
        max_ape_held_out=max_ape,
        records_dropped=dropped,
        terms_from_prior=0 if fixed is None else int((~np.isnan(fixed)).sum()),
    )


def outliers(x: FloatArray, y: FloatArray, coef: FloatArray) -> BoolArray:
    """Records measured far too short for ``coef``: predicted more than ``OUTLIER_RATIO`` times the
    measured time, with a relative error over ``OUTLIER_MEDIANS`` times the median relative error."""
    pred = x @ coef
    ape = np.abs(pred - y) / y
    return (pred > OUTLIER_RATIO * y) & (ape > OUTLIER_MEDIANS * float(np.median(ape)))


def nnls_trimmed(
    x: FloatArray, y: FloatArray, fixed: FloatArray | None = None
) -> tuple[FloatArray, BoolArray]:
    """:func:`nnls_relative` without the records measured far too short (see the module's notes);
    returns the coefficients and which records they were fitted on.

    The first outliers are judged against a fit of absolute residuals, which a few tiny times cannot
    pull; from then on against the relative fit of the records kept, until the kept set is stable.
    Clean records keep every record and give exactly :func:`nnls_relative`'s coefficients."""
    n = x.shape[1]
    kept = ~outliers(x, y, _solve(x, y, np.ones_like(y), fixed))
    if int(kept.sum()) < n:
        kept[:] = True
    coef = nnls_relative(x[kept], y[kept], fixed)
    for _ in range(OUTLIER_ROUNDS):
        now = ~outliers(x, y, coef)
        if np.array_equal(now, kept) or int(now.sum()) < n:
            break
        kept = now
        coef = nnls_relative(x[kept], y[kept], fixed)
    return coef, kept


def nnls_relative(x: FloatArray, y: FloatArray, fixed: FloatArray | None = None) -> FloatArray:
    """Nonnegative ``coef`` minimizing ``sum(((x @ coef - y) / y)**2)``, with unit-norm columns;
    ``fixed``: coefficients not fitted (NaN: fitted)."""
    if np.any(y <= 0):
        raise ValueError("measured times must be positive")
    return _solve(x, y, y, fixed)


def _solve(x: FloatArray, y: FloatArray, scale: FloatArray, fixed: FloatArray | None) -> FloatArray:
    """Nonnegative ``coef`` minimizing ``|(x @ coef - y) / scale|``, solved on unit-norm columns (a
    column of zeros gets 0); the columns ``fixed`` names keep its values."""
    free = np.ones(x.shape[1], dtype=np.bool_) if fixed is None else np.isnan(fixed)
    target = y.copy()
    coef = np.zeros(x.shape[1], dtype=np.float64)
    if fixed is not None:
        coef[~free] = fixed[~free]
        target = target - x[:, ~free] @ fixed[~free]
    a = x / scale[:, None]
    norms = np.linalg.norm(a, axis=0)
    used = (norms > 0) & free
    # imported here: scipy.optimize takes about 0.5 s to import, which every simulator run would pay
    from scipy.optimize import nnls

    scaled_coef, _ = nnls(a[:, used] / norms[used], target / scale)
    coef[used] = scaled_coef / norms[used]
    return coef
