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


def many_branches(n: int) -> Directory:
    """``n`` branches counting on node a (some also on b), a few with a move to a pending."""
    d = setup()
    for i in range(n):
        d.observe(f"br-{i}", list(range(1 + i % 7, 12 + i % 7)), 0.0)
        d.place(f"br-{i}", "a", 0.0)
        if i % 3 == 0:
            d.place(f"br-{i}", "b", 0.0)
    for i in range(5):  # a path a does not hold: placed on b, then on a, the move to a waits
        d.observe(f"mv-{i}", [50_000 + i, 60_000 + i], 0.0)
        d.place(f"mv-{i}", "b", 0.0)
        d.place(f"mv-{i}", "a", 0.0)
    return d


def meanwhile(d: Directory) -> None:
    """What other RPCs do while a is being purged (each its own step)."""
    d.observe("br-1", [1, 2, 3, 900], 1.0)  # a version bump: E.1 releases what left the path (a too)
    d.end_branch("br-2")
    d.place("br-4", "b", 1.0)
    d.observe("mv-1", [50_001, 60_001], 1.0)
    d.place("mv-1", "b", 1.0)


def state_of(d: Directory) -> object:
    rows = {
        b: (s.version, tuple(s.path), dict(s.counted), dict(s.pending))
        for b in sorted(d.branches.ids())
        if (s := d.branches.find(b)) is not None
    }
    counts = {n: (d.counts.counts(n), sorted(d.counts.counting(n))) for n in ("a", "b")}
    return rows, counts


@pytest.mark.parametrize("register_again", [False, True])
def test_a_purge_releases_counts_in_steps_and_ends_where_one_at_once_ends(register_again: bool) -> None:
    """Branch sets on a purged node are cleared in steps; whatever runs between the steps, the end state
    is the one of the purge at once followed by the same operations."""
    at_once, stepwise = many_branches(10_000), many_branches(10_000)
    expected = at_once.drop_node("a")
    meanwhile(at_once)
    if register_again:
        at_once.register_node("a", Role.PREFILL)
        at_once.place("br-5", "a", 2.0)
    steps = stepwise.drop_node_steps("a")
    next(steps)
    assert stepwise.count("a", 2) == 0 and not stepwise.counts.counting("a")  # counts gone at once
    assert all("a" in stepwise.branches.get(f"br-{i}").counted for i in (1, 2, 4))  # sets not cleared yet
    meanwhile(stepwise)
    if register_again:
        stepwise.register_node("a", Role.PREFILL)  # finishes the release first
        stepwise.place("br-5", "a", 2.0)
    next(steps)
    n = 2
    while True:
        try:
            next(steps)
        except StopIteration as done:
            changes = done.value
            break
        n += 1
    assert n >= (3 if register_again else 4)  # 6,672 branches on a: steps of 4,096, then the index's
    assert state_of(stepwise) == state_of(at_once)
    assert changes == expected and len(changes.branches) == 6_672 and "a" not in changes.counts


def test_a_purged_node_is_never_counted_again_until_it_registers() -> None:
    d = many_branches(10)
    steps = d.drop_node_steps("a")
    next(steps)
    assert "a" in d.branches.get("br-1").counted
    d.observe("br-1", [2, 3, 4], 1.0)  # a version bump on a branch whose set on a is not cleared yet
    assert d.counts.counts("a") == {} and "a" not in d.branches.get("br-1").counted
    for _ in steps:
        pass
    assert all("a" not in d.branches.get(b).counted for b in d.branches.ids())
