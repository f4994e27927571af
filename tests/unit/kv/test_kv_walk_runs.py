"""The walk's remembered runs (``shards.Runs``) never change an answer: random histories of stores,
removals, stepwise resyncs and purges on one chain, with Resolves after every operation and between
every two steps, answered as a block-by-block count of each node's tiers says (runs remembered from
every length on, so that all of them are used and forgotten)."""

from __future__ import annotations

import random

import pytest

from agentpool.kv import PrefixIndex, PrefixMatch, Tier, shards
from agentpool.kv.hashing import ROOT_HASH, block_hashes

CHAIN = block_hashes(list(range(64 * 40)), 64)
NODES = ["a", "b", "c", "d", "e"]
TIERS = (Tier.GPU, Tier.HOST, Tier.GPU | Tier.HOST)


def counted(idx: PrefixIndex, query: list[int]) -> dict[str, PrefixMatch]:
    """Per node: its leading blocks of ``query`` in GPU, in host, in either, one block at a time."""
    out = {}
    for node in idx.nodes():
        depths = []
        for want in (Tier.GPU, Tier.HOST, Tier.GPU | Tier.HOST):
            d = 0
            while d < len(query) and idx.tiers(node, query[d]) & want:
                d += 1
            depths.append(d)
        if depths[2]:
            out[node] = PrefixMatch(*depths)
    return out


def check(idx: PrefixIndex, rng: random.Random) -> None:
    k = rng.randint(0, len(CHAIN))
    for query in (CHAIN, CHAIN[k:]):
        assert idx.longest_prefixes(query) == counted(idx, query)


@pytest.mark.parametrize("tiers", [TIERS, (Tier.HOST,)], ids=["mixed", "host-only (the simulator's)"])
@pytest.mark.parametrize("seed", range(8))
def test_remembered_runs_never_change_an_answer(
    seed: int, tiers: tuple[Tier, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shards, "MIN_RUN", 1)
    rng = random.Random(seed)
    idx = PrefixIndex()
    for _ in range(60):
        node = rng.choice(NODES)
        kind = rng.choice(["store", "store", "remove", "resync", "drop"])
        if kind == "store":
            start = rng.randint(0, len(CHAIN) - 1)
            if start and not idx.has_node(node):
                start = 0
            end = rng.randint(start + 1, len(CHAIN))
            idx.apply_stored(
                node, CHAIN[start - 1] if start else ROOT_HASH, CHAIN[start:end], rng.choice(tiers), 1.0
            )
        elif kind == "remove" and idx.has_node(node):
            idx.remove(node, rng.sample(CHAIN, rng.randint(1, 12)), rng.choice(tiers))
        elif kind == "resync":
            depth = rng.randint(0, len(CHAIN))
            held_tiers = [int(rng.choice(tiers)) for _ in range(depth)]
            parents = [ROOT_HASH, *CHAIN[: max(0, depth - 1)]][:depth]
            steps = idx.resync_steps(node, CHAIN[:depth], parents, held_tiers, 2.0, step=5)
            for _ in steps:
                check(idx, rng)
        elif kind == "drop" and idx.has_node(node):
            for _ in idx.drop_node_steps(node, step=5):
                check(idx, rng)
        check(idx, rng)
