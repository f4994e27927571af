"""Shared by the KV property and reference-model tests: random agent histories and a brute-force
reference of Algorithms E.1/E.2 written straight from the paper, kept only from the history itself.

The reference keeps, per branch, its version, path, counted sets per node and pending same-phase moves
as plain Python sets, per node the blocks it holds in GPU and in host memory, and recomputes every
count ``R[b, n]`` by summing over its own branches. It never reads the directory's state, so counts
compared against it are an independent recount.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from hypothesis import strategies as st

from agentpool.kv import Changes, Directory, Role, Tier
from agentpool.kv.hashing import ROOT_HASH, block_hashes

NODES = {"p1": Role.PREFILL, "p2": Role.PREFILL, "d1": Role.DECODE, "d2": Role.DECODE}
BRANCHES = ["b0", "b1", "b2", "b3"]


@dataclass(frozen=True)
class Op:
    kind: str
    branch: str = ""
    node: str = ""
    tokens: tuple[int, ...] = ()
    store: bool = True
    index: int = 0
    tier: int = 3  # Tier bits of a store or an eviction: 1 GPU, 2 host, 3 both


tokens = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)
tiers = st.sampled_from([1, 2, 3])
branch_ = st.sampled_from(BRANCHES)
node_ = st.sampled_from(list(NODES))
ops = st.one_of(
    st.builds(
        Op, kind=st.just("append"), branch=branch_, node=node_, tokens=tokens, store=st.booleans(), tier=tiers
    ),
    st.builds(
        Op,
        kind=st.just("compact"),
        branch=branch_,
        node=node_,
        tokens=tokens,
        store=st.booleans(),
        tier=tiers,
    ),
    st.builds(
        Op,
        kind=st.just("fork"),
        branch=branch_,
        node=node_,
        tokens=tokens,
        index=st.integers(0, 3),
        store=st.booleans(),
        tier=tiers,
    ),
    st.builds(
        Op,
        kind=st.just("decode"),
        branch=branch_,
        node=st.sampled_from(["d1", "d2"]),
        store=st.booleans(),
        tier=tiers,
    ),
    st.builds(Op, kind=st.just("switch"), node=node_),
    st.builds(Op, kind=st.just("evict"), node=node_, index=st.integers(0, 50), tier=tiers),
    st.builds(Op, kind=st.just("end"), branch=branch_),
)


@dataclass
class RefBranch:
    version: int
    path: list[int]
    counted: dict[str, set[int]] = field(default_factory=dict)
    moves: dict[str, tuple[int, int]] = field(default_factory=dict)  # target -> (version, blocks)


class Reference:
    def __init__(self) -> None:
        self.phase = dict(NODES)
        self.gpu: dict[str, set[int]] = {n: set() for n in NODES}
        self.host: dict[str, set[int]] = {n: set() for n in NODES}
        self.branches: dict[str, RefBranch] = {}
        self.last_evict: tuple[str, int, bool, int] | None = None  # node, block, had host copy, R before
        self.last_stored: tuple[str, str] | None = None  # branch, node: the last op served and stored

    def held(self, node: str) -> set[int]:
        return self.gpu[node] | self.host[node]

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

    def settle(self) -> None:  # line 11: "once n holds version v_beta of beta"
        for b in self.branches.values():
            for node, (version, k) in list(b.moves.items()):
                if version != b.version:
                    del b.moves[node]
                elif set(b.path[:k]) <= self.held(node):
                    del b.moves[node]
                    for m in list(b.counted):
                        if m != node and self.phase[m] == self.phase[node]:
                            self.count(b, m, set())

    def stored(self, node: str, blocks: list[int], tier: Tier) -> None:
        if tier & Tier.GPU:
            self.gpu[node] |= set(blocks)
        if tier & Tier.HOST:
            self.host[node] |= set(blocks)
        self.settle()

    def evict(self, node: str, block: int, tier: Tier) -> None:
        """E.2 line 20: freeing the host copy zeroes the block's counts on the node (a GPU copy may stay);
        so does losing the last copy."""
        if block not in self.held(node):
            return
        had_host = block in self.host[node]
        self.last_evict = (node, block, had_host, self.counts(node).get(block, 0))
        if tier & Tier.GPU:
            self.gpu[node].discard(block)
        if tier & Tier.HOST:
            self.host[node].discard(block)
        if (had_host and block not in self.host[node]) or block not in self.held(node):
            for b in self.branches.values():
                if block in b.counted.get(node, set()):
                    self.count(b, node, b.counted[node] - {block})

    def switch(self, node: str, phase: Role) -> None:
        if self.phase[node] is Role.DECODE and phase is Role.PREFILL:
            for b in self.branches.values():
                self.count(b, node, set())
        self.phase[node] = phase

    def end(self, name: str) -> None:
        del self.branches[name]


def drive(
    history: list[Op], d: Directory, ref: Reference, persist: Callable[[Changes], None] = lambda c: None
) -> Iterator[Op]:
    """Apply ``history`` to the directory ``d`` and to ``ref`` alike; yields after each op."""
    ctx: dict[str, tuple[int, ...]] = {}
    now = 0.0

    def serve(branch: str, tokens: tuple[int, ...], node: str, store: bool, tier: Tier) -> None:
        path = block_hashes(list(tokens), 1)
        if not path:
            return
        ctx[branch] = tokens
        persist(d.resolve(path, branch, now).changes)
        ref.request(branch, path)
        persist(d.place(branch, node, now))
        ref.place(branch, node)
        if store:  # the engine stores the path (prefill or transfer)
            persist(d.apply_stored(node, ROOT_HASH, path, tier, now))
            ref.stored(node, path, tier)
            ref.last_stored = (branch, node)

    for op in history:
        now += 1.0
        ref.last_stored = ref.last_evict = None
        tier = Tier(op.tier)
        if op.kind == "append":
            serve(op.branch, ctx.get(op.branch, ()) + op.tokens, op.node, op.store, tier)
        elif op.kind == "compact":
            serve(op.branch, (*op.tokens[:1], 9, *op.tokens), op.node, op.store, tier)
        elif op.kind == "fork" and ctx and op.branch not in ref.branches:
            parent = sorted(ctx)[op.index % len(ctx)]
            serve(op.branch, ctx[parent] + op.tokens, op.node, op.store, tier)
        elif op.kind == "decode" and op.branch in ref.branches and ref.branches[op.branch].path:
            persist(d.place(op.branch, op.node, now))
            ref.place(op.branch, op.node)
            if op.store:
                path = ref.branches[op.branch].path
                persist(d.apply_stored(op.node, ROOT_HASH, path, tier, now))
                ref.stored(op.node, path, tier)
        elif op.kind == "switch":
            new = Role.DECODE if ref.phase[op.node] is Role.PREFILL else Role.PREFILL
            persist(d.switch_phase(op.node, new))
            ref.switch(op.node, new)
        elif op.kind == "evict" and ref.held(op.node):
            block = sorted(ref.held(op.node))[op.index % len(ref.held(op.node))]
            persist(d.apply_removed(op.node, [block], tier))
            ref.evict(op.node, block, tier)
        elif op.kind == "end" and op.branch in ref.branches:
            persist(d.end_branch(op.branch))
            ref.end(op.branch)
            ctx.pop(op.branch, None)
        yield op


# -- a block-by-block model of which tiers each node holds (index tests) -------------------------
HeldTiers = dict[tuple[str, int], Tier]  # (node, block) -> tiers held, absent when none


def model_store(held: HeldTiers, node: str, blocks: list[int], tier: Tier) -> None:
    for b in blocks:
        held[node, b] = held.get((node, b), Tier(0)) | tier


def model_remove(held: HeldTiers, node: str, blocks: list[int], tier: Tier) -> list[int]:
    """Drop ``tier`` of ``blocks`` on ``node``; returns the blocks the node no longer holds at all."""
    gone = []
    for b in blocks:
        left = held.get((node, b), Tier(0)) & ~tier
        if left:
            held[node, b] = left
        else:
            held.pop((node, b), None)
            gone.append(b)
    return gone
