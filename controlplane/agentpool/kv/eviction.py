"""Host-memory eviction order (Section 5.3, Algorithm E.2 ``EvictHost``): key ``(R > 0, last access)``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EvictionCandidate:
    block_hash: int
    count: int
    last_access: float


def eviction_order(
    host_blocks: Iterable[tuple[int, float]], count: Callable[[int], int], limit: int | None = None
) -> list[EvictionCandidate]:
    """Host blocks in eviction order: zero-count blocks first, least recently used first in each group.

    Ties on both keys break by hash so the order is deterministic. ``limit`` keeps the first ``limit``.
    """
    cands = [EvictionCandidate(h, count(h), t) for h, t in host_blocks]
    cands.sort(key=lambda c: (c.count > 0, c.last_access, c.block_hash))
    return cands if limit is None else cands[:limit]
