"""Fast paths of the KV cores against their general forms.

``eviction_order_counted`` (a count table; pairs or a mapping; numpy for 64-bit hashes, tuples for any
other; with a limit, only the blocks that can come first are sorted) must give exactly
:func:`eviction_order` with a count callback, and ``eviction_hashes_counted`` its hashes;
``Directory.eviction_order`` (the index's live host table) must equal it on the node's host blocks.
Host-only stores on a node whose blocks all have a host copy skip the bit update for held blocks;
mixed with GPU stores, removals and touches they must leave the tiers and access times of a
block-by-block model.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kv_reference import HeldTiers, model_remove, model_store

from agentpool.kv import Directory, HeldBlock, PrefixIndex, Role, Tier
from agentpool.kv.eviction import (
    eviction_hashes_counted,
    eviction_order,
    eviction_order_counted,
    eviction_pick,
)
from agentpool.kv.hashing import ROOT_HASH
from agentpool.kv.shards import SHARDS
from agentpool.kv.types import InvalidEventError

hashes = st.integers(min_value=0, max_value=40) | st.sampled_from(
    [2**64 - 1, 2**63, 2**64, -1]
)  # numpy or not
times = st.sampled_from([0.0, 1.0, 2.0, 3.0])  # few values: ties on time break by hash


@settings(max_examples=600, deadline=None)
@given(
    st.dictionaries(hashes, times, max_size=30),
    st.dictionaries(hashes, st.integers(min_value=1, max_value=3), max_size=30),
    st.none() | st.integers(min_value=-5, max_value=35),
)
def test_counted_order_matches_general(
    host: dict[int, float], counted: dict[int, int], limit: int | None
) -> None:
    want = eviction_order(list(host.items()), lambda h: counted.get(h, 0), limit)
    assert eviction_order_counted(list(host.items()), counted, limit) == want
    assert eviction_order_counted(host, counted, limit) == want
    assert eviction_order_counted(iter(list(host.items())), counted, limit) == want
    assert eviction_hashes_counted(host, counted, limit) == [c.block_hash for c in want]
    assert eviction_pick(host, counted, limit) == (
        [c.block_hash for c in want],
        not any(c.count for c in want),
    )


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_partial_order_matches_general_when_most_blocks_are_counted(data: st.DataObject) -> None:
    """Counted blocks drawn from the host blocks, so the zero-count group is often shorter than the
    limit and the counted group is cut at a tied access time."""
    host = data.draw(st.dictionaries(st.integers(min_value=0, max_value=2**64 - 1), times, max_size=40))
    keys = sorted(host)
    counted = dict.fromkeys(data.draw(st.lists(st.sampled_from(keys), unique=True)) if keys else [], 1)
    limit = data.draw(st.integers(min_value=0, max_value=len(host) + 1))
    want = eviction_order(list(host.items()), lambda h: counted.get(h, 0), limit)
    assert eviction_order_counted(host, counted, limit) == want
    assert eviction_hashes_counted(host, counted, limit) == [c.block_hash for c in want]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_partial_order_of_hundreds_of_blocks_on_few_times_matches_general(data: st.DataObject) -> None:
    """Hundreds of blocks on few access times, any share of them counted: the order (ties at the
    cut) and whether the blocks picked are all uncounted must be the general order's."""
    n = data.draw(st.integers(min_value=1, max_value=300))
    stamps = data.draw(st.lists(times, min_size=1, max_size=4))
    which = data.draw(st.lists(st.integers(min_value=0, max_value=len(stamps) - 1), min_size=n, max_size=n))
    host = {h: stamps[i] for h, i in enumerate(which)}
    share = data.draw(st.floats(min_value=0.0, max_value=1.0))
    counted = {h: 1 for h in range(n) if (h * 7919 % 1000) / 1000 < share}
    limit = data.draw(st.integers(min_value=0, max_value=n + 1))
    want = eviction_order(list(host.items()), lambda h: counted.get(h, 0), limit)
    assert eviction_hashes_counted(host, counted, limit) == [c.block_hash for c in want]
    assert eviction_pick(host, counted, limit) == (
        [c.block_hash for c in want],
        not any(c.count for c in want),
    )


ops = st.lists(
    st.tuples(
        st.sampled_from(["store", "remove", "touch"]),
        st.sampled_from(["a", "b"]),
        st.integers(min_value=0, max_value=6),  # chain start
        st.integers(min_value=1, max_value=6),  # chain length
        st.sampled_from([Tier.HOST, Tier.GPU, Tier.GPU | Tier.HOST]),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_host_store_fast_path_matches_a_model(history: list[tuple[str, str, int, int, Tier]]) -> None:
    """Index state after stores (host-only ones take the fast path), removals and touches equals a
    block-by-block model of tiers and access times."""
    chain = list(range(100, 112))
    idx = PrefixIndex()
    tiers: HeldTiers = {}
    access: dict[tuple[str, int], float] = {}
    for step, (op, node, start, n, tier) in enumerate(history):
        blocks = chain[start : start + n]
        now = float(step)
        if op == "store":
            idx.apply_stored(node, chain[start - 1] if start else ROOT_HASH, blocks, tier, now)
            model_store(tiers, node, blocks, tier)
            for h in blocks:
                access[node, h] = now
        elif op == "remove" and idx.has_node(node):
            idx.apply_removed(node, blocks, tier)
            for h in model_remove(tiers, node, blocks, tier):
                access.pop((node, h), None)
        elif op == "touch" and idx.has_node(node):
            idx.touch(node, blocks, now)
            for h in blocks:
                if (node, h) in access:
                    access[node, h] = now
        for m in ("a", "b"):
            if idx.has_node(m):
                got = {b.block_hash: b.tiers for b in idx.node_blocks(m)}
                assert got == {h: t for (k, h), t in tiers.items() if k == m}
                host = {h: t for (k, h), t in access.items() if k == m and tiers[k, h] & Tier.HOST}
                assert dict(idx.host_access(m)) == host
                assert dict(idx.host_blocks(m)) == host


def test_directory_eviction_order_uses_live_host_view() -> None:
    d = Directory(page_size=1)
    d.register_node("p", Role.PREFILL)
    d.apply_stored("p", ROOT_HASH, [1, 2, 3], Tier.HOST, 1.0)
    d.apply_stored("p", 3, [4, 5], Tier.GPU | Tier.HOST, 2.0)
    d.resolve([1, 2, 3, 4], "x", 3.0)
    d.place("x", "p", 3.0)
    d.apply_stored("p", 5, [6], Tier.GPU, 4.0)  # GPU only: the node's host view is filtered now
    want = eviction_order_counted(d.index.host_blocks("p"), d.counts.counts("p"))
    assert d.eviction_order("p") == want
    assert [c.block_hash for c in want] == [5, 1, 2, 3, 4]
    assert d.eviction_hashes("p") == [5, 1, 2, 3, 4]
    assert d.eviction_hashes("p", limit=2) == [5, 1]
    assert [c.count for c in want] == [0, 1, 1, 1, 1]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=12),
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=3), st.integers(min_value=1, max_value=12)), max_size=6
    ),
    st.integers(min_value=0, max_value=14),
)
def test_directory_evict_host_is_the_order_then_the_removal(
    stores: list[int], places: list[tuple[int, int]], limit: int
) -> None:
    """``evict_host`` leaves the directory as ``eviction_hashes`` then ``apply_removed`` does (counts
    cleared where a counted block goes), whether or not the blocks it picks are counted."""

    def build() -> Directory:
        d = Directory(page_size=1)
        d.register_node("p", Role.PREFILL)
        for t, n in enumerate(stores):  # chains of n blocks under one root, at times 0, 1, ...
            d.apply_stored("p", ROOT_HASH, list(range(1, n + 1)), Tier.HOST, float(t))
        for b, n in places:  # branch b counts the chain's first n blocks
            d.resolve(list(range(1, n + 1)), f"b{b}", 100.0)
            d.place(f"b{b}", "p", 100.0)
        return d

    a, b = build(), build()
    want = a.eviction_hashes("p", limit=limit)
    want_changes = a.apply_removed("p", want, Tier.HOST)
    got, changes = b.evict_host("p", limit)
    assert got == want
    assert changes == want_changes
    assert b.counts.counts("p") == a.counts.counts("p")
    assert list(b.index.host_blocks("p")) == list(a.index.host_blocks("p"))
    for beta in {f"b{x}" for x, _ in places}:
        assert b.branches.get(beta).counted == a.branches.get(beta).counted


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=69), st.integers(min_value=0, max_value=7)), max_size=40
    ),
    st.lists(st.integers(min_value=0, max_value=7), max_size=3),
    st.integers(min_value=0, max_value=8),
)
def test_host_only_prefixes_match_general_walk(
    stores: list[tuple[int, int]], removals: list[int], qlen: int
) -> None:
    """Without GPU copies the query takes the host-only walk; one GPU block of an unrelated chain on an
    extra node forces the general walk over the same placements. Over 70 nodes, so bit sets pass 64."""
    chain = list(range(1000, 1008))
    host_only, general = PrefixIndex(), PrefixIndex()
    general.apply_stored("gpu-node", ROOT_HASH, [5], Tier.GPU, 0.0)
    for node, upto in stores:
        for idx in (host_only, general):
            idx.apply_stored(f"n{node}", ROOT_HASH, chain[: upto + 1], Tier.HOST, 1.0)
    for i, block in enumerate(removals):
        node = f"n{stores[i][0]}" if i < len(stores) else "n0"
        for idx in (host_only, general):
            if idx.has_node(node):
                idx.apply_removed(node, [chain[block]], Tier.HOST)
    got = host_only.longest_prefixes(chain[:qlen])
    want = general.longest_prefixes(chain[:qlen])
    assert list(got.items()) == list(want.items())  # the same order too


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.integers(min_value=0, max_value=5),  # parent
            st.lists(st.integers(min_value=1, max_value=6), max_size=5),  # may repeat, may contradict
        ),
        max_size=25,
    )
)
def test_host_chain_store_matches_block_by_block_links(events: list[tuple[str, int, list[int]]]) -> None:
    """Host-only stores (the fast path) of arbitrary chains, with repeated blocks and blocks known under
    another parent, leave the links, placements and access times of a block-by-block model, and raise
    where it raises, with the blocks before the conflict applied."""
    idx = PrefixIndex()
    parent_of: dict[int, int] = {}
    access: dict[tuple[str, int], float] = {}
    for step, (node, parent, chain) in enumerate(events):
        now = float(step)
        want_error = False
        prev = parent
        for h in chain:
            if parent_of.setdefault(h, prev) != prev:
                want_error = True
                break
            access[node, h] = now
            prev = h
        try:
            idx.apply_stored(node, parent, chain, Tier.HOST, now)
        except InvalidEventError:
            assert want_error
        else:
            assert not want_error
        for m in ("a", "b"):
            if idx.has_node(m):
                blocks = {b.block_hash: (b.parent_hash, b.tiers) for b in idx.node_blocks(m)}
                want = {h: (parent_of[h], Tier.HOST) for (k, h) in access if k == m}
                assert blocks == want
                assert dict(idx.host_access(m)) == {h: t for (k, h), t in access.items() if k == m}


def test_a_run_of_blocks_with_the_same_holders_shares_one_holder_int() -> None:
    """Stores, resyncs and purges reuse the holders int of the block before when they are the same, so
    a walk along a shared prefix mostly compares identity (``shards.walk``): each operation leaves one
    int object per run of equal holders it wrote (the old index: one per block)."""
    chain = [(i * 7919) << 40 | 1 for i in range(1, 601)]
    d = Directory()
    for n in ("w", "x", "y", "z"):  # a, b and c get slots 4-6: their holder ints are not small ints
        d.register_node(n, Role.PREFILL)
        d.apply_stored(n, ROOT_HASH, [n.encode()[0]], Tier.GPU, 1.0)
    for n, depth in (("a", 600), ("b", 400), ("c", 200)):
        d.register_node(n, Role.PREFILL)
        d.apply_stored(n, ROOT_HASH, chain[:depth], Tier.GPU, 1.0)

    def objects() -> int:
        return len({id(d.index._hold[h % SHARDS][h]) for h in chain})

    assert objects() == 3  # a, b, c / a, b / a
    held = [HeldBlock(h, chain[i - 1] if i else ROOT_HASH, Tier.HOST) for i, h in enumerate(chain[:300])]
    d.resync_node("b", held, 2.0)
    assert objects() == 4  # one per run the resync wrote (a, b host, c / a, b host / a), and a's
    d.drop_node("c")
    assert objects() == 4  # the purge rewrote blocks 0-199: a, b host
    assert {n: m.local_blocks for n, m in d.index.longest_prefixes(chain).items()} == {"a": 600, "b": 300}
    assert d.index._slot_of["a"] == 4
