"""The in-process DirectoryView: prefixes in tokens by tier, branches placed and ended."""

from __future__ import annotations

from agentpool.kv import ROOT_HASH, Directory, Role, Tier, block_hashes
from agentpool.router.directory_view import InProcessDirectoryView
from agentpool.router.policy import CachedPrefix

PAGE = 4


async def test_resolve_place_and_end_branch() -> None:
    d = Directory(PAGE)
    d.register_node("a", Role.PREFILL)
    d.register_node("b", Role.PREFILL)
    tokens = list(range(40))  # 10 blocks
    hashes = block_hashes(tokens, PAGE)
    d.apply_stored("a", ROOT_HASH, hashes[:6], Tier.GPU, now=0.0)
    d.apply_stored("b", ROOT_HASH, hashes[:3], Tier.GPU, now=0.0)
    d.apply_stored("b", hashes[2], hashes[3:8], Tier.HOST, now=0.0)
    view = InProcessDirectoryView(d, clock=lambda: 1.0)

    r = await view.resolve(hashes, "agent-1", None)
    assert r.prefixes == {"a": CachedPrefix(gpu=24, total=24), "b": CachedPrefix(gpu=12, total=32)}
    assert r.cluster_prefix == 32 and r.branch_version == 1
    assert d.branches.find("agent-1") is None  # resolve only looks
    await view.place("agent-1", "b", r.hashes)  # b took the request
    assert d.branches.get("agent-1").path == tuple(hashes) and d.count("b", hashes[0]) == 1
    assert await view.end_branch("agent-1") is True
    assert await view.end_branch("agent-1") is False
    assert d.branches.find("agent-1") is None

    headerless = await view.resolve(hashes, None, None)
    assert headerless.branch_version is None and len(d.branches) == 0
