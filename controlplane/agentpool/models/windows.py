"""Planning-window measurements (evolving-infra §5.1 "remeasure", §5.2, Algorithm E.3 line 15).

A window of ``T_win`` seconds is divided into ``m`` slices. On each slice the planner needs the
average work ``w̄_i`` of the requests and the average occupancy ``q̄_i`` across the cluster (what
``q̄`` counts: :class:`OccupancyCount`; the default is requests in flight). Each prefill node's
``t_bar`` (new tokens per prefill iteration) and ``f_n`` (fraction of cached tokens restored from
host memory) are remeasured every window from its iteration records. Everything here is pure:
records in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from agentpool.models.iteration import NodeModel, PrefillBatchItem
from agentpool.models.work import Work


class OccupancyCount(StrEnum):
    """What the planner's ``q̄`` counts; Eq. 5 divides it over the decode nodes (``B = q̄/|D|``).

    - ``IN_FLIGHT`` (the default, :data:`DEFAULT_OCCUPANCY`): requests routed and not finished,
      whatever phase they are in (queued for prefill, prefilling, handing over KV, decoding). It
      is the decode demand if prefill kept up.
    - ``IN_DECODE``: requests running in decode: the paper's literal wording.

    Why in flight: read literally, ``q̄`` makes ``Σ μ_D`` the *observed* decode throughput, which
    in a closed loop can never exceed what prefill delivers. When prefill saturates, requests wait
    in prefill queues, decode occupancy falls, Eq. 5 still names decode the bottleneck, and the
    planner never adds prefill nodes (the simulator measured it stuck at 1P8D with 12 s mean TTFT
    in the OSWorld period of its shifting run; with in-flight counts it converges to 4P5D on CC
    with 126 agents, as the paper reports; see ``agentpool.sim.planners``). In flight is also what
    a router observes by itself: it routed the request and has not seen it finish.
    """

    IN_FLIGHT = "in_flight"
    IN_DECODE = "in_decode"


DEFAULT_OCCUPANCY = OccupancyCount.IN_FLIGHT


@dataclass(frozen=True, slots=True)
class WorkSlice:
    """One slice of a planning window: average request work ``w̄_i`` and occupancy ``q̄_i``.

    ``decode_occupancy`` is ``q̄_i``: the average number of requests over the whole cluster that
    the planner counts as decode demand (requests in flight by default, :class:`OccupancyCount`);
    the planner divides it by the number of decode nodes of a split (``B = q̄/|D|``).
    ``start``/``end``: the slice's time span (s; :func:`slice_window` sets them), which the planner
    needs to leave out the slices in the cooldown after a switch.
    """

    work: Work
    decode_occupancy: float
    start: float | None = None
    end: float | None = None

    def __post_init__(self) -> None:
        if self.work.t_uc <= 0 or self.work.t_out <= 0:
            raise ValueError(f"a slice needs positive average t_uc and t_out (no requests?): {self}")
        if not math.isfinite(self.decode_occupancy) or self.decode_occupancy < 0:
            raise ValueError(f"decode occupancy must be finite and >= 0, got {self.decode_occupancy}")
        if (self.start is None) != (self.end is None):
            raise ValueError(f"a slice has both a start and an end time or neither: {self}")
        if self.start is not None and self.end is not None and not self.end > self.start:
            raise ValueError(f"a slice ends after it starts: {self}")


@dataclass(frozen=True, slots=True)
class RequestWorkRecord:
    """One request's work after KV reuse, stamped with a wall-clock time ``at`` (s).

    The simulator stamps the arrival; the live router (``agentpool.router.work_log``) stamps the
    finish, when the output length is known (``t_out`` is then measured, not ``max_tokens``).
    """

    at: float
    work: Work


@dataclass(frozen=True, slots=True)
class OccupancySample:
    """``requests`` counted at time ``at`` (s) by one ``source``, as ``counts`` says.

    ``source`` tells apart the routers that each see part of the cluster: :func:`slice_window`
    averages each source's samples on a slice and sums the sources, so two routers with 50
    requests in flight each make ``q̄ = 100``. One source (the simulator, one router) is ``""``.

    ``in_decode`` is the field's old name, kept as a read-only alias of ``requests`` for callers
    written before ``counts`` existed; it returns ``requests`` whatever ``counts`` says.
    """

    at: float
    requests: float
    counts: OccupancyCount = DEFAULT_OCCUPANCY
    source: str = ""

    def __post_init__(self) -> None:
        if not math.isfinite(self.requests) or self.requests < 0:
            raise ValueError(f"an occupancy sample counts >= 0 requests, got {self.requests}")

    @property
    def in_decode(self) -> float:
        """Deprecated alias of ``requests`` (whatever ``counts`` says)."""
        return self.requests


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
    counts: OccupancyCount | None = None,
) -> SlicedWindow:
    """Cut ``[start, end)`` into ``m`` equal slices and average work and occupancy on each.

    A slice without any request or without any occupancy sample carries no evidence and is left
    out (counted in ``empty_slices``), never filled in. Occupancy on a slice is the sum over
    sources of each source's mean sample. With ``counts`` given, only samples that count that are
    used; without it, all samples must count the same thing (ValueError otherwise).
    """
    if m < 1:
        raise ValueError(f"need at least one slice, got {m}")
    if not end > start:
        raise ValueError(f"window end {end} must be after start {start}")
    width = (end - start) / m
    works: list[list[Work]] = [[] for _ in range(m)]
    samples: list[dict[str, list[float]]] = [{} for _ in range(m)]
    kinds: set[OccupancyCount] = set()
    for r in requests:
        i = _slice_index(r.at, start, end, width, m)
        if i is not None:
            works[i].append(r.work)
    for s in occupancy:
        if counts is not None and s.counts != counts:
            continue
        i = _slice_index(s.at, start, end, width, m)
        if i is not None:
            kinds.add(s.counts)
            samples[i].setdefault(s.source, []).append(s.requests)
    if len(kinds) > 1:
        raise ValueError(f"occupancy samples count different things in one window: {sorted(kinds)}")
    slices: list[WorkSlice] = []
    for i, (ws, by_source) in enumerate(zip(works, samples, strict=True)):
        if ws and by_source:
            q = sum(sum(qs) / len(qs) for qs in by_source.values())
            lo, hi = start + i * width, end if i == m - 1 else start + (i + 1) * width
            slices.append(WorkSlice(work=mean_work(ws), decode_occupancy=q, start=lo, end=hi))
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
