"""SGLang's HiCache storage keys over the agent's host pool (pure: no I/O, no clock).

SGLang's L3 storage backend (``hicache_backend.py``, in SGLang's scheduler processes) stores pages
under SGLang's own storage keys: a chained SHA-256 hex string per page (SGLang's ``get_hash_str``),
suffixed per TP rank by the backend. The agent keeps the index: key -> a host-pool block whose hash
is derived from the key (:func:`key_hash`), so the pool's slots, pins and eviction order serve these
pages as they serve the ``sim`` backend's blocks.

Eviction in the directory's count order: in SGLang 0.5.23's source a KV event's block hash is
``hash_str_to_int64`` of the page hash its storage key is made of (:func:`sglang_event_hash`), and
the KV-event mirror maps SGLang's hashes to ours; ``resolve`` (the mirror's map) turns a key into our
block hash, and the pool block takes that block's directory count (:meth:`HostPool.alias`). Not
confirmed with a running SGLang; a key it cannot resolve is evicted as a zero-count block.

Protocol of a page write: :meth:`L3Index.reserve` (slots for the keys not held; evicts in the pool's
order), the writer copies the bytes into the shared buffer, :meth:`L3Index.commit` indexes them (or
:meth:`L3Index.release` gives the slots back). A read: :meth:`L3Index.pin` (the slots of the keys
held, pinned so eviction cannot reuse them during the copy), the copy, :meth:`L3Index.unpin`.

``switching``: set by the backend around a role switch; SGLang's switch calls the storage backend's
``clear()``, and :meth:`L3Index.clear` keeps everything while it is set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from agentpool.engine.errors import PoolFullError
from agentpool.engine.hostpool import HostPool
from agentpool.kv import ROOT_HASH

MAX_KEY_LEN = 512
_RESOLVE_TRIES = 64  # tries (at its commit, then after each KV-event batch or reservation)


def key_hash(key: str) -> int:
    """The host-pool block hash of a storage key (63 bits, never the root hash)."""
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> 1
    return h if h != ROOT_HASH else 1


def sglang_event_hash(key: str) -> int | None:
    """The block hash SGLang's KV events give the page of storage key ``key`` (our rank suffix
    after ``@`` left out): its first 64 bits as a signed integer (SGLang's ``hash_str_to_int64``)."""
    page_hash = key.split("@", 1)[0]
    try:
        u = int(page_hash[:16], 16)
    except ValueError:
        return None
    if len(page_hash) < 16:
        return None
    return u - (1 << 64) if u >= 1 << 63 else u


def check_keys(keys: object) -> list[str]:
    if not isinstance(keys, list) or not all(isinstance(k, str) and 0 < len(k) <= MAX_KEY_LEN for k in keys):
        raise ValueError(f"keys must be a list of non-empty strings of at most {MAX_KEY_LEN} characters")
    return keys


class L3Index:
    """Storage key -> host-pool block, on the agent's pool (which owns slots and eviction)."""

    def __init__(self, pool: HostPool, resolve: Callable[[int], int | None] | None = None) -> None:
        self.pool = pool
        self.resolve = resolve  # SGLang's event hash -> our block hash (the KV-event mirror's map)
        self.aliased = 0
        self._unresolved: dict[int, tuple[int, int]] = {}  # pool hash -> (SGLang hash, tries left)
        self.unaliased = 0
        self.key_of: dict[int, str] = {}  # pool hash -> key, for the keys this index stored
        self.switching = False
        self.kept_clears = 0
        self.dropped_clears = 0

    def __len__(self) -> int:
        return sum(1 for h in self.key_of if h in self.pool)

    def _held(self, key: str) -> int | None:
        h = key_hash(key)
        return h if h in self.pool and self.key_of.get(h) == key else None

    def prefix(self, keys: Sequence[str], now: float) -> int:
        """How many leading keys are held (SGLang's ``batch_exists``); touches them."""
        held: list[int] = []
        for k in keys:
            h = self._held(k)
            if h is None:
                break
            held.append(h)
        self.pool.touch(held, now)
        return len(held)

    def pin(self, keys: Sequence[str], now: float) -> list[int | None]:
        """The slot of each key held (pinned until :meth:`unpin`), None for the others."""
        out: list[int | None] = []
        held: list[int] = []
        for k in keys:
            h = self._held(k)
            if h is None:
                out.append(None)
                continue
            held.append(h)
            out.append(self.pool.slot_of[h])
        self.pool.pin(held)
        self.pool.touch(held, now)
        return out

    def unpin(self, keys: Sequence[str]) -> None:
        self.pool.unpin(h for h in map(key_hash, keys) if h in self.pool)

    def reserve(self, keys: Sequence[str]) -> list[int | None]:
        """A reserved slot for each key not held (None: held already, or named twice).

        Raises :class:`PoolFullError` when pinned blocks leave too little room."""
        todo: list[int] = []
        seen: set[int] = set()
        for i, k in enumerate(keys):
            h = key_hash(k)
            if h in seen or self._held(k) is not None:
                continue
            seen.add(h)
            todo.append(i)
        self.alias_pending()
        res = self.pool.reserve(len(todo))
        for h in res.evicted:
            self.key_of.pop(h, None)
        out: list[int | None] = [None] * len(keys)
        for i, s in zip(todo, res.slots, strict=True):
            out[i] = s
        return out

    def commit(self, keys: Sequence[str], slots: Sequence[int], now: float) -> None:
        """Index ``keys`` whose bytes were written into their reserved ``slots``."""
        if len(keys) != len(slots):
            raise ValueError("commit: as many slots as keys")
        by_hash = {key_hash(k): k for k in keys}
        blocks = [(key_hash(k), ROOT_HASH, s) for k, s in zip(keys, slots, strict=True)]
        for h in self.pool.commit(blocks, now):
            self.key_of[h] = by_hash[h]
            theirs = sglang_event_hash(by_hash[h])
            if theirs is not None and self.resolve is not None:
                self._unresolved[h] = (theirs, _RESOLVE_TRIES)
        self.alias_pending()

    def alias_pending(self) -> None:
        """Alias the pages whose SGLang hash the mirror knows by now (its event may come after the
        write); a page no event names within the tries is evicted as a zero-count block."""
        if self.resolve is None:
            return
        for h, (theirs, tries) in list(self._unresolved.items()):
            ours = self.resolve(theirs) if h in self.pool else None
            if ours is not None:
                self.pool.alias(h, ours)
                self.aliased += 1
            elif tries > 1 and h in self.pool:
                self._unresolved[h] = (theirs, tries - 1)
                continue
            elif h in self.pool:
                self.unaliased += 1  # no event named it: evicted as a zero-count block
            del self._unresolved[h]

    def release(self, slots: Sequence[int]) -> None:
        self.pool.release_slots(slots)

    def clear(self) -> bool:
        """SGLang's ``clear()``: keep everything during a switch (True), else drop the unpinned keys."""
        if self.switching:
            self.kept_clears += 1
            return True
        self.pool.remove(list(self.key_of))
        self.key_of = {h: k for h, k in self.key_of.items() if h in self.pool}
        self.dropped_clears += 1
        return False


__all__ = ["L3Index", "PoolFullError", "check_keys", "key_hash", "sglang_event_hash"]
