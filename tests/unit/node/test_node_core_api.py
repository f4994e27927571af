"""The node core's driver API: submit/advance on the driver's clock, load snapshots, hand-over, drain,
host tier. Coefficients are round so that times can be checked by hand."""

from __future__ import annotations

import math

import pytest

from agentpool.models import DecodeModel, PrefillModel
from agentpool.node import HostCache, Iteration, Node, NodeStatus, Request, Role

PREFILL = PrefillModel(c0=0.01, c1=1e-4, c2=0.0, c3=0.0)  # T_P = 0.01 + 1e-4 * t_uc
DECODE = DecodeModel(d0=0.02, d1=0.0, d2=0.001, experts_total=0)  # T_D(B) = 0.02 + 0.001 B


def make(role: Role, records: list[Iteration] | None = None, chunk: int = 1000) -> Node:
    return Node(
        0,
        "n0",
        PREFILL,
        DECODE,
        role=role,
        chunk_tokens=chunk,
        t_acc=1.0,
        gpu_cache_blocks=100,
        kv_capacity_tokens=10_000,
        on_iteration=None if records is None else records.append,
    )


def req(rid: int, inp: int, out: int, cached: int = 0) -> Request:
    r = Request(rid, inp, out, [], [], f"b{rid}", 0.0)
    r.cached_tokens = cached
    return r


def run(node: Node, now: float = 0.0, limit: int = 1000) -> tuple[list[int], list[int], float]:
    """A driver loop: advance to each next event time until nothing is scheduled."""
    prefilled: list[int] = []
    decoded: list[int] = []
    for _ in range(limit):
        t = node.next_event_time()
        if t == math.inf:
            return prefilled, decoded, now
        now = max(now, t)
        out = node.advance(now)
        prefilled += [r.rid for r in out.prefilled]
        decoded += [r.rid for r in out.decoded]
    raise AssertionError("did not settle")


def test_submit_chunks_a_prompt_and_reports_each_iteration() -> None:
    records: list[Iteration] = []
    node = make(Role.PREFILL, records)
    node.submit(req(1, 2500, 5, cached=500), 0.0)  # 2,000 uncached tokens: two 1,000-token chunks
    assert node.prefill_active and node.next_event_time() == pytest.approx(0.01 + 0.1)
    prefilled, decoded, end = run(node)
    assert prefilled == [1] and decoded == []
    assert end == pytest.approx(2 * (0.01 + 0.1))
    assert [len(r.batch) for r in records] == [1, 1]
    assert [r.batch[0].t_c for r in records] == [500.0, 1500.0]  # the second chunk sees the first
    assert sum(r.end - r.start for r in records) == pytest.approx(end)


def test_load_lists_queue_work_and_kv_state() -> None:
    node = make(Role.PREFILL)
    node.submit(req(1, 1500, 5), 0.0)
    node.submit(req(2, 800, 5, cached=300), 0.0)
    load = node.load(0.05)
    assert load.role is Role.PREFILL and load.status is NodeStatus.SERVING
    # the first 1,000 tokens of request 1 run; its rest and request 2 wait
    assert load.remaining_batch_s == pytest.approx(0.11 - 0.05)
    assert [(q.rid, q.uncached_tokens, q.cached_tokens, q.started) for q in load.queue] == [
        (2, 500, 300, False)
    ]
    node.advance(0.11)
    load = node.load(0.11)
    assert load.queue == ()  # the rest of 1 and all of 2 fill the next 1,000-token chunk
    assert load.remaining_batch_s == pytest.approx(0.01 + 1e-4 * 1000)


def test_drain_hands_back_unstarted_work_and_waits_for_running_work() -> None:
    node = make(Role.PREFILL, chunk=1000)
    node.submit(req(1, 3000, 5), 0.0)  # starts now: 3 chunks
    node.submit(req(2, 500, 5), 0.0)
    node.submit(req(3, 500, 5), 0.0)
    handed_back = node.begin_drain()
    assert [r.rid for r in handed_back] == [2, 3]  # request 1 started: it finishes here
    assert node.status is NodeStatus.DRAINING and not node.drained
    prefilled, _, _ = run(node)
    assert prefilled == [1] and node.drained
    node.go_down(keep_kv=True)
    assert node.status is NodeStatus.DOWN
    node.finish_switch(Role.DECODE)
    assert node.role is Role.DECODE and node.status is NodeStatus.SERVING


def test_decode_node_reserves_kv_waits_for_the_handover_and_decodes() -> None:
    node = make(Role.DECODE)
    r = req(1, 1000, 11)
    node.reserve_decode(r)  # bound when its prefill starts elsewhere
    assert node.load(0.0).kv_room_tokens == 10_000 - 1011 and node.bound_waiting == 1
    node.status = NodeStatus.DRAINING
    assert not node.drained  # a drain waits for requests bound here
    node.status = NodeStatus.SERVING
    r.first_token_at = 1.0
    node.handover_started(r, was_waiting=True)
    assert node.bound_waiting == 0 and node.joining == 1
    node.handover_arrived(r, 1.5)
    assert node.joining == 0 and node.kv_used_tokens == 1011 and len(node.running) == 1
    _, decoded, end = run(node, 1.5)
    assert decoded == [1]
    assert end == pytest.approx(1.5 + 10 * 0.021)  # 10 iterations of T_D(1) after the first token
    assert node.kv_used_tokens == 0


def test_host_cache_evicts_unneeded_blocks_first_then_least_recent() -> None:
    host = HostCache(4, batch_fraction=0.25)
    host.store([1, 2], 0.0)
    host.store([3], 1.0)
    host.store([4], 2.0)
    assert host.evict({}) == [] and not host.over_capacity()
    host.store([5], 3.0)
    assert host.over_capacity()
    # down to 4 * 0.75 = 3 blocks: two leave; block 1 and 2 are needed by a live branch
    assert host.evict({1: 1, 2: 1}) == [3, 4]
    assert sorted(host.access) == [1, 2, 5]
    host.store([6, 7], 4.0)
    assert host.evict({}) == [1, 2]  # plain LRU without counts


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        HostCache(-1)
    with pytest.raises(ValueError):
        HostCache(10, batch_fraction=1.0)


def test_one_gpu_memory_running_requests_evict_cached_prefixes() -> None:
    node = Node(
        0,
        "n0",
        PREFILL,
        DECODE,
        role=Role.BOTH,
        chunk_tokens=1000,
        t_acc=1.0,
        gpu_cache_blocks=10,
        kv_capacity_tokens=640,
        shared_kv_block_tokens=64,
    )
    node.gpu.touch([1, 2, 3, 4, 5, 6, 7, 8])  # a cached path of 8 blocks from the root, 1
    assert len(node.gpu) == 8
    r = req(1, 250, 70)  # 320 KV tokens: 5 blocks of the node's 10
    node.join_decode(r, 0.0)
    assert node.gpu.capacity == 5 and len(node.gpu) == 5
    assert node.gpu.prefix([1, 2, 3, 4, 5, 6, 7, 8]) == 5  # the deepest blocks went first
    _, decoded, _ = run(node)
    assert decoded == [1] and node.kv_used_tokens == 0
    assert node.gpu.capacity == 10 and len(node.gpu) == 5  # room again, the evicted blocks stay gone


def test_separate_pools_keep_the_prefix_cache_whole() -> None:
    node = make(Role.BOTH)  # no shared_kv_block_tokens: the former two pools
    node.gpu.touch([1, 2, 3])
    node.join_decode(req(1, 5000, 3), 0.0)
    assert len(node.gpu) == 3 and node.gpu.capacity == 100
