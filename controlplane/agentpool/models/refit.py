"""Refitting the iteration-time models when a window's work leaves the range they were fitted on.

The paper fits Eq. 1 and Eq. 2 once, during the warmup, and freezes them (§5.1). A fit is only as
good as the batches it saw: in the simulator's shifting run the warmup sees Putnam's few short
prompts, the fitted prefill model (``c0`` 0.033 s, ``c1`` 3.5e-5 s/token against the preset's
0.020 and 4.0e-5) underestimates OSWorld's full 8K-token chunks, and Eq. 5 sees too little prefill
demand. So after every window the planner asks, for each node and phase, whether the window's
records leave the range of the records its current model was fitted on, and refits if so.

The decision (:func:`check_range`), all three conditions:

- **Out of range**: a window record is out of range when a regressor of its phase's model lies
  above ``margin`` times the largest value of that regressor on the fitted records, or below the
  smallest positive one divided by ``margin``. Prefill: Eq. 1's sums of uncached tokens, query-key
  pairs and restored tokens (a sum that was 0 on every fitted record is out of range as soon as it
  is positive); decode: the running requests ``B``. The constant term has no range.
- **Enough of them**: at least ``min_records`` such records, and at least ``min_share`` of the
  window's records of the phase (a few stray batches do not refit a node).
- **Mispredicted**: the current model's mean relative error on those records is above
  ``max_error``. A model whose form extrapolates well (the paper's claim on its GPUs: below 7%
  outside the fitted settings) is left alone, so a workload whose contexts merely grow, as every
  agent's do, does not refit the pool every window.

The refit (:func:`refit_prefill`, :func:`refit_decode`) is the warmup's NNLS
(:mod:`agentpool.models.fitting`) on the fitted records plus the window's, with the current prefill
model as the prior for the terms the records cannot tell. The fitted records are thinned evenly to
as many as the window has, so the old range and the new one weigh alike (a warmup of thousands of
records would otherwise outvote a window that shows the model's form does not carry over), and
both to ``max_records / 2`` at most. The records it used become the node's fitted records, so the
next window in the same regime is in range.

Which window records a node's check uses (:func:`refit_nodes`): its own of that phase when it has
at least ``min_records``, else every node's records of that phase. After disaggregation a decode
node runs no prefill; when the prefill nodes' work leaves the range, the decode nodes' prefill
models (the ones Eq. 5 uses to value moving them to prefill) are refitted on the prefill nodes'
records. That assumes the nodes of a pool are alike (one engine spec), as a pool's are.

Pure: no I/O, no clock. The live planner (:mod:`agentpool.planner.controller`) and the simulator's
agentpool planner (:mod:`agentpool.sim.planners`) both call :func:`refit_nodes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from agentpool.models.coefficients import decode_shape
from agentpool.models.fitting import (
    DecodeFit,
    PrefillFit,
    decode_regressors,
    fit_decode,
    fit_prefill,
    prefill_regressors,
    split_by_node,
)
from agentpool.models.iteration import DecodeModel, NodeModel, PrefillModel
from agentpool.models.records import DecodeIterationRecord, IterationRecord, MoeShape, PrefillIterationRecord

FloatArray = npt.NDArray[np.float64]
R = TypeVar("R", PrefillIterationRecord, DecodeIterationRecord)

# the regressors with a range: (column of the design matrix, name)
PREFILL_TERMS = ((1, "uncached tokens"), (2, "query-key pairs"), (3, "restored tokens"))  # Eq. 1's sums
DECODE_TERMS = ((2, "running requests"),)  # Eq. 2's B (phi grows with it)


@dataclass(frozen=True, slots=True)
class RefitPolicy:
    """When a window refits a node's model, and on how many records (see the module's notes)."""

    margin: float = 1.5  # out of range: above margin x the fitted max, or below the fitted min / margin
    min_records: int = 20  # out-of-range records a window needs to refit ...
    min_share: float = 0.1  # ... and their least share of the window's records of the phase
    max_error: float = 0.10  # the current model's mean relative error on them must exceed this
    max_records: int = 4000  # records a refit fits on: fitted and window, at most half each

    def __post_init__(self) -> None:
        if self.margin < 1.0:
            raise ValueError(f"the range margin must be >= 1, got {self.margin}")
        if self.min_records < 1 or self.max_records < 2 * self.min_records:
            raise ValueError(
                f"refit needs min_records >= 1 and max_records >= 2 x min_records, got "
                f"{self.min_records} and {self.max_records}"
            )
        if not 0.0 <= self.min_share <= 1.0 or self.max_error < 0.0:
            raise ValueError(f"min_share must be in [0, 1] and max_error >= 0: {self}")


@dataclass(frozen=True, slots=True)
class RangeCheck:
    """One node's and phase's window against the range of its fitted records."""

    window_records: int
    out_of_range: int
    error: float  # the current model's mean relative error on the out-of-range records (0: none)
    refit: bool
    reason: str


@dataclass(frozen=True, slots=True)
class PrefillRefit:
    check: RangeCheck
    fit: PrefillFit | None  # None: no refit
    records: tuple[PrefillIterationRecord, ...]  # what the node's prefill model is now fitted on


@dataclass(frozen=True, slots=True)
class DecodeRefit:
    check: RangeCheck
    fit: DecodeFit | None
    records: tuple[DecodeIterationRecord, ...]


@dataclass(frozen=True, slots=True)
class NodeRecords:
    """The records a node's current models were fitted on (the range of each phase's design matrix
    is computed once, at the first window checked against it)."""

    prefill: tuple[PrefillIterationRecord, ...]
    decode: tuple[DecodeIterationRecord, ...]
    _ranges: dict[MoeShape | None, DesignRange] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def prefill_range(self) -> DesignRange:
        if None not in self._ranges:
            self._ranges[None] = DesignRange.of(_prefill_matrix(self.prefill))
        return self._ranges[None]

    def decode_range(self, shape: MoeShape) -> DesignRange:
        if shape not in self._ranges:
            self._ranges[shape] = DesignRange.of(_decode_matrix(self.decode, shape))
        return self._ranges[shape]


@dataclass(frozen=True, slots=True)
class DesignRange:
    """Per column of a design matrix of ``rows`` rows: its largest value and its smallest positive
    one (inf: none)."""

    rows: int
    hi: FloatArray
    lo: FloatArray

    @staticmethod
    def of(x: FloatArray) -> DesignRange:
        if len(x) == 0:
            return DesignRange(0, np.zeros(x.shape[1]), np.full(x.shape[1], np.inf))
        return DesignRange(len(x), x.max(axis=0), np.where(x > 0, x, np.inf).min(axis=0))


@dataclass(frozen=True, slots=True)
class NodeRefit:
    """A node's window checked against its fitted records, per phase, and the refits it led to."""

    node: str
    prefill: PrefillRefit
    decode: DecodeRefit

    @property
    def changed(self) -> bool:
        return self.prefill.fit is not None or self.decode.fit is not None

    def model(self, current: NodeModel) -> NodeModel:
        """``current`` with the refitted phases' coefficients (``t_bar`` and ``f_n`` kept)."""
        out = current
        if self.prefill.fit is not None:
            out = replace(out, prefill=self.prefill.fit.model)
        if self.decode.fit is not None:
            out = replace(out, decode=self.decode.fit.model)
        return out

    def records(self) -> NodeRecords:
        return NodeRecords(self.prefill.records, self.decode.records)

    def describe(self) -> str:
        """Why each phase was (or was not) refitted, and the new coefficients."""
        parts = []
        if self.prefill.fit is not None:
            m = self.prefill.fit.model
            parts.append(
                f"prefill refitted ({self.prefill.check.reason}): c0={m.c0:.4g} c1={m.c1:.4g} "
                f"c2={m.c2:.4g} c3={m.c3:.4g}, "
                f"held-out MAPE {100 * self.prefill.fit.report.mape_held_out:.1f}%"
            )
        else:
            parts.append(f"prefill kept ({self.prefill.check.reason})")
        if self.decode.fit is not None:
            d = self.decode.fit.model
            parts.append(
                f"decode refitted ({self.decode.check.reason}): d0={d.d0:.4g} d1={d.d1:.4g} d2={d.d2:.4g}, "
                f"held-out MAPE {100 * self.decode.fit.report.mape_held_out:.1f}%"
            )
        else:
            parts.append(f"decode kept ({self.decode.check.reason})")
        return "; ".join(parts)


def check_range(
    fitted: DesignRange,
    window_x: FloatArray,
    window_y: FloatArray,
    coef: FloatArray,
    terms: Sequence[tuple[int, str]],
    policy: RefitPolicy,
) -> RangeCheck:
    """Does the window (design rows ``window_x``, measured ``window_y``) leave the range of the
    fitted records' design matrix in the columns ``terms`` names, and does ``coef`` mispredict it
    there?"""
    n = len(window_y)
    if n == 0:
        return RangeCheck(0, 0, 0.0, False, "no records in the window")
    if fitted.rows == 0:
        return RangeCheck(n, 0, 0.0, False, "no fitted records to compare with")
    idx = [c for c, _ in terms]
    hi, lo = fitted.hi[idx], fitted.lo[idx]  # lo: the smallest positive value (inf: none)
    w = window_x[:, idx]
    beyond: npt.NDArray[np.bool_] = (w > hi * policy.margin) | (
        np.isfinite(lo) & (w > 0) & (w < lo / policy.margin)
    )
    out = beyond.any(axis=1)
    k = int(out.sum())
    if k == 0:
        return RangeCheck(n, 0, 0.0, False, f"all {n} window records in the fitted range")
    error = float((np.abs(window_x[out] @ coef - window_y[out]) / window_y[out]).mean())
    hits = np.asarray(beyond[out].any(axis=0)).tolist()
    which = ", ".join(name for (_, name), hit in zip(terms, hits, strict=True) if hit)
    what = f"{k} of {n} window records beyond the fitted range ({which}), model error {100 * error:.1f}%"
    if k < policy.min_records or k < policy.min_share * n:
        return RangeCheck(n, k, error, False, f"{what}: too few to refit")
    if error <= policy.max_error:
        return RangeCheck(n, k, error, False, f"{what}: within {100 * policy.max_error:.0f}%")
    return RangeCheck(n, k, error, True, what)


def refit_prefill(
    fitted: Sequence[PrefillIterationRecord],
    window: Sequence[PrefillIterationRecord],
    current: PrefillModel,
    policy: RefitPolicy = RefitPolicy(),
    fitted_range: DesignRange | None = None,
    window_xy: tuple[FloatArray, FloatArray] | None = None,
) -> PrefillRefit:
    """Check ``window`` against ``fitted``; refit Eq. 1 on both (``current`` as the prior) if it
    leaves their range and ``current`` mispredicts it there. ``fitted_range`` and ``window_xy``:
    ``fitted``'s range, ``window``'s design matrix and seconds, where the caller has them already."""
    coef = np.array([current.c0, current.c1, current.c2, current.c3], dtype=np.float64)
    check = check_range(
        DesignRange.of(_prefill_matrix(fitted)) if fitted_range is None else fitted_range,
        *((_prefill_matrix(window), _seconds(window)) if window_xy is None else window_xy),
        coef,
        PREFILL_TERMS,
        policy,
    )
    if not check.refit:
        return PrefillRefit(check, None, tuple(fitted))
    records = bounded(fitted, window, policy.max_records)
    try:
        fit = fit_prefill(records, prior=current)
    except ValueError as exc:
        return PrefillRefit(_failed(check, exc), None, tuple(fitted))
    return PrefillRefit(check, fit, records)


def refit_decode(
    fitted: Sequence[DecodeIterationRecord],
    window: Sequence[DecodeIterationRecord],
    current: DecodeModel,
    policy: RefitPolicy = RefitPolicy(),
    fitted_range: DesignRange | None = None,
    window_xy: tuple[FloatArray, FloatArray] | None = None,
) -> DecodeRefit:
    """Check ``window`` against ``fitted``; refit Eq. 2 on both (``current`` as the prior) if it
    leaves their range and ``current`` mispredicts it there. ``fitted_range`` and ``window_xy`` as
    for :func:`refit_prefill`."""
    shape = decode_shape(current)
    coef = np.array([current.d0, current.d1, current.d2], dtype=np.float64)
    check = check_range(
        DesignRange.of(_decode_matrix(fitted, shape)) if fitted_range is None else fitted_range,
        *((_decode_matrix(window, shape), _seconds(window)) if window_xy is None else window_xy),
        coef,
        DECODE_TERMS,
        policy,
    )
    if not check.refit:
        return DecodeRefit(check, None, tuple(fitted))
    records = bounded(fitted, window, policy.max_records)
    try:
        fit = fit_decode(records, shape, prior=current)
    except ValueError as exc:
        return DecodeRefit(_failed(check, exc), None, tuple(fitted))
    return DecodeRefit(check, fit, records)


def refit_nodes(
    fitted: Mapping[str, NodeRecords],
    window: Iterable[IterationRecord],
    models: Mapping[str, NodeModel],
    policy: RefitPolicy = RefitPolicy(),
) -> dict[str, NodeRefit]:
    """Check and refit every node that has fitted records and a model. A node's window records of
    a phase are its own when it has at least ``policy.min_records``, else every node's (their
    design matrix built once for all such nodes)."""
    own_p, own_d = split_by_node(window)
    all_p = [r for rs in own_p.values() for r in rs]
    all_d = [r for rs in own_d.values() for r in rs]
    pooled_p: tuple[FloatArray, FloatArray] | None = None
    pooled_d: dict[MoeShape, tuple[FloatArray, FloatArray]] = {}
    out: dict[str, NodeRefit] = {}
    for node in sorted(set(fitted) & set(models)):
        f, m = fitted[node], models[node]
        p = own_p.get(node, [])
        d = own_d.get(node, [])
        shape = decode_shape(m.decode)
        if len(p) >= policy.min_records:
            p_refit = refit_prefill(f.prefill, p, m.prefill, policy, f.prefill_range())
        else:
            if pooled_p is None:
                pooled_p = _prefill_matrix(all_p), _seconds(all_p)
            p_refit = refit_prefill(f.prefill, all_p, m.prefill, policy, f.prefill_range(), pooled_p)
        if len(d) >= policy.min_records:
            d_refit = refit_decode(f.decode, d, m.decode, policy, f.decode_range(shape))
        else:
            if shape not in pooled_d:
                pooled_d[shape] = _decode_matrix(all_d, shape), _seconds(all_d)
            d_refit = refit_decode(f.decode, all_d, m.decode, policy, f.decode_range(shape), pooled_d[shape])
        out[node] = NodeRefit(node, p_refit, d_refit)
    return out


def bounded(fitted: Sequence[R], window: Sequence[R], limit: int) -> tuple[R, ...]:
    """``fitted`` thinned evenly (first and last kept) to at most as many records as ``window``,
    then ``window``: the old range and the new one weigh alike. Over ``limit`` in all, both are
    thinned to half of it."""
    keep_w = min(len(window), limit // 2)
    keep_f = min(len(fitted), keep_w)
    return tuple(_thin(fitted, keep_f)) + tuple(_thin(window, keep_w))


def _thin(records: Sequence[R], n: int) -> list[R]:
    if n >= len(records):
        return list(records)
    if n <= 0:
        return []
    idx = np.unique(np.linspace(0, len(records) - 1, n).round().astype(np.int64))
    return [records[int(i)] for i in idx]


def _failed(check: RangeCheck, exc: ValueError) -> RangeCheck:
    return replace(check, refit=False, reason=f"{check.reason}: refit failed: {exc}")


def _prefill_matrix(records: Sequence[PrefillIterationRecord]) -> FloatArray:
    return np.array([prefill_regressors(r.batch) for r in records], dtype=np.float64).reshape(-1, 4)


def _decode_matrix(records: Sequence[DecodeIterationRecord], shape: MoeShape) -> FloatArray:
    return decode_regressors(records, shape)


def _seconds(records: Sequence[PrefillIterationRecord] | Sequence[DecodeIterationRecord]) -> FloatArray:
    return np.array([r.seconds for r in records], dtype=np.float64)
