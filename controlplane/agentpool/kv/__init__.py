"""Pure KV bookkeeping: block hashing, prefix index, branch versions and counts, eviction order."""

from agentpool.kv.hashing import DEFAULT_PAGE_SIZE, ROOT_HASH, block_hashes, num_full_blocks

__all__ = ["DEFAULT_PAGE_SIZE", "ROOT_HASH", "block_hashes", "num_full_blocks"]
