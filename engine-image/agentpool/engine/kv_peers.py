"""Peer access to host pools: leases on the exporting side, NIXL reads on the fetching side.

Exporting node (``KvExporter``): a lease ``{block_hashes, ttl_s}`` pins the leading blocks it holds and
answers ``{lease, block_hashes, parents, slots}``; a lease that exists can be described by its id (a
prefilled request's KV is published under its transfer id this way) and released. Leases expire after
``ttl_s``, so a reader that dies leaks nothing. Peers take leases on the lease channel
(``lease_channel.py``: one kept-open TCP connection, its port at ``GET /agentpool/v1/kv/channel``);
the same operations are on HTTP for people and tools: ``POST /agentpool/v1/kv/lease``,
``GET``/``DELETE /agentpool/v1/kv/lease/{id}``, their answers with the :class:`PoolInfo` as ``pool``.
Both need the pool's engine token (``auth.py``): the HTTP routes through the app's auth middleware,
the channel in its handshake; the fetcher sends it on both.

Fetching node (``PeerFetcher``): a queued request's prefix is read one-sidedly first: reserve local
slots (evicting in the directory's order), find the blocks in the peer's slot table, READ them and
validate them against the table (``NixlTransport.read_indexed``; no lease, the peer's process does no
work), check their bytes (``sim`` backend), index them. A block the peer's table does not list, or one
overwritten during the READ, is a miss: counted (``fallbacks``) and the fetch takes the lease path:
take a lease (the peer pins the blocks and names their slots), READ the blocks it lacks, check, index,
release the lease. A P->D hand-over always takes the lease path (the prefill node's lease keeps its KV
until the decode node has it). Any failure (peer gone, channel error, NIXL error or timeout, wrong
bytes) gives the reserved slots back and raises :class:`FetchError`: the caller recomputes.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentpool.engine.blockdata import first_mismatch
from agentpool.engine.errors import (
    BadRequestError,
    FetchError,
    NotServingError,
    PoolFullError,
    UnknownTransferError,
)
from agentpool.engine.hostpool import HostPool
from agentpool.engine.lease_channel import MAX_LEASE_BLOCKS, LeaseChannel, LeaseServer
from agentpool.engine.nixl_transport import NixlTransport
from agentpool.kv import ROOT_HASH
from agentpool.secret_file import BearerAuth

log = logging.getLogger(__name__)

LEASE_PATH = "/agentpool/v1/kv/lease"
CHANNEL_PATH = "/agentpool/v1/kv/channel"
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
    auth: BearerAuth
    """Who may use the lease channel (its handshake)."""
    clock: Callable[[], float] = time.monotonic
    leases: dict[str, Lease] = field(default_factory=dict)
    unknown_lookups: int = 0
    on_unknown: Callable[[], None] | None = None
    on_refused: Callable[[], None] | None = None
    """Called for each lease channel connection refused for its handshake."""
    channel: LeaseServer | None = None

    def lease(self, hashes: Sequence[int], ttl_s: float, lease_id: str | None = None) -> dict[str, Any]:
        """Pin the leading blocks of ``hashes`` held here; answers what :meth:`describe` does."""
        self.expire()
        held = list(hashes[: self.pool.held_prefix(hashes)])
        lid = lease_id or secrets.token_hex(8)
        if lid in self.leases:
            self.release(lid)
        self.pool.pin(held)
        lease = self.leases[lid] = Lease(lid, held, self.clock() + ttl_s)
        return self._entry(lease)

    def describe(self, lease_id: str) -> dict[str, Any]:
        """``{lease, block_hashes, parents, slots}`` of a lease that exists."""
        self.expire()
        lease = self.leases.get(lease_id)
        if lease is None:
            self.unknown_lookups += 1
            if self.on_unknown is not None:
                self.on_unknown()
            raise UnknownTransferError(f"no lease or transfer {lease_id!r} on this node")
        return self._entry(lease)

    def _entry(self, lease: Lease) -> dict[str, Any]:
        return {
            "lease": lease.lease_id,
            "block_hashes": lease.hashes,
            "parents": [self.pool.parent_of[h] for h in lease.hashes],
            "slots": self.pool.slots(lease.hashes),
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

    # -- lease channel --------------------------------------------------------------------------
    async def serve_channel(self, host: str, port: int = 0) -> int:
        """Serve leases to peers on a TCP port (``lease_channel.py``); returns the port."""
        self.channel = LeaseServer(
            self.transport.info, self.lease, self.describe, self.release, self.auth, self.on_refused
        )
        return await self.channel.start(host, port)

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()

    # -- HTTP -----------------------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(CHANNEL_PATH, self._channel)
        app.router.add_post(LEASE_PATH, self._post)
        app.router.add_get(LEASE_PATH + "/{lease}", self._get)
        app.router.add_delete(LEASE_PATH + "/{lease}", self._delete)

    async def _channel(self, request: web.Request) -> web.Response:
        if self.channel is None:
            raise NotServingError("this node serves no lease channel")
        return web.json_response({"port": self.channel.port})

    async def _post(self, request: web.Request) -> web.Response:
        try:
            body = LeaseRequest.model_validate_json(await request.read())
        except ValidationError as e:
            raise BadRequestError(f"bad lease request: {e.errors(include_url=False)}") from None
        if any(not 0 <= h <= _U64 for h in body.block_hashes):
            raise BadRequestError("block hashes are unsigned 64-bit integers")
        out = self.lease(body.block_hashes, body.ttl_s)
        return web.json_response({**out, "pool": self.transport.info().to_json()})

    async def _get(self, request: web.Request) -> web.Response:
        out = self.describe(request.match_info["lease"])
        return web.json_response({**out, "pool": self.transport.info().to_json()})

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
        auth: BearerAuth,
        verify: bool = True,
        verify_stride: int = 1,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        direct: bool = True,
        on_fallback: Callable[[str], None] | None = None,
    ) -> None:
        self.pool = pool
        self.transport = transport
        self.session = session
        self.authorization = auth.header
        """The ``Authorization`` value sent to peers (the pool's one engine token), None if open."""
        self._headers = {} if auth.header is None else {"Authorization": auth.header}
        self.verify = verify
        self.verify_stride = verify_stride
        self.timeout_s = timeout_s
        self.clock = clock
        self.direct = direct  # prefixes read one-sidedly first (False: always a lease)
        self.on_fallback = on_fallback
        self.direct_reads = 0
        self.fallbacks: dict[str, int] = {}  # why a one-sided read fell back to a lease -> count
        self._channels: dict[str, LeaseChannel] = {}  # peer URL -> its open lease channel
        self._connecting: dict[str, asyncio.Lock] = {}

    async def _channel(self, peer_url: str) -> LeaseChannel:
        """The open lease channel to ``peer_url``; (re)connected after asking its HTTP API for the port."""
        ch = self._channels.get(peer_url)
        if ch is not None and not ch.closed:
            return ch
        async with self._connecting.setdefault(peer_url, asyncio.Lock()):
            ch = self._channels.get(peer_url)
            if ch is not None and not ch.closed:
                return ch
            url = peer_url + CHANNEL_PATH
            try:
                timeout = aiohttp.ClientTimeout(total=self.timeout_s)
                async with self.session.get(url, headers=self._headers, timeout=timeout) as r:
                    if r.status != 200:
                        raise FetchError(f"{url}: HTTP {r.status} {(await r.text())[:200]}")
                    port = int((await r.json())["port"])
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as e:
                raise FetchError(f"{url}: {type(e).__name__}: {e}") from None
            host = urlsplit(peer_url).hostname or "127.0.0.1"
            ch = self._channels[peer_url] = await LeaseChannel.connect(
                host, port, self.timeout_s, self.authorization
            )
            return ch

    async def fetch_prefix(
        self, peer_url: str, hashes: Sequence[int], ttl_s: float = 30.0, parent: int = ROOT_HASH
    ) -> FetchResult:
        """Fetch the leading blocks of ``hashes`` (a chain from ``parent``) that ``peer_url`` holds (a
        queued request's prefix)."""
        evicted: list[int] = []  # by either attempt; on a failure the error carries them
        try:
            ch = await self._channel(peer_url)
            if self.direct:
                got = await self._read_direct(peer_url, ch, hashes, parent)
                if isinstance(got, FetchResult):
                    return got
                evicted = got
            msg = {"op": "lease", "block_hashes": list(hashes), "ttl_s": ttl_s}
            return await self._read_lease(peer_url, ch, await ch.call(msg, self.timeout_s), evicted)
        except FetchError as e:
            e.evicted = [*evicted, *e.evicted]
            raise

    async def _read_direct(
        self, peer_url: str, ch: LeaseChannel, hashes: Sequence[int], parent: int
    ) -> FetchResult | list[int]:
        """The one-sided read of ``hashes``: its result, or (a miss) the blocks evicted meanwhile."""
        t0 = time.perf_counter()
        want = list(dict.fromkeys(h for h in hashes if h not in self.pool))
        try:
            res = self.pool.reserve(len(want))
        except PoolFullError as e:  # pinned blocks leave no room: recompute instead
            raise FetchError(f"no room for {len(want)} blocks from {peer_url}: {e}") from None
        try:
            got = await self.transport.read_indexed(ch.pool, want, res.slots, self.timeout_s)
            if got.miss is None:
                self._check(peer_url, res.slots, want)
        except BaseException as e:
            self.pool.release_slots(res.slots)
            if isinstance(e, FetchError):
                e.evicted = [*res.evicted, *e.evicted]
            raise
        if got.miss is not None:
            self.pool.release_slots(res.slots)
            self.fallbacks[got.miss] = self.fallbacks.get(got.miss, 0) + 1
            if self.on_fallback is not None:
                self.on_fallback(got.miss)
            return res.evicted
        self.direct_reads += 1
        now = self.clock()
        wanted = set(want)
        slot_of = dict(zip(want, res.slots, strict=True))
        entries = [
            (h, hashes[i - 1] if i else parent, slot_of[h]) for i, h in enumerate(hashes) if h in wanted
        ]
        self.pool.commit(entries, now)
        self.pool.touch(hashes, now)
        return FetchResult(
            list(hashes), len(hashes) - len(want), res.evicted, got.moved, time.perf_counter() - t0
        )

    async def fetch_transfer(self, peer_url: str, transfer_id: str) -> FetchResult:
        """Fetch the KV a prefill node published under ``transfer_id`` (P->D hand-over)."""
        ch = await self._channel(peer_url)
        msg = {"op": "describe", "lease": transfer_id}
        return await self._read_lease(peer_url, ch, await ch.call(msg, self.timeout_s))

    def _check(self, peer_url: str, slots: list[int], hashes: list[int]) -> None:
        """The ``sim`` backend's byte check of blocks ``hashes`` read into ``slots``."""
        if not self.verify:
            return
        bad = first_mismatch(self.pool.buffer, self.pool.block_bytes, slots, hashes, self.verify_stride)
        if bad is not None:
            raise FetchError(f"{peer_url} answered wrong bytes for block {hashes[bad]:#x}")

    async def _read_lease(
        self, peer_url: str, ch: LeaseChannel, lease: dict[str, Any], evicted: Sequence[int] = ()
    ) -> FetchResult:
        t0 = time.perf_counter()
        lid = lease.get("lease")
        try:
            if not isinstance(lid, str):
                raise FetchError(f"bad lease answer from {peer_url}: no lease id")
            try:
                hashes = [int(h) for h in lease["block_hashes"]]
                parents = [int(p) for p in lease["parents"]]
                slots = [int(s) for s in lease["slots"]]
            except (KeyError, TypeError, ValueError) as e:
                raise FetchError(f"bad lease answer from {peer_url}: {e!r}") from None
            if not len(hashes) == len(parents) == len(slots):
                raise FetchError(f"bad lease answer from {peer_url}: lengths differ")
            want = [i for i, h in enumerate(hashes) if h not in self.pool]
            try:
                res = self.pool.reserve(len(want))
            except PoolFullError as e:  # pinned blocks leave no room: recompute instead
                raise FetchError(f"no room for {len(want)} blocks from {peer_url}: {e}") from None
            pairs = [(res.slots[k], slots[i]) for k, i in enumerate(want)]
            try:
                moved = await self.transport.read(ch.pool, pairs, self.timeout_s)
                self._check(peer_url, res.slots, [hashes[i] for i in want])
            except BaseException as e:
                self.pool.release_slots(res.slots)
                if isinstance(e, FetchError):
                    e.evicted = [*res.evicted, *e.evicted]
                raise
            # a block evicted to make room may be one the lease lists: commit what we now have
            entries = [(hashes[i], parents[i], res.slots[k]) for k, i in enumerate(want)]
            now = self.clock()
            self.pool.commit(entries, now)
            self.pool.touch(hashes, now)
        finally:
            if isinstance(lid, str):
                ch.send({"op": "release", "lease": lid})
        return FetchResult(
            hashes, len(hashes) - len(want), [*evicted, *res.evicted], moved, time.perf_counter() - t0
        )

    async def close(self) -> None:
        """Close the lease channels (leases still held expire on the peers)."""
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
