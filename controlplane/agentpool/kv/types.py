"""Value types and errors shared by the KV directory cores."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from agentpool.errors import AgentpoolError, InvalidInputError, NotFoundError


class Tier(enum.IntFlag):
    """Memory tier of a KV block copy on a node (a bit set: a node may hold a block in both)."""

    GPU = 1
    HOST = 2


ALL_TIERS = Tier.GPU | Tier.HOST


class Role(enum.StrEnum):
    """The phase a node serves: ``prefill`` or ``decode`` in disaggregated pools, ``both`` when colocated.

    The one role vocabulary of agentpool (node cores, routing policy, planner, wire formats, the
    directory's phase groups: all ``BOTH`` nodes form one group). It lives here, in the lowest pure
    layer, so every core may import it; the values are the strings on every wire and in every file.
    """

    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Longest cached prefix of a request on one node, in blocks, by tier.

    ``gpu_blocks``: leading blocks all in GPU memory; ``host_blocks``: leading blocks all in host memory;
    ``local_blocks``: leading blocks each held in GPU or host memory of the node.
    """

    gpu_blocks: int
    host_blocks: int
    local_blocks: int


class KvError(AgentpoolError):
    """Root of the KV directory's domain errors."""


class UnknownNodeError(KvError, NotFoundError):
    """The node is not registered with the directory."""


class UnknownBranchError(KvError, NotFoundError):
    """The branch is not in the branch table."""


class InvalidEventError(KvError, InvalidInputError):
    """A KV event contradicts the index (e.g. a block re-stored under another parent)."""


@dataclass(frozen=True, slots=True)
class HeldBlock:
    """A block as a node holds it: used for resyncs (the engine's full block list) and inspection."""

    block_hash: int
    parent_hash: int
    tiers: Tier


def split_blocks(blocks: Iterable[HeldBlock]) -> tuple[list[int], list[int], list[int]]:
    """``(hashes, parents, tier values)`` of ``blocks``, the form :meth:`PrefixIndex.resync_steps` takes."""
    held = list(blocks)
    return [b.block_hash for b in held], [b.parent_hash for b in held], [int(b.tiers) for b in held]
