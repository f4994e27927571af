"""Stepwise resync and purge (the service runs them between other RPCs): the same end state as at once,
sane answers between steps, and bad lists refused before anything changes."""

from __future__ import annotations

import pytest

from agentpool.kv import ROOT_HASH, Directory, HeldBlock, InvalidEventError, Role, Tier
from agentpool.kv.types import split_blocks

GH, G, H = Tier.GPU | Tier.HOST, Tier.GPU, Tier.HOST


def chain(n: int, start: int, tier: Tier = GH) -> list[HeldBlock]:
    hs = [start + i for i in range(n)]
    return [HeldBlock(h, hs[i - 1] if i else ROOT_HASH, tier) for i, h in enumerate(hs)]


def setup() -> Directory:
    d = Directory(page_size=1)
    for n in ("a", "b"):
        d.register_node(n, Role.PREFILL)
    d.resync_node("a", chain(2000, 1), 0.0)
    d.resync_node("b", chain(1000, 1, H), 0.0)
    d.observe("x", list(range(1, 11)), 0.0)
    d.place("x", "a", 0.0)
    return d


def test_a_stepwise_resync_ends_where_one_at_once_ends_and_answers_stay_sane() -> None:
    new = chain(600, 1, H) + chain(3000, 10_000)  # a's GPU copies of 1..600 gone, 601.. gone, new ones
    at_once, stepwise = setup(), setup()
    expected = at_once.resync_node("a", new, 1.0)
    steps = stepwise.resync_node_steps("a", *split_blocks(new), 1.0)
    answers = []
    while True:
        try:
            next(steps)
        except StopIteration as done:
            changes = done.value
            break
        answers.append(stepwise.index.longest_prefixes(list(range(1, 2001)))["a"].local_blocks)
    assert len(answers) > 10 and all(600 <= a <= 2000 for a in answers)  # old, new or both: never less
    assert changes == expected
    assert stepwise.index.longest_prefixes(list(range(1, 2001))) == at_once.index.longest_prefixes(
        list(range(1, 2001))
    )
    assert sorted(stepwise.index.node_blocks("a"), key=lambda b: b.block_hash) == sorted(
        at_once.index.node_blocks("a"), key=lambda b: b.block_hash
    )
    assert stepwise.count("a", 5) == 1 and stepwise.count("a", 700) == 0 == at_once.count("a", 700)


def test_a_purged_node_leaves_every_answer_at_once_and_its_slot_waits() -> None:
    d = setup()
    steps = d.drop_node_steps("a")
    next(steps)  # the first step: the node is gone from answers, phases and counts
    assert not d.has_node("a") and set(d.index.longest_prefixes([1, 2, 3])) == {"b"}
    assert d.count("a", 1) == 0
    d.register_node("c", Role.PREFILL)  # a node registered meanwhile gets another slot
    d.resync_node("c", chain(5, 1), 2.0)
    for _ in steps:
        assert set(d.index.longest_prefixes([1, 2, 3])) == {"b", "c"}
    assert set(d.index.longest_prefixes([1, 2, 3])) == {"b", "c"}
    assert len(d.index) == 1000  # 1..1000 (b, and c's first five): a's others are gone


@pytest.mark.parametrize(
    ("blocks", "reason"),
    [
        ([HeldBlock(1, ROOT_HASH, GH), HeldBlock(1, ROOT_HASH, GH)], "listed twice"),
        ([HeldBlock(90_001, 90_000, GH), HeldBlock(90_000, ROOT_HASH, GH)], "comes before its parent"),
        ([HeldBlock(2, 99, GH)], "parent"),  # 2 is known under parent 1
    ],
)
def test_bad_lists_are_refused_before_anything_changes(blocks: list[HeldBlock], reason: str) -> None:
    d = setup()
    before = sorted(d.index.node_blocks("a"), key=lambda b: b.block_hash)
    with pytest.raises(InvalidEventError, match=reason):
        d.resync_node("a", blocks, 1.0)
    assert sorted(d.index.node_blocks("a"), key=lambda b: b.block_hash) == before
