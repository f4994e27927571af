"""The directory core against a brute-force reference written straight from Algorithms E.1/E.2.

The reference keeps, per branch, its version, path and counted sets per node as plain Python sets,
recomputes every count ``R[b, n]`` by summing over branches, and settles same-phase moves by checking
every pending move after every event. Both are driven through the same random histories.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from test_kv_counts_properties import NODES, Op, ops

from agentpool.kv import Directory, Phase, Tier
from agentpool.kv.hashing import ROOT_HASH, block_hashes


@dataclass
class RefBranch:
    version: int
    path: list[int]
    counted: dict[str, set[int]] = field(default_factory=dict)
    moves: dict[str, tuple[int, int]] = field(default_factory=dict)  # target -> (version, blocks)


class Reference:
    def __init__(self) -> None:
        self.phase = dict(NODES)
        self.held: dict[str, set[int]] = {n: set() for n in NODES}
        self.branches: dict[str, RefBranch] = {}

    def counts(self, node: str) -> dict[int, int]:
        c: Counter[int] = Counter()
        for b in self.branches.values():
            c.update(b.counted.get(node, set()))
        return dict(c)

    def count(self, b: RefBranch, node: str, blocks: set[int]) -> None:  # Count(beta, n, pi)
        if blocks:
            b.counted[node] = set(blocks)
        else:
            b.counted.pop(node, None)
            b.moves.pop(node, None)

    def request(self, name: str, path: list[int]) -> None:  # E.1 + E.2 lines 5-8
        b = self.branches.get(name)
        if b is None:
            self.branches[name] = RefBranch(1, path)
            return
        if b.path != path[: len(b.path)]:
            b.version += 1
            for m in list(b.counted):
                self.count(b, m, b.counted[m] & set(path))
        b.path = path

    def place(self, name: str, node: str) -> None:  # E.2 lines 9-12
        b = self.branches[name]
        self.count(b, node, set(b.path))
        for m in list(b.moves):
            if m != node and self.phase[m] == self.phase[node]:
                del b.moves[m]
        if b.path and any(m != node and self.phase[m] == self.phase[node] for m in b.counted):
            b.moves[node] = (b.version, len(b.path))
        else:
            b.moves.pop(node, None)
        self.settle()

    def settle(self) -> None:
        for b in self.branches.values():
            for node, (version, k) in list(b.moves.items()):
                if version != b.version:
                    del b.moves[node]
                elif set(b.path[:k]) <= self.held[node]:
                    del b.moves[node]
                    for m in list(b.counted):
                        if m != node and self.phase[m] == self.phase[node]:
                            self.count(b, m, set())

    def stored(self, node: str, blocks: list[int]) -> None:
        self.held[node] |= set(blocks)
        self.settle()

    def evict(self, node: str, block: int) -> None:
        self.held[node].discard(block)
        for b in self.branches.values():
            if block in b.counted.get(node, set()):
                self.count(b, node, b.counted[node] - {block})

    def switch(self, node: str, phase: Phase) -> None:
        if self.phase[node] is Phase.DECODE and phase is Phase.PREFILL:
            for b in self.branches.values():
                self.count(b, node, set())
        self.phase[node] = phase


@settings(max_examples=150, deadline=None)
@given(st.lists(ops, max_size=40))
def test_core_matches_reference(history: list[Op]) -> None:
    d, ref = Directory(page_size=1), Reference()
    for n, p in NODES.items():
        d.register_node(n, p)
    ctx: dict[str, tuple[int, ...]] = {}
    now = 0.0

    def serve(branch: str, tokens: tuple[int, ...], node: str, stores: bool) -> None:
        path = block_hashes(list(tokens), 1)
        if not path:
            return
        ctx[branch] = tokens
        d.resolve(path, branch, now)
        ref.request(branch, path)
        d.place(branch, node, now)
        ref.place(branch, node)
        if stores:
            d.apply_stored(node, ROOT_HASH, path, Tier.GPU, now)
            ref.stored(node, path)

    for op in history:
        now += 1.0
        if op.kind == "append":
            serve(op.branch, ctx.get(op.branch, ()) + op.tokens, op.node, op.store)
        elif op.kind == "compact":
            serve(op.branch, (*op.tokens[:1], 9, *op.tokens), op.node, op.store)
        elif op.kind == "fork" and ctx and op.branch not in ref.branches:
            parent = sorted(ctx)[op.index % len(ctx)]
            serve(op.branch, ctx[parent] + op.tokens, op.node, op.store)
        elif op.kind == "decode" and op.branch in ref.branches and ref.branches[op.branch].path:
            d.place(op.branch, op.node, now)
            ref.place(op.branch, op.node)
            if op.store:
                d.apply_stored(op.node, ROOT_HASH, ref.branches[op.branch].path, Tier.GPU, now)
                ref.stored(op.node, ref.branches[op.branch].path)
        elif op.kind == "switch":
            new = Phase.DECODE if ref.phase[op.node] is Phase.PREFILL else Phase.PREFILL
            d.switch_phase(op.node, new)
            ref.switch(op.node, new)
        elif op.kind == "evict" and ref.held[op.node]:
            block = sorted(ref.held[op.node])[op.index % len(ref.held[op.node])]
            d.apply_removed(op.node, [block], Tier.GPU)
            ref.evict(op.node, block)
        elif op.kind == "end" and op.branch in ref.branches:
            d.end_branch(op.branch)
            del ref.branches[op.branch]
            ctx.pop(op.branch, None)
        for node in NODES:
            assert d.counts.counts(node) == ref.counts(node), (op, node)
        for name, b in ref.branches.items():
            s = d.branches.get(name)
            assert (s.version, list(s.path)) == (b.version, b.path)
            assert {n: set(c) for n, c in s.counted.items()} == b.counted
