"""Host-memory eviction order (Section 5.3, Algorithm E.2 ``EvictHost``): key ``(R > 0, last access)``."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import chain, repeat
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import numpy.typing as npt

from agentpool.kv.shards import access_parts

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

_T = TypeVar("_T", bound="SupportsRichComparison")
_Hashes = npt.NDArray[np.uint64]
_Times = npt.NDArray[np.float64]
_Flags = npt.NDArray[np.bool_]
_Indices = npt.NDArray[np.intp]


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
    ordered = _ordered_hashes(access, counted, limit)
    if ordered is None:
        return _general_order(access, counted, limit)
    picked, times, _ = ordered
    return list(map(EvictionCandidate, picked, map(counted.get, picked, repeat(0)), times))


def eviction_hashes_counted(
    access: Mapping[int, float], counted: Mapping[int, int], limit: int | None = None
) -> list[int]:
    """The hashes of :func:`eviction_order_counted` (same order), without a candidate per block: what a
    caller that only removes the blocks needs."""
    return eviction_pick(access, counted, limit)[0]


def eviction_pick(
    access: Mapping[int, float], counted: Mapping[int, int], limit: int | None = None
) -> tuple[list[int], bool]:
    """:func:`eviction_hashes_counted`, and whether none of the hashes is in ``counted`` (known from
    the order itself: then a caller that removes them has no counts to clear)."""
    ordered = _ordered_hashes(access, counted, limit)
    if ordered is None:
        order = _general_order(access, counted, limit)
        return [c.block_hash for c in order], not any(c.count for c in order)
    return ordered[0], ordered[2]


def _general_order(
    access: Mapping[int, float], counted: Mapping[int, int], limit: int | None
) -> list[EvictionCandidate]:
    """:func:`eviction_order` with the counts of ``counted``: for hashes numpy cannot hold, and for a
    negative ``limit`` (which drops blocks from the end of the whole order)."""
    return eviction_order(access.items(), lambda h: counted.get(h, 0), limit)


def _ordered_hashes(
    access: Mapping[int, float], counted: Mapping[int, int], limit: int | None
) -> tuple[list[int], list[float], bool] | None:
    """The first ``limit`` (all if ``None``) hashes of ``access`` by ``(R > 0, last access, hash)``,
    their access times and whether none of them is counted, or ``None`` when a hash that may be
    among them is outside ``[0, 2**64)`` or ``limit`` is negative.

    With a limit, only the blocks that can be among the first ``limit`` are sorted: the zero-count
    group alone when it has enough blocks, and in the group, the blocks accessed no later than the
    ``limit``-th smallest access time (a linear ``partition``). The result equals slicing the full
    ``lexsort`` (ties at the cut time are all kept and sorted by hash). Only those blocks' hashes are
    converted to numbers, and the hashes returned are the table's own key objects (with counts, the
    count lookups have read every key just before, so this saves little: ``sim_speed.md``). Looking
    the counts up oldest block first, only as far as the order needs, saved nothing at D.2: in the
    steady state 95% of a node's blocks had to be looked up (``sim_speed.md``, eighth session)."""
    if limit is not None and limit < 0:
        return None
    n = len(access)
    parts = access_parts(access)  # a sharded table is read shard by shard, at C level
    keys = list(chain.from_iterable(parts))
    times = np.fromiter(chain.from_iterable(p.values() for p in parts), np.float64, n)
    positive = np.fromiter(map(counted.__contains__, keys), np.bool_, n) if counted else None
    picks = n if limit is None else min(n, limit)
    # the blocks picked are all uncounted when the zero-count group alone has enough of them
    uncounted = positive is None or n - int(np.count_nonzero(positive)) >= picks
    try:
        if limit is not None and limit < n:
            order = _first(keys, times, positive, limit)
        else:
            hashes = np.fromiter(keys, np.uint64, n)
            if positive is not None:
                order = np.lexsort((hashes, times, positive))  # the last key sorts first
            else:
                order = np.lexsort((hashes, times))
    except OverflowError:
        return None
    picked = order.tolist()
    return list(map(keys.__getitem__, picked)), times[order].tolist(), uncounted


def _hashes_at(keys: list[int], at: _Indices) -> _Hashes:
    """The hashes ``keys[i]`` for ``i`` in ``at`` as numbers (``OverflowError`` outside ``[0, 2**64)``)."""
    return np.fromiter(map(keys.__getitem__, at.tolist()), np.uint64, len(at))


def _first(keys: list[int], times: _Times, positive: _Flags | None, limit: int) -> _Indices:
    """Indices of the first ``limit`` blocks (``0 <= limit < len``) by ``(positive, time, hash)``."""
    if positive is not None:
        zero = np.flatnonzero(~positive)
        if len(zero) < limit:  # every zero-count block, then the first of the counted ones
            rest = np.flatnonzero(positive)
            head = zero[np.lexsort((_hashes_at(keys, zero), times[zero]))]
            tail = _first_by_time(keys, rest, times[rest], limit - len(zero))
            return np.concatenate((head, tail))
        return _first_by_time(keys, zero, times[zero], limit)
    return _first_by_time(keys, np.arange(len(times)), times, limit)


def _first_by_time(keys: list[int], at: _Indices, times: _Times, limit: int) -> _Indices:
    """Of the blocks ``at`` (their access times ``times``), the indices of the first ``limit`` by
    ``(time, hash)``."""
    if limit <= 0:
        return at[:0]
    if limit < len(times):
        cut = np.partition(times, limit - 1)[limit - 1]
        near = np.flatnonzero(times <= cut)  # at least ``limit`` blocks: every one that may come first
        at, times = at[near], times[near]
    return at[np.lexsort((_hashes_at(keys, at), times))][:limit]


def _smallest(items: list[_T], limit: int | None) -> list[_T]:
    """``sorted(items)[:limit]``, with a bounded heap when ``limit`` is a small part of ``items``."""
    if limit is None or limit < 0 or limit >= len(items):
        items.sort()
        return items if limit is None else items[:limit]
    if limit * 4 <= len(items):
        return heapq.nsmallest(limit, items)
    items.sort()
    return items[:limit]
