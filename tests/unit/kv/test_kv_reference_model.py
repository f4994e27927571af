"""The directory core against a brute-force reference written straight from Algorithms E.1/E.2.

The reference (:mod:`kv_reference`) keeps, per branch, its version, path, counted sets per node and
pending moves as plain Python sets, per node its GPU and host blocks, recomputes every count ``R[b, n]``
by summing over branches, settles same-phase moves by checking every pending move after every event and
zeroes a block's counts when its host copy is evicted (E.2 line 20). Both are driven through the same
random histories; after every step the whole agent state must agree, not only the counts.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st
from kv_reference import NODES, Op, Reference, drive, ops

from agentpool.kv import Directory, Tier


# host eviction while the GPU copy stays (E.2 line 20), then a same-phase move and a D->P switch
@example(
    [
        Op("append", "b0", "p1", (1, 2), store=True, tier=3),
        Op("fork", "b1", "p1", (3,), store=True, tier=3),
        Op("evict", node="p1", index=0, tier=2),
        Op("append", "b0", "p2", (4,), store=True, tier=1),
        Op("decode", "b1", "d1", store=True, tier=3),
        Op("switch", node="d1"),
    ]
)
@settings(max_examples=150, deadline=None)
@given(st.lists(ops, max_size=40))
def test_core_matches_reference(history: list[Op]) -> None:
    d, ref = Directory(page_size=1), Reference()
    for n, p in NODES.items():
        d.register_node(n, p)
    for op in drive(history, d, ref):
        for node in NODES:
            assert d.counts.counts(node) == ref.counts(node), (op, node)
            assert d.phase(node) is ref.phase[node]
            held = {b.block_hash: b.tiers for b in d.index.node_blocks(node)}
            assert {h for h, t in held.items() if t & Tier.GPU} == ref.gpu[node]
            assert {h for h, t in held.items() if t & Tier.HOST} == ref.host[node]
        assert sorted(d.branches.ids()) == sorted(ref.branches)
        for name, b in ref.branches.items():
            s = d.branches.get(name)
            assert (s.version, list(s.path)) == (b.version, b.path)
            assert {n: set(c) for n, c in s.counted.items()} == b.counted
            assert {n: (m.version, m.blocks) for n, m in s.pending.items()} == b.moves
