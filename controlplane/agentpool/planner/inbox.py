"""Where engines' iteration records and the router's work records wait for the planner.

This is the seam between the planner and its data sources: engines (``add_iterations``) and the
router (``add_requests``, ``add_occupancy``) push records stamped with their time; the planner
reads them back by time range. Records older than ``keep_s`` before the newest one are dropped, and
iteration records beyond the newest ``max_iterations``, so memory stays bounded whatever the
traffic. Not thread-safe: use it from one event loop.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from agentpool.models import IterationRecord, OccupancySample, RequestWorkRecord


class Stamped(Protocol):
    @property
    def at(self) -> float: ...


T = TypeVar("T", bound=Stamped)


@dataclass
class _TimeSeries(Generic[T]):
    keep_s: float
    max_items: int | None = None
    items: list[T] = field(default_factory=list)
    dropped: int = 0

    def add(self, new: Iterable[T]) -> None:
        for item in new:
            if self.items and item.at < self.items[-1].at:
                bisect.insort(self.items, item, key=lambda x: x.at)
            else:
                self.items.append(item)
        if self.items:
            horizon = self.items[-1].at - self.keep_s
            cut = bisect.bisect_left(self.items, horizon, key=lambda x: x.at)
            if self.max_items is not None:
                extra = max(0, len(self.items) - cut - self.max_items)
                self.dropped += extra
                cut += extra
            del self.items[:cut]

    def between(self, start: float, end: float) -> list[T]:
        lo = bisect.bisect_left(self.items, start, key=lambda x: x.at)
        hi = bisect.bisect_left(self.items, end, key=lambda x: x.at)
        return self.items[lo:hi]


class PlannerInbox:
    """Time-ordered buffers of iteration records, request work records and occupancy samples."""

    def __init__(self, keep_s: float = 7200.0, max_iterations: int = 1_000_000):
        """``max_iterations``: the newest iteration records kept (about 200 MB), whatever ``keep_s``
        says: 64 engines sending 20 a second fill it in 13 minutes, plenty for a fit and a window."""
        if keep_s <= 0 or max_iterations < 1:
            raise ValueError(f"keep_s and max_iterations must be positive, got {keep_s}, {max_iterations}")
        self.keep_s = keep_s
        self._iterations: _TimeSeries[IterationRecord] = _TimeSeries(keep_s, max_iterations)
        self._requests: _TimeSeries[RequestWorkRecord] = _TimeSeries(keep_s)
        self._occupancy: _TimeSeries[OccupancySample] = _TimeSeries(keep_s)

    def add_iterations(self, records: Iterable[IterationRecord]) -> None:
        self._iterations.add(records)

    def add_requests(self, records: Iterable[RequestWorkRecord]) -> None:
        self._requests.add(records)

    def add_occupancy(self, samples: Iterable[OccupancySample]) -> None:
        self._occupancy.add(samples)

    @property
    def iterations_dropped(self) -> int:
        """Iteration records dropped because more than ``max_iterations`` arrived."""
        return self._iterations.dropped

    def iterations(self, start: float, end: float) -> list[IterationRecord]:
        return self._iterations.between(start, end)

    def requests(self, start: float, end: float) -> list[RequestWorkRecord]:
        return self._requests.between(start, end)

    def occupancy(self, start: float, end: float) -> list[OccupancySample]:
        return self._occupancy.between(start, end)
