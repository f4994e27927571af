"""Property tests of the branch counts (E.1/E.2) over random agent histories.

A history mixes requests (append, compaction, fork), placements on prefill and decode nodes (moves),
engine stores in GPU and/or host memory, phase switches, evictions of the GPU and/or host copy and
branch ends. After every step: counts are positive and equal a brute-force recount that the test derives
from the history alone (:class:`kv_reference.Reference`: paths sent, placements, stores, evictions and
phases it applied, never the directory's own sets); every branch counts only blocks of its current path;
a completed same-phase move leaves one counted copy in that phase; an evicted host copy has count zero
and no branch counts it (E.2 line 20); and after all branches end every count is zero. The same
histories are persisted through a store and reloaded into a fresh directory, which must hold the same
counts (memory store here; the Redis store runs the same check in tests/integration/directory). The
writes go through :class:`RowTracker`, as in the service: only the changed fields of a known row.
"""

from __future__ import annotations

import asyncio

from hypothesis import example, given, settings
from hypothesis import strategies as st
from kv_reference import NODES, Op, Reference, drive, ops

from agentpool.directory.store import BranchStore, MemoryBranchStore, RowTracker, snapshot
from agentpool.kv import Changes, Directory, Tier
from agentpool.kv.hashing import block_hashes

__all__ = ["NODES", "Op", "check_history", "ops"]


def check_invariants(d: Directory, ref: Reference, op: Op) -> None:
    for node in NODES:
        got = d.counts.counts(node)
        assert all(c > 0 for c in got.values())
        assert got == ref.counts(node), (op, node)  # independent recount from the history
    for b in d.branches.ids():
        state = d.branches.get(b)
        path = set(state.path)
        for blocks in state.counted.values():
            assert blocks <= path and blocks


def run_history(history: list[Op], store: BranchStore, loop: asyncio.AbstractEventLoop) -> Directory:
    d, ref = Directory(page_size=1), Reference()
    for n, p in NODES.items():
        loop.run_until_complete(store.save(snapshot(d, d.register_node(n, p))))

    rows = RowTracker()  # as the service writes: changed fields of known rows, new rows whole

    def persist(changes: Changes) -> None:
        loop.run_until_complete(store.save(rows.snapshot(d, changes)))

    for op in drive(history, d, ref, persist):
        if ref.last_stored is not None:
            # the node stored the path: a same-phase move there is complete, one copy per phase is left
            branch, node = ref.last_stored
            state = d.branches.get(branch)
            same = [m for m in state.counted if d.phase(m) is d.phase(node)]
            assert same == [node], (op, state.counted)
        if ref.last_evict is not None:
            node, block, had_host, before = ref.last_evict
            if had_host and op.tier & Tier.HOST:  # E.2 line 20, even while the GPU copy stays
                assert d.count(node, block) == 0, (op, block)
                assert all(block not in d.branches.get(b).counted.get(node, ()) for b in d.branches.ids())
            elif d.index.tiers(node, block) & Tier.HOST:  # host copy kept: count kept
                assert d.count(node, block) == before, (op, block)
        check_invariants(d, ref, op)
    return d


def check_history(history: list[Op], store: BranchStore) -> None:
    loop = asyncio.new_event_loop()
    try:
        d = run_history(history, store, loop)
        # the store holds exactly the agent state: a fresh directory loaded from it has the same counts
        phases, rows = loop.run_until_complete(store.load())
        fresh = Directory(page_size=1)
        fresh.load_agent_state(phases, rows)
        assert fresh.phases() == d.phases()
        for node in d.phases():
            assert fresh.counts.counts(node) == d.counts.counts(node)
        for b in d.branches.ids():
            s, f = d.branches.get(b), fresh.branches.get(b)
            assert (s.version, s.path, s.counted, s.pending) == (f.version, f.path, f.counted, f.pending)
        # after all branches end, every count is zero
        for b in d.branches.ids():
            loop.run_until_complete(store.save(snapshot(d, d.end_branch(b))))
        assert all(d.counts.counts(n) == {} for n in d.phases())
        assert loop.run_until_complete(store.load())[1] == []
    finally:
        loop.close()


@example(
    [
        Op("append", "b0", "p1", (1, 2), store=True, tier=3),
        Op("fork", "b1", "p1", (3,), store=True, tier=3),
        Op("evict", node="p1", index=0, tier=2),  # host copy of block 0 evicted, GPU copy stays
        Op("decode", "b1", "d1", store=True, tier=3),
        Op("switch", node="d1"),  # D -> P: counts on d1 reset
    ]
)
@settings(max_examples=150, deadline=None)
@given(st.lists(ops, max_size=40))
def test_random_histories_memory_store(history: list[Op]) -> None:
    check_history(history, MemoryBranchStore())


def test_versions_follow_prefixes() -> None:
    d = Directory(page_size=1)
    d.register_node("p1", NODES["p1"])
    a = block_hashes([1, 2, 3], 1)
    assert d.resolve(a[:2], "x", 0).observation.version == 1  # type: ignore[union-attr]
    assert d.resolve(a, "x", 1).observation.version == 1  # type: ignore[union-attr]  # append
    assert d.resolve(a, "x", 2).observation.version == 1  # type: ignore[union-attr]  # same prompt
    obs = d.resolve(a[:1], "x", 3).observation  # shorter: not an extension -> rewritten
    assert obs is not None and obs.version == 2 and obs.version_bumped
    assert d.resolve(block_hashes([7], 1), "x", 4).observation.version == 3  # type: ignore[union-attr]
