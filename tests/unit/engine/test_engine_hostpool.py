"""Host pool bookkeeping: write-through bytes, pins, eviction in the directory's count order."""

from __future__ import annotations

import pytest

from agentpool.engine.blockdata import block_bytes_for, block_matches, fill_block
from agentpool.engine.errors import PoolFullError
from agentpool.engine.hostpool import HostPool
from agentpool.kv import ROOT_HASH, Tier


def test_block_bytes_depend_on_hash_and_position() -> None:
    a = block_bytes_for(7, 64)
    assert block_matches(a, 7) and not block_matches(a, 8)
    shifted = a.copy()
    shifted[:-8] = a[8:]
    assert not block_matches(shifted, 7)
    with pytest.raises(ValueError):
        block_bytes_for(7, 12)


def test_store_generated_fills_bytes_and_indexes_a_chain() -> None:
    pool = HostPool(8, 64)
    stored, evicted = pool.store_generated(ROOT_HASH, [11, 12, 13], now=1.0)
    assert stored == [11, 12, 13] and evicted == []
    assert all(pool.matches(h) for h in stored)
    assert pool.parent_of == {11: ROOT_HASH, 12: 11, 13: 12}
    assert [(b.block_hash, b.parent_hash, b.tiers) for b in pool.held_blocks()] == [
        (11, 0, Tier.HOST),
        (12, 11, Tier.HOST),
        (13, 12, Tier.HOST),
    ]
    assert pool.store_generated(ROOT_HASH, [11, 12], now=2.0) == ([], [])


def test_eviction_takes_zero_count_blocks_first_then_lru() -> None:
    pool = HostPool(4, 64)
    pool.store_generated(ROOT_HASH, [1, 2], now=1.0)  # older
    pool.store_generated(ROOT_HASH, [3, 4], now=2.0)  # newer
    pool.set_counts({1: 2, 2: 1}, snapshot=True)  # the older path is still referenced by a branch
    _, evicted = pool.store_generated(ROOT_HASH, [5], now=3.0)
    assert evicted == [3]  # zero count before LRU: the newer, unreferenced path goes first
    pool.set_counts({3: 0, 1: 0}, snapshot=False)
    assert pool.counts == {2: 1}
    assert pool.eviction_candidates() == [1, 4, 5, 2]


def test_pinned_blocks_are_never_evicted() -> None:
    pool = HostPool(2, 64)
    pool.store_generated(ROOT_HASH, [1, 2], now=1.0)
    pool.pin([1, 2])
    with pytest.raises(PoolFullError):
        pool.reserve(1)
    assert len(pool) == 2
    pool.unpin([1])
    assert pool.reserve(1).evicted == [1]


def test_commit_keeps_an_existing_copy_and_frees_the_new_slot() -> None:
    pool = HostPool(4, 64)
    pool.store_generated(ROOT_HASH, [1], now=0.0)
    res = pool.reserve(2)
    for s, h in zip(res.slots, [1, 2], strict=True):
        fill_block(pool.slot_view(s), h)
    assert pool.commit([(1, ROOT_HASH, res.slots[0]), (2, 1, res.slots[1])], now=1.0) == [2]
    assert pool.free_slots == 2 and pool.matches(2)


def test_first_mismatch_finds_the_first_wrong_block_at_any_stride() -> None:
    from agentpool.engine.blockdata import first_mismatch

    pool = HostPool(8, 4096)
    pool.store_generated(ROOT_HASH, [11, 12, 13, 14], now=0.0)
    slots = pool.slots([11, 12, 13, 14])
    for stride in (1, 16, 512):
        assert first_mismatch(pool.buffer, 4096, slots, [11, 12, 13, 14], stride) is None
    assert first_mismatch(pool.buffer, 4096, slots, [11, 12, 99, 14]) == 2
    pool.slot_view(slots[1])[:8] = 0  # the first word of block 12 damaged
    assert first_mismatch(pool.buffer, 4096, slots, [11, 12, 13, 14], 512) == 1
    assert first_mismatch(pool.buffer, 4096, [], [], 512) is None
