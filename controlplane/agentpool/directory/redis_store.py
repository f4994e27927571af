"""Redis storage of the directory's agent state.

Key layout (``ns`` is the configured namespace, default ``agentpool:dir``):

``<ns>:branch:{<branch id>}``  HASH, one per branch, every field of the branch row:
    ``v`` version, ``p`` path (little-endian u64 block hashes), ``s`` last seen (unix seconds),
    ``c:<node>`` blocks the branch counts on node (``C[beta, node]``, u64 LE), ``m:<node>`` pending
    same-phase move ``"<version>:<blocks>"``. The ``{<branch id>}`` hash tag puts every key of a branch
    in one Redis Cluster slot. TTL: ``idle_ttl_s`` after the last write, so agents that never send an
    end disappear even while the directory is down (the directory also sweeps them, releasing counts).
``<ns>:nodes``  HASH node -> phase (``prefill``/``decode``/``both``).

Counts ``R[b, n]`` are the sizes of the ``C`` sets and are rebuilt on load. Each save (of one or
more snapshots, in order) is one ``MULTI``/``EXEC`` round trip: per new (or re-written) branch
``DEL`` + ``HSET`` + ``PEXPIRE`` (the row replaced whole), per known branch ``HSET`` of the changed
fields + ``HDEL`` of the dropped ones + ``PEXPIRE``, ``DEL`` for ended branches, ``HSET``/``HDEL`` for
node phases. The key TTL is the idle limit plus ``ttl_margin_s``, so the directory's own idle sweep
(which deletes the row) always comes first while it runs; a row missing ``v``, ``p`` or ``s`` (a patch
that landed after an expiry) is skipped on load.
"""

from __future__ import annotations

from typing import cast

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agentpool.directory.store import Snapshot, StoreUnavailableError, decode_branch, is_complete
from agentpool.kv import BranchState, Role

_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)


class RedisBranchStore:
    def __init__(
        self,
        client: aioredis.Redis,
        namespace: str = "agentpool:dir",
        idle_ttl_s: float = 3600.0,
        ttl_margin_s: float = 60.0,
    ):
        if "{" in namespace or "}" in namespace:
            raise ValueError("namespace must not contain hash-tag braces")
        self.client = client
        self.namespace = namespace
        self.idle_ttl_ms = max(1, int((idle_ttl_s + ttl_margin_s) * 1000))
        self.round_trips = 0

    @classmethod
    def from_url(
        cls,
        url: str,
        namespace: str = "agentpool:dir",
        idle_ttl_s: float = 3600.0,
        password: str | None = None,
    ) -> RedisBranchStore:
        """``password`` comes from a file or the environment (the URL must not carry one)."""
        client = aioredis.Redis.from_url(
            url, password=password, socket_timeout=2.0, socket_connect_timeout=2.0
        )
        return cls(client, namespace, idle_ttl_s)

    def branch_key(self, branch: str) -> str:
        return f"{self.namespace}:branch:{{{branch}}}"

    @property
    def nodes_key(self) -> str:
        return f"{self.namespace}:nodes"

    async def load(self) -> tuple[dict[str, Role], list[BranchState]]:
        try:
            raw_phases = cast(dict[bytes, bytes], await self.client.hgetall(self.nodes_key))
            prefix = f"{self.namespace}:branch:{{"
            keys = [k async for k in self.client.scan_iter(match=f"{prefix}*", count=1000)]
            keys = [k for k in keys if k.endswith(b"}")]
            states = []
            for i in range(0, len(keys), 500):  # one pipelined round trip per 500 rows
                pipe = self.client.pipeline(transaction=False)
                for k in keys[i : i + 500]:
                    pipe.hgetall(k)
                rows = cast(list[dict[bytes, bytes]], await pipe.execute())
                for k, row in zip(keys[i : i + 500], rows, strict=True):
                    if is_complete(row):  # empty: expired between SCAN and HGETALL
                        states.append(decode_branch(k.decode()[len(prefix) : -1], row))
        except _REDIS_DOWN as e:
            raise StoreUnavailableError(f"redis: {e}") from e
        return {n.decode(): Role(p.decode()) for n, p in raw_phases.items()}, states

    async def save(self, *snaps: Snapshot) -> None:
        if not any(snap.branches or snap.ended or snap.phases or snap.patches for snap in snaps):
            return
        pipe = self.client.pipeline(transaction=True)
        for snap in snaps:
            self._queue(pipe, snap)
        try:
            self.round_trips += 1
            await pipe.execute()
        except _REDIS_DOWN as e:
            raise StoreUnavailableError(f"redis: {e}") from e
        finally:
            await pipe.reset()  # type: ignore[no-untyped-call]

    def _queue(self, pipe: Pipeline, snap: Snapshot) -> None:
        for b, row in snap.branches.items():
            key = self.branch_key(b)
            pipe.delete(key)
            pipe.hset(key, mapping=row)  # type: ignore[arg-type]
            pipe.pexpire(key, self.idle_ttl_ms)
        for b, (put, drop) in snap.patches.items():
            key = self.branch_key(b)
            pipe.hset(key, mapping=put)  # type: ignore[arg-type]
            if drop:
                pipe.hdel(key, *drop)
            pipe.pexpire(key, self.idle_ttl_ms)
        for b in snap.ended:
            pipe.delete(self.branch_key(b))
        for node, phase in snap.phases.items():
            if phase is None:
                pipe.hdel(self.nodes_key, node)
            else:
                pipe.hset(self.nodes_key, node, phase)

    async def ping(self) -> bool:
        try:
            return bool(await self.client.ping())
        except _REDIS_DOWN:
            return False

    async def close(self) -> None:
        await self.client.aclose()
