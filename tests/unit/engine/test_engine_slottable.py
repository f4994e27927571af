"""The host pool's slot table: generations as a seqlock, the index a reader searches one-sidedly."""

from __future__ import annotations

import pytest

from agentpool.engine.hostpool import HostPool
from agentpool.engine.slottable import WAYS, SlotTable, find, set_of, sets_for, valid
from agentpool.kv import ROOT_HASH


def read_sets(table: SlotTable, hashes: list[int]) -> list[int]:
    """What a reader's table READ returns: the words of the set of each hash (as NIXL copies them)."""
    index = table.array[table.index_offset // 8 :].reshape(table.sets, WAYS * 2)
    return [int(w) for h in hashes for w in index[set_of(h, table.sets)]]


def read_headers(table: SlotTable, slots: list[int]) -> list[int]:
    headers = table.array[: table.slots * 2].reshape(table.slots, 2)
    return [int(w) for s in slots for w in headers[s]]


def lookup(table: SlotTable, hashes: list[int]) -> tuple[list[int], list[int]]:
    found = find(read_sets(table, hashes), hashes)
    assert found is not None, "not indexed"
    return found


def test_sets_are_a_power_of_two_at_least_the_slots() -> None:
    assert sets_for(1) == 64 and sets_for(64) == 64 and sets_for(65) == 128
    hashes = [3, 2**64 - 1, 0x9E3779B97F4A7C15, 12345678901234567, *range(1000)]
    got = {set_of(h, 128) for h in hashes}
    assert all(0 <= s < 128 for s in got) and len(got) > 100  # spread over the sets


def test_a_written_block_is_found_with_its_slot_and_generation_and_validates() -> None:
    t = SlotTable(8)
    t.begin_write(5)
    assert t.generation(5) == 1
    t.end_write(5, 0xABC)
    assert t.generation(5) == 2
    assert find(read_sets(t, [0xABC, 0xDEF]), [0xABC, 0xDEF]) is None  # 0xDEF is not indexed
    slots, gens = lookup(t, [0xABC])
    assert slots == [5] and gens == [2]
    assert valid(read_headers(t, slots), [0xABC], gens)


def test_a_slot_rewritten_after_the_lookup_fails_validation() -> None:
    t = SlotTable(8)
    t.begin_write(2)
    t.end_write(2, 11)
    slots, gens = lookup(t, [11])
    t.unindex(11)
    t.begin_write(2)  # being overwritten: odd generation
    assert not valid(read_headers(t, slots), [11], gens)
    t.end_write(2, 11)  # even the same block again: a new generation, the READ may have seen a mix
    assert not valid(read_headers(t, slots), [11], gens)
    slots2, gens2 = lookup(t, [11])
    assert valid(read_headers(t, slots2), [11], gens2)


def test_an_unindexed_block_is_not_found_and_a_full_set_indexes_nothing() -> None:
    t = SlotTable(4)
    t.begin_write(0)
    t.end_write(0, 7)
    t.unindex(7)
    assert find(read_sets(t, [7]), [7]) is None
    same_set = [h for h in range(1, 100_000) if set_of(h, t.sets) == set_of(1, t.sets)][: WAYS + 1]
    big = SlotTable(WAYS + 1)
    for s, h in enumerate(same_set):
        big.begin_write(s)
        big.end_write(s, h)
    assert big.unindexed == 1
    assert find(read_sets(big, same_set), same_set) is None
    assert lookup(big, same_set[:WAYS])[0] == list(range(WAYS))


def test_one_stale_header_among_many_fails_the_whole_read() -> None:
    t = SlotTable(8)
    want = [100 + s for s in range(6)]
    for s, h in enumerate(want):
        t.begin_write(s)
        t.end_write(s, h)
    slots, gens = lookup(t, want)
    assert slots == list(range(6))
    headers = read_headers(t, slots)
    assert valid(headers, want, gens)
    t.begin_write(4)
    assert not valid(read_headers(t, slots), want, gens)
    headers[4] = 999  # another block named in one slot's header
    assert not valid(headers, want, gens)


def test_end_write_without_begin_write_is_refused() -> None:
    t = SlotTable(2)
    with pytest.raises(RuntimeError):
        t.end_write(0, 1)


def test_the_host_pool_keeps_its_table_in_step() -> None:
    pool = HostPool(4, 64)
    pool.store_generated(ROOT_HASH, [10, 11, 12], 0.0)
    t = pool.table
    slots, gens = lookup(t, [10, 11, 12])
    assert slots == pool.slots([10, 11, 12])
    assert valid(read_headers(t, slots), [10, 11, 12], gens)
    pool.remove([11])
    assert find(read_sets(t, [11]), [11]) is None
    res = pool.reserve(2)  # a fetch takes slots: both odd until committed
    assert all(t.generation(s) % 2 == 1 for s in res.slots)
    assert not valid(read_headers(t, slots[1:2]), [11], gens[1:2])  # 11's old slot is reused
    pool.commit([(20, 12, res.slots[0])], 1.0)
    pool.release_slots(res.slots[1:])
    assert t.generation(res.slots[0]) % 2 == 0 and t.generation(res.slots[1]) % 2 == 1
    assert lookup(t, [20])[0] == [res.slots[0]]
