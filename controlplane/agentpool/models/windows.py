"""Planning-window measurements (evolving-infra §5.1 "remeasure", §5.2, Algorithm E.3 line 15).

A window of ``T_win`` seconds is divided into ``m`` slices. On each slice the planner needs the
average work ``w̄_i`` of the requests that arrived and the average number ``q̄_i`` of requests in
decode across the cluster. Each prefill node's ``t_bar`` (new tokens per prefill iteration) and
``f_n`` (fraction of cached tokens restored from host memory) are remeasured every window from
its iteration records. Everything here is pure: records in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from agentpool.models.iteration import NodeModel, PrefillBatchItem
from agentpool.models.work import Work


@dataclass(frozen=True, slots=True)
class WorkSlice:
    """One slice of a planning window: average request work ``w̄_i`` and decode occupancy ``q̄_i``.

    ``decode_occupancy`` is the average number of requests running in decode over the whole
    cluster; the planner divides it by the number of decode nodes of a split (``B = q̄/|D|``).
    """

    work: Work
    decode_occupancy: float

    def __post_init__(self) -> None:
        if self.work.t_uc <= 0 or self.work.t_out <= 0:
            raise ValueError(f"a slice needs positive average t_uc and t_out (no requests?): {self.work}")
        if not math.isfinite(self.decode_occupancy) or self.decode_occupancy < 0:
            raise ValueError(f"decode occupancy must be finite and >= 0, got {self.decode_occupancy}")


@dataclass(frozen=True, slots=True)
class RequestWorkRecord:
    """The router's record of one request's work after KV reuse, stamped with its arrival time (s)."""

    at: float
    work: Work


@dataclass(frozen=True, slots=True)
class OccupancySample:
    """Requests running in decode over the whole cluster at time ``at`` (s)."""

    at: float
    in_decode: float


@dataclass(frozen=True, slots=True)
class SlicedWindow:
    """The slices of one window, plus how many slices had no requests or no occupancy sample."""

    slices: tuple[WorkSlice, ...]
    empty_slices: int


def mean_work(works: Sequence[Work]) -> Work:
    """Componentwise average of ``works`` (the paper's ``w̄``)."""
    if not works:
        raise ValueError("mean_work of no requests")
    n = float(len(works))
    return Work(
        t_uc=sum(w.t_uc for w in works) / n,
        t_c=sum(w.t_c for w in works) / n,
        t_out=sum(w.t_out for w in works) / n,
        t_acc=sum(w.t_acc for w in works) / n,
    )


def slice_window(
    requests: Iterable[RequestWorkRecord],
    occupancy: Iterable[OccupancySample],
    start: float,
    end: float,
    m: int,
) -> SlicedWindow:
    """Cut ``[start, end)`` into ``m`` equal slices and average work and occupancy on each.

    A slice without any request or without any occupancy sample carries no evidence and is left
    out (counted in ``empty_slices``), never filled in.
    """
    if m < 1:
        raise ValueError(f"need at least one slice, got {m}")
    if not end > start:
        raise ValueError(f"window end {end} must be after start {start}")
    width = (end - start) / m
    works: list[list[Work]] = [[] for _ in range(m)]
    samples: list[list[float]] = [[] for _ in range(m)]
    for r in requests:
        i = _slice_index(r.at, start, end, width, m)
        if i is not None:
            works[i].append(r.work)
    for s in occupancy:
        i = _slice_index(s.at, start, end, width, m)
        if i is not None:
            samples[i].append(s.in_decode)
    slices: list[WorkSlice] = []
    for ws, qs in zip(works, samples, strict=True):
        if ws and qs:
            slices.append(WorkSlice(work=mean_work(ws), decode_occupancy=sum(qs) / len(qs)))
    return SlicedWindow(slices=tuple(slices), empty_slices=m - len(slices))


def _slice_index(at: float, start: float, end: float, width: float, m: int) -> int | None:
    if at < start or at >= end:
        return None
    return min(int((at - start) / width), m - 1)


@dataclass(frozen=True, slots=True)
class PrefillWindowStats:
    """``t_bar`` and ``f_n`` measured from one node's prefill iterations in a window."""

    t_bar: float
    f_restore: float
    iterations: int


def measure_prefill_window(batches: Iterable[Sequence[PrefillBatchItem]]) -> PrefillWindowStats | None:
    """Remeasure ``t_bar`` (mean uncached tokens per iteration) and ``f_n`` (restored / cached tokens).

    Returns None when the node ran no prefill iteration with new tokens in the window: there is
    nothing to measure and the caller keeps the previous values.
    """
    iterations = 0
    new_tokens = cached = restored = 0.0
    for batch in batches:
        uc = sum(item.t_uc for item in batch)
        if uc <= 0:
            continue
        iterations += 1
        new_tokens += uc
        cached += sum(item.t_c for item in batch)
        restored += sum(item.t_rst for item in batch)
    if iterations == 0:
        return None
    f = restored / cached if cached > 0 else 0.0
    return PrefillWindowStats(t_bar=new_tokens / iterations, f_restore=min(f, 1.0), iterations=iterations)


def with_window_stats(model: NodeModel, stats: PrefillWindowStats | None) -> NodeModel:
    """The frozen model with the window's ``t_bar`` and ``f_n``; unchanged when nothing was measured."""
    if stats is None:
        return model
    return replace(model, t_bar=stats.t_bar, f_restore=stats.f_restore)
