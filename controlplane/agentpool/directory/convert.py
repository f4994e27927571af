"""Validation and conversion between the directory's protobuf messages and the pure ``agentpool.kv`` types.

Every check raises :class:`InvalidRequestError` with a reason; the service maps it to INVALID_ARGUMENT.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from operator import eq
from typing import TYPE_CHECKING

from agentpool.directory.resync_wire import packed_u64
from agentpool.errors import InvalidInputError, OverloadedError
from agentpool.kv import EvictionCandidate, PrefixMatch, Role, Tier, check_branch_id
from agentpool.kv.branches import InvalidBranchIdError
from agentpool.v1 import directory_pb2 as pb

if TYPE_CHECKING:
    from agentpool.directory.resync_wire import PackedResync

NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")

_PHASE_TO_PB: dict[Role, pb.Phase] = {
    Role.PREFILL: pb.PHASE_PREFILL,
    Role.DECODE: pb.PHASE_DECODE,
    Role.BOTH: pb.PHASE_BOTH,
}
_PHASE_FROM_PB: dict[int, Role] = {v: k for k, v in _PHASE_TO_PB.items()}
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


class InvalidRequestError(InvalidInputError):
    """A request is malformed or too large (permanent: INVALID_ARGUMENT)."""


class QuotaExceededError(OverloadedError):
    """A client would store more than its cap (temporary: RESOURCE_EXHAUSTED)."""


def node_name(value: str) -> str:
    if not NODE_RE.match(value):
        raise InvalidRequestError(f"node name {value[:40]!r} must match {NODE_RE.pattern}")
    return value


def branch_id(value: str) -> str:
    try:
        return check_branch_id(value)
    except InvalidBranchIdError as e:
        raise InvalidRequestError(str(e)) from None


def phase_from_pb(value: int) -> Role:
    try:
        return _PHASE_FROM_PB[value]
    except KeyError:
        raise InvalidRequestError(f"phase {value} is not PREFILL, DECODE or BOTH") from None


def phase_to_pb(phase: Role) -> pb.Phase:
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
    return checked_blocks(list(hashes), what)


def request_blocks(request: pb.ResolveRequest | pb.PlaceRequest, max_blocks: int) -> list[int]:
    """:func:`block_list` of a parsed request's ``block_hashes``, read from its packed bytes
    (:func:`agentpool.directory.resync_wire.packed_u64`) when it has them."""
    hashes = request.block_hashes
    if len(hashes) > max_blocks:
        raise InvalidRequestError(f"block_hashes has {len(hashes)} entries, more than the limit {max_blocks}")
    if len(hashes) < 64:  # not worth the bytes
        return checked_blocks(list(hashes))
    out = packed_u64(request.SerializeToString(), request.BLOCK_HASHES_FIELD_NUMBER)
    return checked_blocks(list(hashes) if out is None else out)


def checked_blocks(out: list[int], what: str = "block_hashes") -> list[int]:
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


def resync_size(resync: pb.Resync | PackedResync) -> int:
    return len(resync.blocks) or len(resync.block_hashes)


@dataclass(frozen=True, slots=True)
class ResyncBlocks:
    """A checked resync block list as three equally long int lists (no object per block)."""

    hashes: list[int]
    parents: list[int]
    tiers: list[int]  # Tier values: 1 GPU, 2 HOST, 3 both

    def __len__(self) -> int:
        return len(self.hashes)


_TIER_VALUES: dict[int, int] = {pb.TIER_GPU: 1, pb.TIER_HOST: 2, pb.TIER_GPU_AND_HOST: 3}


def held_blocks(resync: pb.Resync | PackedResync, max_blocks: int) -> ResyncBlocks:
    """:func:`held_blocks_steps` at once."""
    steps = held_blocks_steps(resync, max_blocks)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            blocks: ResyncBlocks = done.value
            return blocks


def held_blocks_steps(
    resync: pb.Resync | PackedResync, max_blocks: int, step: int = 1024
) -> Generator[None, None, ResyncBlocks]:
    """A resync's block list in steps of ``step`` blocks (a generator), checked block by block: no hash
    0, a valid tier, no block its own parent. Either wire form: ``blocks`` (a message per block) or
    the packed ``block_hashes``/``parent_hashes``/``tiers`` (of the parsed message, or views of the
    received bytes: :class:`agentpool.directory.resync_wire.PackedResync`). The checks over the whole
    list (no block twice, parents before children) run in the core's resync
    (:meth:`PrefixIndex.resync_steps`), which raises before changing anything."""
    n = resync_size(resync)
    if n > max_blocks:
        raise InvalidRequestError(f"resync has {n} blocks, more than the limit {max_blocks}")
    packed = not resync.blocks
    if packed and not (len(resync.parent_hashes) == len(resync.tiers) == n):
        raise InvalidRequestError(
            f"packed resync has {n} block hashes, {len(resync.parent_hashes)} parent hashes and "
            f"{len(resync.tiers)} tiers: they must be equally long"
        )
    out = ResyncBlocks([], [], [])
    for i in range(0, n, step):
        yield
        if packed:
            hashes = list(resync.block_hashes[i : i + step])
            parents = list(resync.parent_hashes[i : i + step])
            wire_tiers = list(resync.tiers[i : i + step])
        else:
            chunk = resync.blocks[i : i + step]
            hashes = [b.block_hash for b in chunk]
            parents = [b.parent_hash for b in chunk]
            wire_tiers = [b.tiers for b in chunk]
        tiers = list(map(_tier_value, wire_tiers))
        if 0 in hashes or 0 in tiers or any(map(eq, hashes, parents)):
            _explain(i, hashes, parents, wire_tiers)
        out.hashes.extend(hashes)
        out.parents.extend(parents)
        out.tiers.extend(tiers)
    return out


def _tier_value(wire: int) -> int:
    return _TIER_VALUES.get(wire, 0)


def _explain(start: int, hashes: list[int], parents: list[int], tiers: list[int]) -> None:
    """Raise the error of the first bad block of a chunk (the fast checks found one)."""
    for j, (h, p, t) in enumerate(zip(hashes, parents, tiers, strict=True), start):
        if h == 0:
            raise InvalidRequestError(f"resync block {j} has hash 0, the root hash")
        if h == p:
            raise InvalidRequestError(f"resync block {j} ({h:#x}) is its own parent")
        tier_from_pb(t)  # raises for a bad tier
    raise AssertionError("no bad block in the chunk")


def node_prefix(node: str, phase: Role | None, m: PrefixMatch, page_size: int) -> pb.NodePrefix:
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


class ResolveEncoder:
    """Encodes Resolve answers fast: each node's entry is encoded once per distinct (node, phase,
    match) and cached, and the answer is the concatenation of the entries' encodings. That is valid
    protobuf: concatenated encodings of a message parse as one message whose repeated fields are the
    concatenation, so each cached entry is a one-entry ``ResolveResponse``."""

    def __init__(self, page_size: int, cache_size: int = 1 << 16) -> None:
        self.page_size = page_size
        self._cache: dict[tuple[str, Role | None, PrefixMatch], bytes] = {}
        self._cache_size = cache_size
        self._page = pb.ResolveResponse(page_size=page_size).SerializeToString()

    def encode(
        self, prefixes: Mapping[str, PrefixMatch], phases: Mapping[str, Role], branch: pb.BranchInfo | None
    ) -> bytes:
        cache = self._cache
        parts = []
        for node in sorted(prefixes):
            key = (node, phases.get(node), prefixes[node])
            entry = cache.get(key)
            if entry is None:
                if len(cache) >= self._cache_size:
                    cache.clear()
                one = node_prefix(node, key[1], key[2], self.page_size)
                entry = cache[key] = pb.ResolveResponse(nodes=[one]).SerializeToString()
            parts.append(entry)
        parts.append(self._page)
        if branch is not None:
            parts.append(pb.ResolveResponse(branch=branch).SerializeToString())
        return b"".join(parts)


def eviction_entry(c: EvictionCandidate) -> pb.EvictionEntry:
    return pb.EvictionEntry(block_hash=c.block_hash, count=c.count, last_access=c.last_access)
