"""Property tests of the branch counts (E.1/E.2) over random agent histories.

A history mixes requests (append, compaction, fork), placements on prefill and decode nodes (moves),
engine stores, phase switches, evictions and branch ends. After every step:
counts are positive and equal a brute-force recount from the branch rows; every branch counts only
blocks of its current path; a completed same-phase move leaves one counted copy in that phase; and
after all branches end every count is zero. The same histories are persisted through a store and
reloaded into a fresh directory, which must hold the same counts (memory store here; the Redis store
runs the same check in tests/integration/directory).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from agentpool.directory.store import BranchStore, MemoryBranchStore, snapshot
from agentpool.kv import Directory, Phase, Tier
from agentpool.kv.hashing import ROOT_HASH, block_hashes

NODES = {"p1": Phase.PREFILL, "p2": Phase.PREFILL, "d1": Phase.DECODE, "d2": Phase.DECODE}
BRANCHES = ["b0", "b1", "b2", "b3"]


@dataclass(frozen=True)
class Op:
    kind: str
    branch: str = ""
    node: str = ""
    tokens: tuple[int, ...] = ()
    store: bool = True
    index: int = 0


tokens = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)
ops = st.one_of(
    st.builds(
        Op,
        kind=st.just("append"),
        branch=st.sampled_from(BRANCHES),
        node=st.sampled_from(list(NODES)),
        tokens=tokens,
        store=st.booleans(),
    ),
    st.builds(
        Op,
        kind=st.just("compact"),
        branch=st.sampled_from(BRANCHES),
        node=st.sampled_from(list(NODES)),
        tokens=tokens,
        store=st.booleans(),
    ),
    st.builds(
        Op,
        kind=st.just("fork"),
        branch=st.sampled_from(BRANCHES),
        node=st.sampled_from(list(NODES)),
        tokens=tokens,
        index=st.integers(0, 3),
        store=st.booleans(),
    ),
    st.builds(
        Op,
        kind=st.just("decode"),
        branch=st.sampled_from(BRANCHES),
        node=st.sampled_from(["d1", "d2"]),
        store=st.booleans(),
    ),
    st.builds(Op, kind=st.just("switch"), node=st.sampled_from(list(NODES))),
    st.builds(Op, kind=st.just("evict"), node=st.sampled_from(list(NODES)), index=st.integers(0, 50)),
    st.builds(Op, kind=st.just("end"), branch=st.sampled_from(BRANCHES)),
)


def recount(d: Directory) -> dict[str, Counter[int]]:
    out: dict[str, Counter[int]] = {}
    for b in d.branches.ids():
        for node, blocks in d.branches.get(b).counted.items():
            out.setdefault(node, Counter()).update(blocks)
    return out


def check_invariants(d: Directory) -> None:
    expect = recount(d)
    for node in d.phases():
        got = d.counts.counts(node)
        assert all(c > 0 for c in got.values())
        assert got == dict(expect.get(node, Counter()))
    for b in d.branches.ids():
        state = d.branches.get(b)
        path = set(state.path)
        for blocks in state.counted.values():
            assert blocks <= path and blocks


def run_history(history: list[Op], store: BranchStore, loop: asyncio.AbstractEventLoop) -> Directory:
    d = Directory(page_size=1)
    for n, p in NODES.items():
        loop.run_until_complete(store.save(snapshot(d, d.register_node(n, p))))
    contexts: dict[str, tuple[int, ...]] = {}
    now = 0.0

    def persist(changes: object) -> None:
        loop.run_until_complete(store.save(snapshot(d, changes)))  # type: ignore[arg-type]

    def serve(branch: str, ctx: tuple[int, ...], node: str, stores: bool) -> None:
        nonlocal now
        now += 1.0
        path = block_hashes(list(ctx), 1)
        if not path:
            return
        contexts[branch] = ctx
        persist(d.resolve(path, branch, now).changes)
        persist(d.place(branch, node, now))
        if stores:  # the engine stores the path (prefill or transfer): a same-phase move completes
            persist(d.apply_stored(node, ROOT_HASH, path, Tier.GPU | Tier.HOST, now))
            state = d.branches.get(branch)
            same = [m for m in state.counted if d.phase(m) is d.phase(node)]
            assert same == [node], (branch, node, state.counted)

    for op in history:
        if op.kind == "append":
            serve(op.branch, contexts.get(op.branch, ()) + op.tokens, op.node, op.store)
        elif op.kind == "compact":
            serve(op.branch, (*op.tokens[:1], 9, *op.tokens), op.node, op.store)
        elif op.kind == "fork":
            parents = sorted(contexts)
            if parents and op.branch not in d.branches:
                parent = parents[op.index % len(parents)]
                serve(op.branch, contexts[parent] + op.tokens, op.node, op.store)
        elif op.kind == "decode":
            if op.branch in d.branches and d.branches.get(op.branch).path:
                now += 0.5
                state = d.branches.get(op.branch)
                persist(d.place(op.branch, op.node, now))
                if op.store:
                    persist(d.apply_stored(op.node, ROOT_HASH, state.path, Tier.GPU, now))
        elif op.kind == "switch":
            new = Phase.DECODE if d.phase(op.node) is Phase.PREFILL else Phase.PREFILL
            persist(d.switch_phase(op.node, new))
        elif op.kind == "evict":
            held = sorted(b.block_hash for b in d.index.node_blocks(op.node))
            if held:
                persist(d.apply_removed(op.node, [held[op.index % len(held)]], Tier.GPU | Tier.HOST))
        elif op.kind == "end" and op.branch in d.branches:
            persist(d.end_branch(op.branch))
            contexts.pop(op.branch, None)
        check_invariants(d)
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


@settings(max_examples=150, deadline=None)
@given(st.lists(ops, max_size=40))
def test_random_histories_memory_store(history: list[Op]) -> None:
    check_history(history, MemoryBranchStore())


def test_versions_follow_prefixes() -> None:
    d = Directory(page_size=1)
    d.register_node("p1", Phase.PREFILL)
    a = block_hashes([1, 2, 3], 1)
    assert d.resolve(a[:2], "x", 0).observation.version == 1  # type: ignore[union-attr]
    assert d.resolve(a, "x", 1).observation.version == 1  # type: ignore[union-attr]  # append
    assert d.resolve(a, "x", 2).observation.version == 1  # type: ignore[union-attr]  # same prompt
    obs = d.resolve(a[:1], "x", 3).observation  # shorter: not an extension -> rewritten
    assert obs is not None and obs.version == 2 and obs.version_bumped
    assert d.resolve(block_hashes([7], 1), "x", 4).observation.version == 3  # type: ignore[union-attr]
