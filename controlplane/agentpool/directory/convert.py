"""Validation and conversion between the directory's protobuf messages and the pure ``agentpool.kv`` types.

Every check raises :class:`InvalidRequestError` with a reason; the service maps it to INVALID_ARGUMENT.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentpool.kv import EvictionCandidate, HeldBlock, Phase, PrefixMatch, Tier, check_branch_id
from agentpool.kv.branches import InvalidBranchIdError
from agentpool.v1 import directory_pb2 as pb

NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")

_PHASE_TO_PB: dict[Phase, pb.Phase] = {
    Phase.PREFILL: pb.PHASE_PREFILL,
    Phase.DECODE: pb.PHASE_DECODE,
    Phase.BOTH: pb.PHASE_BOTH,
}
_PHASE_FROM_PB: dict[int, Phase] = {v: k for k, v in _PHASE_TO_PB.items()}
_TIER_FROM_PB: dict[int, Tier] = {
    pb.TIER_GPU: Tier.GPU,
    pb.TIER_HOST: Tier.HOST,
    pb.TIER_GPU_AND_HOST: Tier.GPU | Tier.HOST,
}
_TIER_TO_PB: dict[Tier, pb.Tier] = {
    Tier.GPU: pb.TIER_GPU,
    Tier.HOST: pb.TIER_HOST,
    Tier.GPU | Tier.HOST: pb.TIER_GPU_AND_HOST,
}


class InvalidRequestError(ValueError):
    """A request is malformed or too large (INVALID_ARGUMENT)."""


class QuotaExceededError(Exception):
    """A client would store more than its cap (RESOURCE_EXHAUSTED)."""


def node_name(value: str) -> str:
    if not NODE_RE.match(value):
        raise InvalidRequestError(f"node name {value[:40]!r} must match {NODE_RE.pattern}")
    return value


def branch_id(value: str) -> str:
    try:
        return check_branch_id(value)
    except InvalidBranchIdError as e:
        raise InvalidRequestError(str(e)) from None


def phase_from_pb(value: int) -> Phase:
    try:
        return _PHASE_FROM_PB[value]
    except KeyError:
        raise InvalidRequestError(f"phase {value} is not PREFILL, DECODE or BOTH") from None


def phase_to_pb(phase: Phase) -> pb.Phase:
    return _PHASE_TO_PB[phase]


def tier_from_pb(value: int) -> Tier:
    try:
        return _TIER_FROM_PB[value]
    except KeyError:
        raise InvalidRequestError(f"tier {value} is not GPU, HOST or GPU_AND_HOST") from None


def tier_to_pb(tier: Tier) -> pb.Tier:
    return _TIER_TO_PB[tier]


def block_list(hashes: Sequence[int], max_blocks: int, what: str = "block_hashes") -> list[int]:
    if len(hashes) > max_blocks:
        raise InvalidRequestError(f"{what} has {len(hashes)} entries, more than the limit {max_blocks}")
    out = list(hashes)
    if 0 in out:
        raise InvalidRequestError(f"{what} contains 0, the root hash, which is not a block")
    return out


def stored_chain(parent: int, hashes: Sequence[int], max_blocks: int) -> list[int]:
    """A stored event's chain: each block the child of the one before, the first the child of
    ``parent``; so no block may repeat or be ``parent`` itself (either would make a cycle)."""
    out = block_list(hashes, max_blocks)
    if len(set(out)) != len(out) or parent in out:
        seen = {parent}
        for h in out:
            if h in seen:
                what = "its own parent" if h == parent else "listed twice"
                raise InvalidRequestError(f"stored chain is not a chain: block {h:#x} is {what} (a cycle)")
            seen.add(h)
    return out


def held_blocks(resync: pb.Resync, max_blocks: int) -> list[HeldBlock]:
    """A resync's block list, checked: parents before children (a block's parent is the root, a block
    listed before it, or a block the node does not hold), no block twice, no block its own parent; so
    the list cannot describe a cycle."""
    blocks = resync.blocks
    if len(blocks) > max_blocks:
        raise InvalidRequestError(f"resync has {len(blocks)} blocks, more than the limit {max_blocks}")
    out = []
    seen: set[int] = set()
    for i, b in enumerate(blocks):
        h, parent = b.block_hash, b.parent_hash
        if h == 0:
            raise InvalidRequestError(f"resync block {i} has hash 0, the root hash")
        if h == parent:
            raise InvalidRequestError(f"resync block {i} ({h:#x}) is its own parent")
        if h in seen:
            raise InvalidRequestError(f"resync block {i} ({h:#x}) is listed twice")
        seen.add(h)
        out.append(HeldBlock(h, parent, tier_from_pb(b.tiers)))
    later = [(i, b) for i, b in enumerate(out) if b.parent_hash in seen]  # parents the node holds
    position = {b.block_hash: i for i, b in enumerate(out)} if later else {}
    for i, b in later:
        j = position[b.parent_hash]
        if j > i:
            raise InvalidRequestError(
                f"resync block {i} ({b.block_hash:#x}) comes before its parent (block {j}, "
                f"{b.parent_hash:#x}): list parents before children"
            )
    return out


def node_prefix(node: str, phase: Phase | None, m: PrefixMatch, page_size: int) -> pb.NodePrefix:
    return pb.NodePrefix(
        node=node,
        phase=pb.PHASE_UNSPECIFIED if phase is None else phase_to_pb(phase),
        gpu_blocks=m.gpu_blocks,
        host_blocks=m.host_blocks,
        local_blocks=m.local_blocks,
        gpu_tokens=m.gpu_blocks * page_size,
        host_tokens=m.host_blocks * page_size,
        local_tokens=m.local_blocks * page_size,
    )


def eviction_entry(c: EvictionCandidate) -> pb.EvictionEntry:
    return pb.EvictionEntry(block_hash=c.block_hash, count=c.count, last_access=c.last_access)
