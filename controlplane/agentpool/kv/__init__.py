"""Pure KV bookkeeping: block hashing, prefix index, branch versions and counts, eviction order.

No I/O and no clock: callers pass ``now``. The gRPC directory service and the simulator drive the same
:class:`Directory` object.
"""

from agentpool.kv.branches import (
    BranchState,
    BranchTable,
    InvalidBranchIdError,
    Observation,
    PendingMove,
    check_branch_id,
    is_prefix,
)
from agentpool.kv.counts import BranchCounts, CountChanges
from agentpool.kv.directory import Changes, Directory, Resolution
from agentpool.kv.eviction import EvictionCandidate, eviction_order
from agentpool.kv.hashing import DEFAULT_PAGE_SIZE, ROOT_HASH, block_hashes, num_full_blocks
from agentpool.kv.index import PrefixIndex
from agentpool.kv.types import (
    ALL_TIERS,
    HeldBlock,
    InvalidEventError,
    KvError,
    PrefixMatch,
    Role,
    Tier,
    UnknownBranchError,
    UnknownNodeError,
)

__all__ = [
    "ALL_TIERS",
    "DEFAULT_PAGE_SIZE",
    "ROOT_HASH",
    "BranchCounts",
    "BranchState",
    "BranchTable",
    "Changes",
    "CountChanges",
    "Directory",
    "EvictionCandidate",
    "HeldBlock",
    "InvalidBranchIdError",
    "InvalidEventError",
    "KvError",
    "Observation",
    "PendingMove",
    "PrefixIndex",
    "PrefixMatch",
    "Resolution",
    "Role",
    "Tier",
    "UnknownBranchError",
    "UnknownNodeError",
    "block_hashes",
    "check_branch_id",
    "eviction_order",
    "is_prefix",
    "num_full_blocks",
]
