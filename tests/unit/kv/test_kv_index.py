"""Prefix index: events, tiers, node drop, resync, and the one-walk prefix query against brute force."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_reference import HeldTiers, model_remove, model_store

from agentpool.kv import HeldBlock, InvalidEventError, PrefixIndex, PrefixMatch, Tier, UnknownNodeError
from agentpool.kv.hashing import ROOT_HASH, block_hashes

G, H = Tier.GPU, Tier.HOST


def test_prefixes_by_tier() -> None:
    chain = block_hashes(list(range(64 * 6)), 64)
    idx = PrefixIndex()
    idx.apply_stored("n1", ROOT_HASH, chain[:4], G | H, 1.0)
    idx.apply_stored("n2", ROOT_HASH, chain[:2], H, 1.0)
    idx.apply_stored("n2", chain[1], chain[2:5], G, 1.0)
    idx.apply_stored("n3", chain[0], chain[1:3], G, 1.0)  # never block 0: no prefix at all
    got = idx.longest_prefixes(chain)
    assert got == {"n1": PrefixMatch(4, 4, 4), "n2": PrefixMatch(0, 2, 5)}
    idx.apply_removed("n1", [chain[2]], G)
    assert idx.longest_prefixes(chain)["n1"] == PrefixMatch(2, 4, 4)
    assert idx.apply_removed("n1", [chain[2]], H) == [chain[2]]
    assert idx.longest_prefixes(chain)["n1"] == PrefixMatch(2, 2, 2)
    assert idx.longest_prefixes([]) == {}
    assert idx.longest_prefixes([12345]) == {}


def test_drop_node_reuses_slot_and_removes_empty_entries() -> None:
    chain = block_hashes(list(range(64 * 3)), 64)
    idx = PrefixIndex()
    idx.apply_stored("a", ROOT_HASH, chain, G, 1.0)
    idx.apply_stored("b", ROOT_HASH, chain[:1], G, 1.0)
    assert sorted(idx.drop_node("a")) == sorted(chain)
    assert len(idx) == 1 and idx.nodes() == ["b"]
    idx.apply_stored("c", ROOT_HASH, chain[:2], H, 2.0)  # takes a's freed slot
    assert idx.longest_prefixes(chain) == {"b": PrefixMatch(1, 0, 1), "c": PrefixMatch(0, 2, 2)}
    with pytest.raises(UnknownNodeError):
        idx.apply_removed("a", chain, G)


def test_parent_mismatch_and_bad_tier_are_rejected() -> None:
    idx = PrefixIndex()
    idx.apply_stored("a", ROOT_HASH, [1, 2], G, 0.0)
    with pytest.raises(InvalidEventError):
        idx.apply_stored("a", 7, [2], G, 0.0)
    with pytest.raises(InvalidEventError):
        idx.apply_stored("a", ROOT_HASH, [1], Tier(0), 0.0)


def test_resync_replaces_a_nodes_placement() -> None:
    idx = PrefixIndex()
    idx.apply_stored("a", ROOT_HASH, [1, 2, 3], G, 0.0)
    idx.apply_stored("b", ROOT_HASH, [1], G, 0.0)
    gone = idx.replace_node("a", [HeldBlock(1, ROOT_HASH, H), HeldBlock(9, 1, G | H)], 5.0)
    assert gone == [2, 3]
    assert idx.longest_prefixes([1, 9]) == {"a": PrefixMatch(0, 2, 2), "b": PrefixMatch(1, 0, 1)}
    assert idx.last_access("a", 9) == 5.0
    assert sorted(b.block_hash for b in idx.node_blocks("a")) == [1, 9]
    assert idx.host_blocks("a") == [(1, 5.0), (9, 5.0)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "d"]),
            st.booleans(),  # store or remove
            st.integers(0, 5),  # start block
            st.integers(1, 6),  # length
            st.sampled_from([G, H, G | H]),
        ),
        max_size=40,
    ),
    st.integers(0, 8),
)
def test_one_walk_equals_brute_force(ops: list[tuple[str, bool, int, int, Tier]], qlen: int) -> None:
    chain = list(range(1, 9))  # block i+1's parent is block i; 0 is the root
    idx = PrefixIndex()
    held: HeldTiers = {}
    for node, store, start, length, tier in ops:
        blocks = chain[start : start + length]
        if store:
            idx.apply_stored(node, chain[start - 1] if start else ROOT_HASH, blocks, tier, 0.0)
            model_store(held, node, blocks, tier)
        elif idx.has_node(node):
            idx.apply_removed(node, blocks, tier)
            model_remove(held, node, blocks, tier)
    query = chain[:qlen]

    def run(node: str, ok: Tier | None) -> int:
        n = 0
        for b in query:
            t = held.get((node, b), Tier(0))
            if not (t & ok if ok is not None else t):
                break
            n += 1
        return n

    expect = {}
    for node in {n for n, _ in held}:
        m = PrefixMatch(run(node, G), run(node, H), run(node, None))
        if m.local_blocks:
            expect[node] = m
    assert idx.longest_prefixes(query) == expect
