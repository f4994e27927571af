"""Host-memory eviction order (Section 5.3, Algorithm E.2 ``EvictHost``): key ``(R > 0, last access)``."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, TypeVar

import numpy as np

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
    host_blocks: Iterable[tuple[int, float]] | Mapping[int, float],
    counted: Mapping[int, int],
    limit: int | None = None,
) -> list[EvictionCandidate]:
    """:func:`eviction_order` with ``count(h) = counted[h]`` for the keys of ``counted`` and 0 for every
    other block (``counted`` holds no zero values): the same order, without a call per block.

    ``host_blocks``: ``(hash, last access)`` pairs with distinct hashes (a node holds a block once), or a
    ``hash -> last access`` mapping (no copy). Hashes in ``[0, 2**64)`` (every engine hash) are ordered by
    one numpy ``lexsort`` on ``(R > 0, last access, hash)``: it builds no Python object per block, so a
    node's whole host index does not feed the garbage collector. Other hashes take :func:`eviction_order`.
    """
    access = host_blocks if isinstance(host_blocks, Mapping) else dict(host_blocks)
    if limit is not None and limit < 0:  # drops blocks from the end of the whole order
        return eviction_order(access.items(), lambda h: counted.get(h, 0), limit)
    n = len(access)
    try:
        hashes = np.fromiter(access.keys(), np.uint64, n)
    except OverflowError:
        return eviction_order(access.items(), lambda h: counted.get(h, 0), limit)
    times = np.fromiter(access.values(), np.float64, n)
    if counted:
        positive = np.fromiter(map(counted.__contains__, access.keys()), np.bool_, n)
        order = np.lexsort((hashes, times, positive))  # the last key sorts first
    else:
        order = np.lexsort((hashes, times))
    if limit is not None:
        order = order[:limit]
    picked = hashes[order].tolist()
    return list(map(EvictionCandidate, picked, map(counted.get, picked, repeat(0)), times[order].tolist()))


def _smallest(items: list[_T], limit: int | None) -> list[_T]:
    """``sorted(items)[:limit]``, with a bounded heap when ``limit`` is a small part of ``items``."""
    if limit is None or limit < 0 or limit >= len(items):
        items.sort()
        return items if limit is None else items[:limit]
    if limit * 4 <= len(items):
        return heapq.nsmallest(limit, items)
    items.sort()
    return items[:limit]
