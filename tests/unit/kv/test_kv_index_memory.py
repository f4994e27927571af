"""The index gives its memory back after a big purge (dicts keep their table size on deletes)."""

from __future__ import annotations

import gc
import tracemalloc

from agentpool.kv import ROOT_HASH, Directory, HeldBlock, Role, Tier


def _chain(n: int, start: int) -> list[HeldBlock]:
    hs = [start + i for i in range(n)]
    return [HeldBlock(h, hs[i - 1] if i else ROOT_HASH, Tier.GPU | Tier.HOST) for i, h in enumerate(hs)]


def test_memory_is_returned_after_a_node_purge_and_a_shrinking_resync() -> None:
    d = Directory()
    d.register_node("small", Role.PREFILL)
    d.resync_node("small", _chain(500, 1 << 40), 0.0)
    big = _chain(200_000, 1)
    d.register_node("big", Role.PREFILL)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        d.resync_node("big", big, 1.0)
        grown = tracemalloc.get_traced_memory()[0] - base
        d.drop_node("big")
        gc.collect()
        after_drop = tracemalloc.get_traced_memory()[0] - base
        d.register_node("big", Role.PREFILL)
        d.resync_node("big", big, 2.0)
        d.resync_node("big", big[:100], 3.0)  # the engine lost most of its cache
        gc.collect()
        after_shrink = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown > 20 << 20  # the three tables of 200k blocks
    assert after_drop < grown / 20, (grown, after_drop)
    assert after_shrink < grown / 20, (grown, after_shrink)
    assert len(d.index) == 600 and d.index.node_block_count("small") == 500
