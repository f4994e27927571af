"""The host pool's slot table: generations as a seqlock, the index a reader searches one-sidedly."""

from __future__ import annotations

import numpy as np
import pytest

from agentpool.engine.hostpool import HostPool
from agentpool.engine.slottable import WAYS, SlotTable, find, set_of, sets_for, sets_of, valid
from agentpool.kv import ROOT_HASH


def read_sets(table: SlotTable, hashes: list[int]) -> np.ndarray:
    """What a reader's table READ returns: the set of each hash (as NIXL would copy it)."""
    index = table.array[table.index_offset // 8 :].reshape(table.sets, WAYS * 2)
    return index[sets_of(np.asarray(hashes, dtype=np.uint64), table.sets)].copy()


def read_headers(table: SlotTable, slots: np.ndarray) -> np.ndarray:
    return table.array[: table.slots * 2].reshape(table.slots, 2)[slots].copy()


def test_sets_are_a_power_of_two_at_least_the_slots() -> None:
    assert sets_for(1) == 64 and sets_for(64) == 64 and sets_for(65) == 128
    hashes = [3, 2**64 - 1, 0x9E3779B97F4A7C15, 12345678901234567]
    got = sets_of(np.asarray(hashes, dtype=np.uint64), 128)
    assert [int(x) for x in got] == [set_of(h, 128) for h in hashes]
    assert all(0 <= set_of(h, 128) < 128 for h in hashes)


def test_a_written_block_is_found_with_its_slot_and_generation_and_validates() -> None:
    t = SlotTable(8)
    t.begin_write(5)
    assert t.generation(5) == 1
    t.end_write(5, 0xABC)
    assert t.generation(5) == 2
    want = np.asarray([0xABC, 0xDEF], dtype=np.uint64)
    slots, gens = find(read_sets(t, [0xABC, 0xDEF]), want)
    assert list(slots) == [5, -1] and int(gens[0]) == 2
    ok = valid(read_headers(t, slots[:1]), want[:1], gens[:1])
    assert list(ok) == [True]


def test_a_slot_rewritten_after_the_lookup_fails_validation() -> None:
    t = SlotTable(8)
    t.begin_write(2)
    t.end_write(2, 11)
    want = np.asarray([11], dtype=np.uint64)
    slots, gens = find(read_sets(t, [11]), want)
    t.unindex(11)
    t.begin_write(2)  # being overwritten: odd generation
    assert not valid(read_headers(t, slots), want, gens).any()
    t.end_write(2, 11)  # even the same block again: a new generation, the READ may have seen a mix
    assert not valid(read_headers(t, slots), want, gens).any()
    slots2, gens2 = find(read_sets(t, [11]), want)
    assert valid(read_headers(t, slots2), want, gens2).all()


def test_an_unindexed_block_is_not_found_and_a_full_set_indexes_nothing() -> None:
    t = SlotTable(4)
    t.begin_write(0)
    t.end_write(0, 7)
    t.unindex(7)
    assert find(read_sets(t, [7]), np.asarray([7], dtype=np.uint64))[0][0] == -1
    same_set = [h for h in range(1, 100_000) if set_of(h, t.sets) == set_of(1, t.sets)][: WAYS + 1]
    big = SlotTable(WAYS + 1)
    for s, h in enumerate(same_set):
        big.begin_write(s)
        big.end_write(s, h)
    assert big.unindexed == 1
    slots, _ = find(read_sets(big, same_set), np.asarray(same_set, dtype=np.uint64))
    assert list(slots) == [*range(WAYS), -1]


def test_end_write_without_begin_write_is_refused() -> None:
    t = SlotTable(2)
    with pytest.raises(RuntimeError):
        t.end_write(0, 1)


def test_the_host_pool_keeps_its_table_in_step() -> None:
    pool = HostPool(4, 64)
    pool.store_generated(ROOT_HASH, [10, 11, 12], 0.0)
    t = pool.table
    want = np.asarray([10, 11, 12], dtype=np.uint64)
    slots, gens = find(read_sets(t, [10, 11, 12]), want)
    assert list(slots) == pool.slots([10, 11, 12])
    assert valid(read_headers(t, slots), want, gens).all()
    pool.remove([11])
    assert find(read_sets(t, [11]), want[1:2])[0][0] == -1
    res = pool.reserve(2)  # a fetch takes slots: both odd until committed
    assert all(t.generation(s) % 2 == 1 for s in res.slots)
    assert not valid(read_headers(t, slots[1:2]), want[1:2], gens[1:2]).any()  # 11's old slot is reused
    pool.commit([(20, 12, res.slots[0])], 1.0)
    pool.release_slots(res.slots[1:])
    assert t.generation(res.slots[0]) % 2 == 0 and t.generation(res.slots[1]) % 2 == 1
    slots, gens = find(read_sets(t, [20]), np.asarray([20], dtype=np.uint64))
    assert list(slots) == [res.slots[0]]
