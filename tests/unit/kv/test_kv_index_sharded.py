"""The sharded prefix index answers exactly as the unsharded one did (``index_unsharded``, frozen before
the change): the same operations, applied to both, give the same answers, return values and errors
after every step. Table-driven scenarios first, then random histories; each with the walk's remembered
runs as they are and remembered from runs of 1 and 2 blocks on."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from index_unsharded import UnshardedIndex

from agentpool.kv import HeldBlock, InvalidEventError, PrefixIndex, Tier, UnknownNodeError, shards
from agentpool.kv.hashing import ROOT_HASH, block_hashes
from agentpool.kv.shards import SHARDS
from agentpool.kv.steps import drain
from agentpool.kv.types import split_blocks

G, H, GH = Tier.GPU, Tier.HOST, Tier.GPU | Tier.HOST
CHAIN = block_hashes(list(range(64 * 40)), 64)  # 40 engine-like (xxh3) hashes
SMALL = list(range(1, 300))  # small ints: every shard, and shard neighbours
ODD = [(h << 1) | 1 for h in CHAIN]  # a low bit that never varies (as the benchmark's hashes)

Op = tuple[Any, ...]


def chained(hashes: list[int], tier: Tier = GH, parent: int = ROOT_HASH) -> list[HeldBlock]:
    return [HeldBlock(h, hashes[i - 1] if i else parent, tier) for i, h in enumerate(hashes)]


def apply(idx: Any, op: Op) -> Any:
    kind, *args = op
    if kind == "store":
        return idx.apply_stored(*args)
    if kind == "remove":
        return idx.remove(*args)
    if kind == "resync":
        return idx.resync(*args)
    if kind == "resync_steps":  # stepwise, with a Resolve between every two steps
        node, blocks, now, queries = args
        steps = idx.resync_steps(node, *split_blocks(blocks), now, step=7)
        first_clear = 2 * -(-len(blocks) // 7)  # the check pass, then the add pass
        seen = []
        while True:
            try:
                next(steps)
            except StopIteration as done:
                # between steps the old blocks are cleared in another order (shard by shard): only the
                # answers before that third pass are the same
                return sorted(done.value[0]), sorted(done.value[1]), len(seen), seen[:first_clear]
            seen.append([idx.longest_prefixes(q) for q in queries])
    if kind == "drop":
        return sorted(idx.drop_node(*args))
    if kind == "drop_steps":
        node, queries = args
        seen = []
        for _ in idx.drop_node_steps(node, step=5):
            seen.append([idx.longest_prefixes(q) for q in queries])
        return seen
    if kind == "touch":
        return idx.touch(*args)
    if kind == "add":
        return idx.add_node(*args)
    raise AssertionError(kind)


def outcome(idx: Any, op: Op) -> tuple[str, Any]:
    try:
        return "ok", apply(idx, op)
    except (InvalidEventError, UnknownNodeError, ValueError) as e:
        return type(e).__name__, str(e)


def state(idx: Any, queries: list[list[int]], probes: list[int]) -> dict[str, Any]:
    """Everything the index answers, in forms where only sharding could differ normalized (the order of
    a node's held blocks, which is now shard by shard)."""
    nodes = idx.nodes()
    return {
        "len": len(idx),
        "nodes": nodes,
        "prefixes": [list(idx.longest_prefixes(q).items()) for q in queries],
        "parents": [idx.parent(h) for h in probes],
        "per_node": {
            n: (
                idx.node_block_count(n),
                sorted((b.block_hash, b.parent_hash, b.tiers) for b in idx.node_blocks(n)),
                sorted(idx.host_access(n).items()),
                [idx.tiers(n, h) for h in probes],
                [idx.last_access(n, h) for h in probes],
                idx.holds_all(n, probes[:5]),
                idx.count_held(n, probes),
            )
            for n in nodes
        },
    }


def run_both(ops: list[Op], queries: list[list[int]], probes: list[int]) -> None:
    old, new = UnshardedIndex(), PrefixIndex()
    for i, op in enumerate(ops):
        assert outcome(new, op) == outcome(old, op), (i, op[0])
        assert state(new, queries, probes) == state(old, queries, probes), (i, op[0])


SCENARIOS: dict[str, list[Op]] = {
    "stores in every tier, then removals": [
        ("store", "a", ROOT_HASH, CHAIN[:20], GH, 1.0),
        ("store", "b", ROOT_HASH, CHAIN[:8], H, 1.0),
        ("store", "b", CHAIN[7], CHAIN[8:30], G, 2.0),
        ("store", "c", CHAIN[0], CHAIN[1:5], G, 2.0),  # never block 0
        ("remove", "a", CHAIN[5:9], G),
        ("remove", "a", [CHAIN[3], CHAIN[3], 12345], H),  # listed twice, and unknown
        ("remove", "b", CHAIN[:30], GH),
        ("touch", "a", CHAIN[:40], 5.0),
    ],
    "host-only write-through (the simulator), re-stores and a GPU copy later": [
        ("store", "s1", ROOT_HASH, SMALL[:100], H, 1.0),
        ("store", "s1", ROOT_HASH, SMALL[:150], H, 2.0),
        ("store", "s2", ROOT_HASH, SMALL[:60], H, 2.0),
        ("store", "s1", SMALL[149], SMALL[150:200], G, 3.0),
        ("store", "s1", ROOT_HASH, SMALL[:10], H, 4.0),
        ("remove", "s1", SMALL[40:160], H),
        ("store", "s1", ROOT_HASH, SMALL[:50], H, 5.0),
    ],
    "bad chains: a conflicting parent mid-chain, a chain repeating blocks, a bad tier": [
        ("store", "a", ROOT_HASH, SMALL[:10], GH, 1.0),
        ("store", "a", ROOT_HASH, [*SMALL[20:25], SMALL[3], *SMALL[30:33]], H, 2.0),
        ("store", "b", ROOT_HASH, [SMALL[50], SMALL[51], SMALL[50], SMALL[51]], G, 2.0),
        ("store", "b", ROOT_HASH, [SMALL[60], SMALL[60]], H, 2.0),
        ("store", "c", ROOT_HASH, [SMALL[70]], Tier(0), 2.0),
        ("store", "c", ROOT_HASH, [], H, 2.0),
        ("remove", "nobody", SMALL[:3], H),
        ("touch", "a", SMALL[:20], 3.0),
    ],
    "resyncs: replace, shrink, tiers change, refusals": [
        ("store", "a", ROOT_HASH, ODD[:30], GH, 1.0),
        ("store", "b", ROOT_HASH, ODD[:12], G, 1.0),
        ("resync", "a", chained(ODD[:10], H) + chained(ODD[20:35], G, ODD[9]), 2.0),
        ("resync", "b", chained(ODD[:5]), 3.0),
        ("resync", "a", chained(ODD[:3])[::-1], 4.0),  # children before parents
        ("resync", "a", chained(ODD[:3]) + chained(ODD[:1]), 4.0),  # a block twice
        ("resync", "a", [HeldBlock(ODD[1], ODD[4], H)], 4.0),  # a known block under another parent
        ("resync", "c", [], 4.0),
        ("resync", "a", [], 5.0),
    ],
    "stepwise resync and purge with Resolves between the steps": [
        ("store", "a", ROOT_HASH, CHAIN[:40], GH, 1.0),
        ("store", "b", ROOT_HASH, CHAIN[:25], H, 1.0),
        ("resync_steps", "a", chained(CHAIN[:15], H) + chained(SMALL[:40], G), 2.0, [CHAIN, SMALL]),
        ("drop_steps", "b", [CHAIN, SMALL]),
        ("store", "c", ROOT_HASH, CHAIN[:10], G, 3.0),  # takes b's freed slot
        ("drop", "a"),
        ("drop", "a"),
    ],
}


@pytest.fixture(params=[shards.MIN_RUN, 1, 2], ids=["runs", "every-run", "runs-of-2"], autouse=True)
def min_run(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The walk's remembered runs (``shards.Runs``) used as they are and from every run of 1 or 2
    blocks on, so that the short chains here exercise them (and their forgetting) too."""
    monkeypatch.setattr(shards, "MIN_RUN", request.param)
    value: int = request.param
    return value


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_sharded_index_answers_as_the_unsharded_one(name: str) -> None:
    queries = [CHAIN, CHAIN[:7], SMALL, SMALL[3:], ODD, ODD[:20] + CHAIN[20:], []]
    probes = [*CHAIN[:12], *SMALL[:12], *ODD[:12], 12345]
    run_both(SCENARIOS[name], queries, probes)


def test_hashes_spread_evenly_over_the_shards() -> None:
    engine = block_hashes(list(range(64 * SHARDS * 100)), 64)
    patterned = ([(h << 1) | 1 for h in engine], [h << 8 for h in engine], list(range(SHARDS * 100)))
    for hashes in (engine, *patterned):
        sizes = [0] * SHARDS
        for h in hashes:
            sizes[h % SHARDS] += 1
        assert min(sizes) >= 60 and max(sizes) <= 140, sizes  # 100 each on average


POOL = SMALL[:12] + CHAIN[:12]
node_ = st.sampled_from(["a", "b", "c"])
tier_ = st.sampled_from([G, H, GH])
span = st.tuples(st.integers(0, len(POOL) - 1), st.integers(1, 8))
op_: st.SearchStrategy[Op] = st.one_of(
    st.builds(lambda n, s, t, now: ("store", n, *_chain(s), t, now), node_, span, tier_, st.integers(0, 9)),
    st.builds(lambda n, s, t: ("remove", n, _pick(s), t), node_, span, tier_),
    st.builds(lambda n, s, t: ("resync", n, chained(_chain(s)[1], t), 7.0), node_, span, tier_),
    st.builds(lambda n, s, now: ("touch", n, _pick(s), now), node_, span, st.integers(0, 9)),
    st.builds(lambda n: ("drop", n), node_),
)


def _pick(s: tuple[int, int]) -> list[int]:
    return POOL[s[0] : s[0] + s[1]]


def _chain(s: tuple[int, int]) -> tuple[int, list[int]]:
    """A parent and a chain under it: either a known chain of ``POOL`` or a fork from its blocks."""
    hashes = _pick(s)
    return (POOL[s[0] - 1] if s[0] else ROOT_HASH), hashes


@settings(max_examples=150, deadline=None)
@given(st.lists(op_, max_size=30))
def test_random_histories_answer_alike(ops: list[Op]) -> None:
    run_both(ops, [POOL, SMALL[:12], CHAIN[:12], POOL[5:]], POOL)


def test_drain_of_the_stepwise_purge_matches_drop() -> None:
    a, b = PrefixIndex(), PrefixIndex()
    for idx in (a, b):
        idx.apply_stored("x", ROOT_HASH, CHAIN, GH, 1.0)
        idx.apply_stored("y", ROOT_HASH, CHAIN[:5], H, 1.0)
    held = a.drop_node("x")
    drain(b.drop_node_steps("x", step=3))
    assert sorted(held) == sorted(CHAIN)
    assert state(a, [CHAIN], CHAIN) == state(b, [CHAIN], CHAIN)
