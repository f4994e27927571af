"""Peer access to host pools: leases on the exporting side, NIXL reads on the fetching side.

Exporting node (``KvExporter``): ``POST /agentpool/v1/kv/lease`` ``{block_hashes, ttl_s}`` pins the
leading blocks it holds and answers ``{lease, block_hashes, parents, slots, pool}`` (``pool``: the
:class:`PoolInfo` a reader needs); ``GET /agentpool/v1/kv/lease/{id}`` answers the same for a lease that
exists (a prefilled request's KV is published under its transfer id this way); ``DELETE`` releases it.
Leases expire after ``ttl_s``, so a reader that dies leaks nothing.

Fetching node (``PeerFetcher``): takes a lease, reserves local slots (evicting in the directory's order),
READs the blocks it lacks with NIXL, checks their bytes (``sim`` backend), indexes them, releases the
lease. Any failure (peer gone, HTTP error, NIXL error or timeout, wrong bytes) gives the reserved slots
back and raises :class:`FetchError`: the caller recomputes.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentpool.engine.blockdata import first_mismatch
from agentpool.engine.errors import BadRequestError, FetchError, UnknownTransferError
from agentpool.engine.hostpool import HostPool
from agentpool.engine.nixl_transport import NixlTransport, PoolInfo

log = logging.getLogger(__name__)

LEASE_PATH = "/agentpool/v1/kv/lease"
MAX_LEASE_BLOCKS = 1 << 20
_U64 = (1 << 64) - 1


class LeaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    block_hashes: list[int] = Field(min_length=1, max_length=MAX_LEASE_BLOCKS)
    ttl_s: float = Field(30.0, gt=0, le=600)


@dataclass(slots=True)
class Lease:
    lease_id: str
    hashes: list[int]
    expires: float


@dataclass(slots=True)
class KvExporter:
    """Leases on this node's host blocks for peers to read."""

    pool: HostPool
    transport: NixlTransport
    clock: Callable[[], float] = time.monotonic
    leases: dict[str, Lease] = field(default_factory=dict)
    unknown_lookups: int = 0
    on_unknown: Callable[[], None] | None = None

    def lease(self, hashes: Sequence[int], ttl_s: float, lease_id: str | None = None) -> dict[str, Any]:
        self.expire()
        held = list(hashes[: self.pool.held_prefix(hashes)])
        lid = lease_id or secrets.token_hex(8)
        if lid in self.leases:
            self.release(lid)
        self.pool.pin(held)
        self.leases[lid] = Lease(lid, held, self.clock() + ttl_s)
        return self.describe(lid)

    def describe(self, lease_id: str) -> dict[str, Any]:
        self.expire()
        lease = self.leases.get(lease_id)
        if lease is None:
            self.unknown_lookups += 1
            if self.on_unknown is not None:
                self.on_unknown()
            raise UnknownTransferError(f"no lease or transfer {lease_id!r} on this node")
        return {
            "lease": lease.lease_id,
            "block_hashes": lease.hashes,
            "parents": [self.pool.parent_of[h] for h in lease.hashes],
            "slots": self.pool.slots(lease.hashes),
            "pool": self.transport.info().to_json(),
        }

    def release(self, lease_id: str) -> bool:
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return False
        self.pool.unpin(lease.hashes)
        return True

    def expire(self) -> None:
        now = self.clock()
        for lid in [k for k, v in self.leases.items() if v.expires <= now]:
            self.release(lid)

    # -- HTTP -----------------------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(LEASE_PATH, self._post)
        app.router.add_get(LEASE_PATH + "/{lease}", self._get)
        app.router.add_delete(LEASE_PATH + "/{lease}", self._delete)

    async def _post(self, request: web.Request) -> web.Response:
        try:
            body = LeaseRequest.model_validate_json(await request.read())
        except ValidationError as e:
            raise BadRequestError(f"bad lease request: {e.errors(include_url=False)}") from None
        if any(not 0 <= h <= _U64 for h in body.block_hashes):
            raise BadRequestError("block hashes are unsigned 64-bit integers")
        return web.json_response(self.lease(body.block_hashes, body.ttl_s))

    async def _get(self, request: web.Request) -> web.Response:
        return web.json_response(self.describe(request.match_info["lease"]))

    async def _delete(self, request: web.Request) -> web.Response:
        if not self.release(request.match_info["lease"]):
            raise UnknownTransferError(f"no lease {request.match_info['lease']!r}")
        return web.json_response({"released": True})


@dataclass(frozen=True, slots=True)
class FetchResult:
    blocks: list[int]  # hashes now held locally from the peer (in chain order)
    held_before: int  # blocks of the lease this node already held
    evicted: list[int]  # host blocks evicted to make room
    bytes: int
    seconds: float


class PeerFetcher:
    """Reads blocks from peers' host pools into this node's pool."""

    def __init__(
        self,
        pool: HostPool,
        transport: NixlTransport,
        session: aiohttp.ClientSession,
        *,
        verify: bool = True,
        verify_stride: int = 1,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.transport = transport
        self.session = session
        self.verify = verify
        self.verify_stride = verify_stride
        self.timeout_s = timeout_s
        self.clock = clock
        self._releases: set[asyncio.Task[None]] = set()

    async def _json(self, method: str, url: str, body: Any = None) -> Any:
        try:
            async with self.session.request(
                method, url, json=body, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as r:
                if r.status == 404:
                    raise FetchError(f"{url}: unknown lease or transfer")
                if r.status != 200:
                    raise FetchError(f"{url}: HTTP {r.status} {(await r.text())[:200]}")
                return await r.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise FetchError(f"{url}: {type(e).__name__}: {e}") from None

    async def fetch_prefix(self, peer_url: str, hashes: Sequence[int], ttl_s: float = 30.0) -> FetchResult:
        """Fetch the leading blocks of ``hashes`` that ``peer_url`` holds (a queued request's prefix)."""
        lease = await self._json(
            "POST", peer_url + LEASE_PATH, {"block_hashes": list(hashes), "ttl_s": ttl_s}
        )
        return await self._read_lease(peer_url, lease)

    async def fetch_transfer(self, peer_url: str, transfer_id: str) -> FetchResult:
        """Fetch the KV a prefill node published under ``transfer_id`` (P->D hand-over)."""
        lease = await self._json("GET", f"{peer_url}{LEASE_PATH}/{transfer_id}")
        return await self._read_lease(peer_url, lease)

    async def _read_lease(self, peer_url: str, lease: Any) -> FetchResult:
        t0 = time.perf_counter()
        try:
            lid = str(lease["lease"])
            hashes = [int(h) for h in lease["block_hashes"]]
            parents = [int(p) for p in lease["parents"]]
            slots = [int(s) for s in lease["slots"]]
            info = PoolInfo.from_json(lease["pool"])
        except (KeyError, TypeError, ValueError) as e:
            raise FetchError(f"bad lease answer from {peer_url}: {e}") from None
        if not len(hashes) == len(parents) == len(slots):
            raise FetchError(f"bad lease answer from {peer_url}: lengths differ")
        try:
            want = [i for i, h in enumerate(hashes) if h not in self.pool]
            res = self.pool.reserve(len(want))
            pairs = [(res.slots[k], slots[i]) for k, i in enumerate(want)]
            try:
                moved = await self.transport.read(info, pairs, self.timeout_s)
                if self.verify:
                    bad = first_mismatch(
                        self.pool.buffer,
                        self.pool.block_bytes,
                        res.slots,
                        [hashes[i] for i in want],
                        self.verify_stride,
                    )
                    if bad is not None:
                        raise FetchError(f"{peer_url} answered wrong bytes for block {hashes[want[bad]]:#x}")
            except BaseException:
                self.pool.release_slots(res.slots)
                raise
            # a block evicted to make room may be one the lease lists: commit what we now have
            entries = [(hashes[i], parents[i], res.slots[k]) for k, i in enumerate(want)]
            self.pool.commit(entries, self.clock())
            self.pool.touch(hashes, self.clock())
        finally:
            task = asyncio.get_running_loop().create_task(self._release(peer_url, lid))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)
        return FetchResult(hashes, len(hashes) - len(want), res.evicted, moved, time.perf_counter() - t0)

    async def close(self) -> None:
        """Wait for the lease releases still under way (before closing the HTTP session)."""
        if self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)

    async def _release(self, peer_url: str, lease_id: str) -> None:
        try:
            await self._json("DELETE", f"{peer_url}{LEASE_PATH}/{lease_id}")
        except FetchError as e:  # the lease expires on its own
            log.debug("releasing lease %s on %s: %s", lease_id, peer_url, e)
