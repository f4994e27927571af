"""The four scenarios of Figure 4 (evolving-infra §4.3): counts per block and node after each step."""

from __future__ import annotations

from agentpool.kv import Directory, HeldBlock, Role, Tier

# Blocks: S is the shared system prompt; A*, B* belong to branches 1 and 2; K is branch 1's compaction.
S, A1, A2, B1, K = 0x51, 0xA1, 0xA2, 0xB1, 0x4B


def _serve(d: Directory, branch: str, path: list[int], node: str, now: float) -> None:
    """One request: resolve (E.1), place (E.2), then the node's engine stores the path (prefill/transfer)."""
    d.resolve(path, branch, now)
    d.place(branch, node, now)
    d.apply_stored(node, 0, path, Tier.GPU | Tier.HOST, now)


def _pool(*nodes: tuple[str, Role]) -> Directory:
    d = Directory(page_size=4)
    for n, p in nodes:
        d.register_node(n, p)
    return d


def _r(d: Directory, node: str, *blocks: int) -> list[int]:
    return [d.count(node, b) for b in blocks]


def test_a_consecutive_request_counts_only_its_new_block() -> None:
    d = _pool(("P1", Role.PREFILL))
    _serve(d, "b1", [S, A1], "P1", 1.0)
    _serve(d, "b2", [S, B1], "P1", 2.0)
    assert _r(d, "P1", S, A1, B1) == [2, 1, 1]
    _serve(d, "b1", [S, A1, A2], "P1", 3.0)  # appends A2
    assert _r(d, "P1", S, A1, A2, B1) == [2, 1, 1, 1]
    assert d.branches.get("b1").version == 1


def test_b_compaction_bumps_the_version_and_drops_old_history() -> None:
    d = _pool(("P1", Role.PREFILL))
    _serve(d, "b1", [S, A1, A2], "P1", 1.0)
    _serve(d, "b2", [S, B1], "P1", 2.0)
    res = d.resolve([S, K], "b1", 3.0)  # context rewritten: S + summary K
    assert res.observation is not None and res.observation.version == 2 and res.observation.version_bumped
    assert res.observation.old_path == (S, A1, A2)
    assert _r(d, "P1", A1, A2) == [0, 0]  # dashed in the figure
    d.place("b1", "P1", 3.0)
    assert _r(d, "P1", S, K, A1, A2, B1) == [2, 1, 0, 0, 1]


def test_c_same_phase_move_releases_the_source_once_the_target_holds_the_version() -> None:
    d = _pool(("P1", Role.PREFILL), ("P2", Role.PREFILL))
    _serve(d, "b1", [S, A1], "P1", 1.0)
    _serve(d, "b2", [S, B1], "P1", 2.0)
    d.resolve([S, A1, A2], "b1", 3.0)
    d.place("b1", "P2", 3.0)
    # P2 counts branch 1 at once; P1 keeps its counts until P2 holds the current version.
    assert _r(d, "P2", S, A1, A2) == [1, 1, 1]
    assert _r(d, "P1", S, A1) == [2, 1]
    d.apply_stored("P2", 0, [S, A1], Tier.GPU, 3.5)  # fetched from P1's host memory
    assert _r(d, "P1", S, A1) == [2, 1]  # A2 not there yet
    d.apply_stored("P2", A1, [A2], Tier.GPU, 4.0)  # prefill of the new block
    assert _r(d, "P1", S, A1, B1) == [1, 0, 1]
    assert _r(d, "P2", S, A1, A2) == [1, 1, 1]
    assert d.branches.get("b1").nodes == {"P2"}


def test_d_cross_phase_transfers_keep_counts_on_both_nodes() -> None:
    d = _pool(("P1", Role.PREFILL), ("D1", Role.DECODE))
    _serve(d, "b1", [S, A1], "P1", 1.0)
    _serve(d, "b2", [S, B1], "P1", 2.0)
    d.place("b1", "D1", 2.5)  # decode binding: P2D transfer of S, A1
    d.apply_stored("D1", 0, [S, A1], Tier.GPU, 2.5)
    assert _r(d, "P1", S, A1) == [2, 1]
    assert _r(d, "D1", S, A1) == [1, 1]
    # next step: P1 prefills only the new block A2 (D2P sends back the decoded tokens' KV) ...
    _serve(d, "b1", [S, A1, A2], "P1", 3.0)
    d.place("b1", "D1", 3.5)
    d.apply_stored("D1", A1, [A2], Tier.GPU, 3.5)  # ... and P2D sends only A2
    assert _r(d, "P1", S, A1, A2) == [2, 1, 1]
    assert _r(d, "D1", S, A1, A2) == [1, 1, 1]
    assert d.branches.get("b1").nodes == {"P1", "D1"}


def test_branch_end_and_phase_switches() -> None:
    d = _pool(("P1", Role.PREFILL), ("D1", Role.DECODE))
    _serve(d, "b1", [S, A1], "P1", 1.0)
    d.place("b1", "D1", 1.5)
    _serve(d, "b2", [S, B1], "P1", 2.0)
    d.place("b2", "D1", 2.5)
    d.switch_phase("P1", Role.DECODE)  # P -> D keeps the counts
    assert _r(d, "P1", S, A1, B1) == [2, 1, 1]
    d.switch_phase("D1", Role.PREFILL)  # D -> P resets them
    assert d.counts.counts("D1") == {}
    d.end_branch("b1")
    assert _r(d, "P1", S, A1, B1) == [1, 0, 1]
    d.end_branch("b2")
    assert d.counts.counts("P1") == {} and len(d.branches) == 0


def test_eviction_zeroes_counts_and_order_puts_zero_counts_first() -> None:
    d = _pool(("P1", Role.PREFILL))
    _serve(d, "b1", [S, A1], "P1", 1.0)
    _serve(d, "b2", [S, B1], "P1", 2.0)
    d.resolve([S, K], "b1", 3.0)  # compaction: A1 drops to zero
    d.place("b1", "P1", 3.0)
    d.apply_stored("P1", S, [K], Tier.HOST, 3.5)
    order = [c.block_hash for c in d.eviction_order("P1")]
    assert order == [A1, B1, S, K]  # zero count first; then LRU among counted (B1@2, S@3 touched, K@3.5)
    d.apply_removed("P1", [B1], Tier.GPU)  # the GPU copy goes, the host copy stays: count kept
    assert d.count("P1", B1) == 1
    d.apply_removed("P1", [B1], Tier.HOST)  # host copy evicted (E.2 line 20): count zeroed
    assert d.count("P1", B1) == 0
    assert d.branches.get("b2").counted["P1"] == {S}


def test_host_eviction_zeroes_counts_while_the_gpu_copy_stays() -> None:
    """E.2 line 20: freeing the host copy of b on n removes b from every C[beta, n] and sets R = 0; the
    rule is about the host copy, so a GPU copy of the block on the node does not keep the count."""
    d = _pool(("P1", Role.PREFILL))
    _serve(d, "b1", [S, A1], "P1", 1.0)
    _serve(d, "b2", [S, B1], "P1", 2.0)
    assert _r(d, "P1", S, A1, B1) == [2, 1, 1]
    d.apply_removed("P1", [S], Tier.HOST)
    assert d.index.tiers("P1", S) == Tier.GPU  # still in GPU memory
    assert _r(d, "P1", S, A1, B1) == [0, 1, 1]
    assert d.branches.get("b1").counted["P1"] == {A1}
    assert d.branches.get("b2").counted["P1"] == {B1}
    d.apply_removed("P1", [A1], Tier.GPU)  # GPU copy only: the host copy and its count stay
    assert d.index.tiers("P1", A1) == Tier.HOST and d.count("P1", A1) == 1
    # a resync that reports a block without its host copy applies the same rule
    held = [b for b in d.index.node_blocks("P1") if b.block_hash != B1]
    d.resync_node("P1", [*held, HeldBlock(B1, S, Tier.GPU)], 4.0)
    assert d.count("P1", B1) == 0 and d.index.tiers("P1", B1) == Tier.GPU
