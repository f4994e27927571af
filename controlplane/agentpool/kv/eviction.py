"""Host-memory eviction order (Section 5.3, Algorithm E.2 ``EvictHost``): key ``(R > 0, last access)``."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

_T = TypeVar("_T", bound="SupportsRichComparison")


@dataclass(slots=True)
class EvictionCandidate:
    """One host block in eviction order; read-only by convention. Not frozen: an order lists thousands
    of blocks and a frozen dataclass costs three times as much to build."""

    block_hash: int
    count: int
    last_access: float


def eviction_order(
    host_blocks: Iterable[tuple[int, float]], count: Callable[[int], int], limit: int | None = None
) -> list[EvictionCandidate]:
    """Host blocks in eviction order: zero-count blocks first, least recently used first in each group.

    Ties on both keys break by hash so the order is deterministic. ``limit`` keeps the first ``limit``.
    """
    keyed = [(c > 0, t, h, c) for h, t in host_blocks for c in (count(h),)]
    return [EvictionCandidate(h, c, t) for _, t, h, c in _smallest(keyed, limit)]


def eviction_order_counted(
    host_blocks: Iterable[tuple[int, float]],
    counted: Mapping[int, int],
    limit: int | None = None,
) -> list[EvictionCandidate]:
    """:func:`eviction_order` with ``count(h) = counted[h]`` for the keys of ``counted`` and 0 for every
    other block (``counted`` holds no zero values): the same order, without a call per block.

    Zero-count blocks are selected first; the counted ones are only ordered when the zero-count
    blocks do not fill ``limit``. ``host_blocks`` is iterated up to twice (a list, or a live
    ``dict.items()`` view, which saves copying a node's whole host index).
    """
    blocks = host_blocks if isinstance(host_blocks, Collection) else list(host_blocks)
    if not counted:
        zero = [(t, h) for h, t in blocks]
        return [EvictionCandidate(h, 0, t) for t, h in _smallest(zero, limit)]
    if limit is not None and limit < 0:  # drops blocks from the end of the whole order
        return eviction_order(blocks, lambda h: counted.get(h, 0), limit)
    zero = [(t, h) for h, t in blocks if h not in counted]
    out = [EvictionCandidate(h, 0, t) for t, h in _smallest(zero, limit)]
    if limit is not None and len(out) >= limit:
        return out
    rest = None if limit is None else limit - len(out)
    positive = [(t, h) for h, t in blocks if h in counted]
    out.extend(EvictionCandidate(h, counted[h], t) for t, h in _smallest(positive, rest))
    return out


def _smallest(items: list[_T], limit: int | None) -> list[_T]:
    """``sorted(items)[:limit]``, with a bounded heap when ``limit`` is a small part of ``items``."""
    if limit is None or limit < 0 or limit >= len(items):
        items.sort()
        return items if limit is None else items[:limit]
    if limit * 4 <= len(items):
        return heapq.nsmallest(limit, items)
    items.sort()
    return items[:limit]
