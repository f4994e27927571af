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
    """A request is malformed or too large."""


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


def held_blocks(resync: pb.Resync, max_blocks: int) -> list[HeldBlock]:
    if len(resync.blocks) > max_blocks:
        raise InvalidRequestError(f"resync has {len(resync.blocks)} blocks, more than the limit {max_blocks}")
    out = []
    for b in resync.blocks:
        if b.block_hash == 0:
            raise InvalidRequestError("resync contains block hash 0, the root hash")
        out.append(HeldBlock(b.block_hash, b.parent_hash, tier_from_pb(b.tiers)))
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
