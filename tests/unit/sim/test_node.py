"""The node model against hand-computed iteration and request times."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_node_builders import node

from agentpool.node import GpuCache, Node, Request, Role


def req(rid: int, inp: int, out: int, cached: int = 0, restore: int = 0) -> Request:
    r = Request(rid, inp, out, [], [], f"b{rid}", 0.0)
    r.cached_tokens = cached
    r.restore_tokens = restore
    return r


def run_until_idle(n: Node, now: float = 0.0) -> list[tuple[str, int, float]]:
    """Advance ``n`` event by event; returns (kind, rid, time) of every completion."""
    events = []
    n.kick(now)
    while (t := n.wake_time()) < math.inf:
        out = n.advance(t)
        events += [("prefill", r.rid, r.first_token_at) for r in out.prefilled]
        events += [("decode", r.rid, r.done_at) for r in out.decoded]
    return events


def test_chunked_prefill_matches_hand_computed_iterations() -> None:
    n = node(chunk=8192)
    r = req(1, inp=12000, out=1, cached=2000, restore=1000)
    n.enqueue(r, 0.0)
    events = run_until_idle(n)
    # t_uc = 10000: chunk 1 = 8192 tokens after 2000 cached, chunk 2 = 1808 tokens after 10192
    # T1 = 0.01 + 1e-4*8192 + 1e-8*(8192*2000 + 8192*8193/2) + 1e-5*1000
    #    = 0.01 + 0.8192 + 1e-8*(16384000 + 33558528) + 0.01 = 0.8392 + 0.49942528 = 1.33862528
    # T2 = 0.01 + 1e-4*1808 + 1e-8*(1808*10192 + 1808*1809/2) = 0.01 + 0.1808 + 1e-8*(18427136 + 1635336)
    #    = 0.1908 + 0.20062472 = 0.39142472
    assert events == [("prefill", 1, pytest.approx(1.33862528 + 0.39142472, abs=1e-12))]
    assert r.prefill_start == 0.0


def test_prefill_batches_requests_first_come_first_served_up_to_the_chunk() -> None:
    n = node(chunk=1000)
    a, b = req(1, 601, 1), req(2, 801, 1)  # 601 and 801 uncached tokens
    n.enqueue(a, 0.0)
    n.enqueue(b, 0.0)
    events = run_until_idle(n)
    # iteration 1: a 601 + b 399 -> 0.01 + 0.1 + 1e-8*(601*602/2 + 399*400/2) = 0.11 + 1e-8*(180901 + 79800)
    t1 = 0.11 + 0.00260701
    # iteration 2: b's other 402 tokens after its first 399 -> 0.01 + 0.0402 + 1e-8*(402*399 + 402*403/2)
    t2 = 0.0502 + 1e-8 * (160398 + 81003)
    assert events == [("prefill", 1, pytest.approx(t1)), ("prefill", 2, pytest.approx(t1 + t2))]


def test_decode_batch_changes_recompute_completion_times() -> None:
    n = node(role=Role.DECODE)
    a, b = req(1, 100, 11), req(2, 100, 6)  # 10 and 5 decode iterations
    n.join_decode(a, 0.0)
    # alone: T_D(1) = 0.021 per iteration; b joins at 0.042 after a's 2 iterations
    n.advance(0.042)
    n.join_decode(b, 0.042)
    events = run_until_idle(n, 0.042)
    # both run at T_D(2) = 0.022: b needs 5 iterations -> 0.042 + 0.110 = 0.152 (a has 3 left)
    # a alone again for 3 iterations at 0.021 -> 0.152 + 0.063 = 0.215
    assert events == [("decode", 2, pytest.approx(0.152)), ("decode", 1, pytest.approx(0.215))]


def test_decode_iterations_count_accepted_tokens() -> None:
    n = node(role=Role.DECODE, t_acc=2.0)
    a = req(1, 100, 10)  # 9 decode tokens at 2 per iteration -> 5 iterations
    n.join_decode(a, 0.0)
    assert run_until_idle(n) == [("decode", 1, pytest.approx(5 * 0.021))]


def test_colocated_iteration_mixes_prefill_chunk_and_decode_step() -> None:
    n = node(role=Role.BOTH)
    d = req(1, 100, 3)  # 2 decode iterations
    n.join_decode(d, 0.0)
    p = req(2, 101, 1)  # 101 uncached tokens
    n.enqueue(p, 0.0)
    events = run_until_idle(n)
    # mixed iteration: 0.01 + 0.0101 + 1e-8*101*102/2 + T_D(1) = 0.0201 + 0.00005151 + 0.021
    mixed = 0.0201 + 0.00005151 + 0.021
    assert events == [("prefill", 2, pytest.approx(mixed)), ("decode", 1, pytest.approx(mixed + 0.021))]


def test_fetch_in_flight_holds_the_request_back_but_not_others() -> None:
    n = node()
    slow, fast = req(1, 101, 1), req(2, 101, 1)
    slow.fetch_ready_at = 1.0
    n.enqueue(slow, 0.0)
    n.enqueue(fast, 0.0)
    events = run_until_idle(n)
    single = 0.01 + 0.0101 + 1e-8 * 101 * 102 / 2
    assert events == [("prefill", 2, pytest.approx(single)), ("prefill", 1, pytest.approx(1.0 + single))]


def test_synchronous_fetch_delays_the_whole_iteration() -> None:
    n = node()
    a, b = req(1, 101, 1), req(2, 101, 1)
    a.sync_fetch_s = 0.5
    n.enqueue(a, 0.0)
    n.enqueue(b, 0.0)
    events = run_until_idle(n)
    batch = 0.01 + 2 * (0.0101 + 1e-8 * 101 * 102 / 2) + 0.5
    assert events == [("prefill", 1, pytest.approx(batch)), ("prefill", 2, pytest.approx(batch))]


def test_gpu_cache_evicts_leaves_first_and_stays_prefix_closed() -> None:
    c = GpuCache(4)
    assert c.touch([1, 2, 3]) == []
    # the root was refreshed last, so the old leaf 3 is the least recent block
    assert c.touch([1, 7, 8]) == [3]
    assert c.prefix([1, 2, 3]) == 2
    assert c.touch([1, 7, 8, 9]) == [2]
    assert c.prefix([1, 2]) == 1
    assert c.prefix([1, 7, 8, 9]) == 4


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=12), st.integers(1, 12)
)
def test_gpu_cache_binary_search_equals_linear_scan(paths: list[list[int]], capacity: int) -> None:
    # build chained keys: a path's i-th key names its whole prefix, like chained block hashes
    def keys(path: list[int]) -> list[int]:
        return [hash(tuple(path[: i + 1])) & 0xFFFFFFFF for i in range(len(path))]

    c = GpuCache(capacity)
    for p in paths:
        c.touch(keys(p))
        for q in paths:
            k = keys(q)
            linear = 0
            while linear < len(k) and k[linear] in c:
                linear += 1
            assert c.prefix(k) == linear


class _SequentialLru:
    """The plain definition of ``GpuCache.touch``: move each block to the recent end, deepest first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lru: dict[int, None] = {}

    def touch(self, blocks: list[int]) -> list[int]:
        for b in reversed(blocks):
            self.lru.pop(b, None)
            self.lru[b] = None
        evicted = list(self.lru)[: max(0, len(self.lru) - self.capacity)]
        for b in evicted:
            del self.lru[b]
        return evicted


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 9), max_size=8)), min_size=1, max_size=20),
    st.integers(0, 10),
)
def test_gpu_cache_touch_equals_sequential_moves(ops: list[tuple[bool, list[int]]], capacity: int) -> None:
    # repeated keys in one call and discards included: order and evictions must match exactly
    c = GpuCache(capacity)
    ref = _SequentialLru(capacity)
    for is_touch, blocks in ops:
        if is_touch:
            assert c.touch(blocks) == ref.touch(blocks)
        else:
            c.discard(blocks)
            for b in blocks:
                ref.lru.pop(b, None)
        assert list(c._lru) == list(ref.lru)
