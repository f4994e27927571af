"""Leases between engines on one kept-open TCP connection per peer: length-prefixed JSON frames.

A lease makes the peer pin blocks and name their slots before a READ: a P->D hand-over takes one (the
prefill node's KV must stay until the decode node has it), and so does a prefix fetch whose one-sided
read missed (``kv_peers.py``; most prefix fetches need no lease). As an HTTP request it took ~0.7 ms
of aiohttp request handling on both sides (3-4 ms on a loaded host), as much as a whole 4 MiB READ; on
this channel it is one small frame each way. The channel's hello also gives a reader the peer's
:class:`PoolInfo` (with its slot table) for the one-sided reads.

Frames: a 4-byte little-endian length, then a JSON object. The client's first frame is the handshake
``{"op": "hello", "authorization": "Bearer <engine token>"}`` (``authorization`` left out towards an
engine that takes no token); the server checks it in constant time (``auth.py``) and answers
``{"pool": PoolInfo}`` (what a reader needs for NIXL), or an error frame (``id`` null) and closes the
connection, for a wrong or missing token, another first frame, or none within 5 s. Then, client to
server:

- ``{"op": "lease", "id": n, "block_hashes": [...], "ttl_s": t}``: pin the leading blocks held;
- ``{"op": "describe", "id": n, "lease": id}``: a lease that exists (a hand-over's transfer id);
- ``{"op": "release", "lease": id}``: no answer.

Server to client: ``{"id": n, "lease": id, "block_hashes": [...], "parents": [...], "slots": [...]}``
or ``{"id": n, "error": message, "unknown": bool}``. A frame that is not a valid request gets an error
answer (its ``id`` null when it has none) and the server closes the connection; others are unaffected.
A reader finds the port with ``GET /agentpool/v1/kv/channel`` on the peer's HTTP API.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from agentpool.engine.errors import FetchError, UnknownTransferError
from agentpool.engine.nixl_transport import PoolInfo
from agentpool.secret_file import BearerAuth

log = logging.getLogger(__name__)

MAX_FRAME = 64 << 20
MAX_LEASE_BLOCKS = 1 << 20
_U64 = (1 << 64) - 1
_LEN = 4
HELLO_TIMEOUT_S = 5.0
"""A connection that sends no handshake within this is closed (it holds no server resources longer)."""
MAX_HELLO = 4096
"""The largest handshake frame: an unauthenticated peer cannot make the server buffer more."""


class LeaseOp(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: Literal["lease"]
    id: int
    block_hashes: list[Annotated[int, Field(ge=0, le=_U64)]] = Field(
        min_length=1, max_length=MAX_LEASE_BLOCKS
    )
    ttl_s: float = Field(30.0, gt=0, le=600)


class DescribeOp(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: Literal["describe"]
    id: int
    lease: str = Field(min_length=1, max_length=256)


class ReleaseOp(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: Literal["release"]
    lease: str = Field(min_length=1, max_length=256)


_REQUEST: TypeAdapter[LeaseOp | DescribeOp | ReleaseOp] = TypeAdapter(
    Annotated[LeaseOp | DescribeOp | ReleaseOp, Field(discriminator="op")]
)


def frame(obj: Any) -> bytes:
    body = orjson.dumps(obj)
    return len(body).to_bytes(_LEN, "little") + body


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME) -> bytes:
    """One frame's body; raises ``asyncio.IncompleteReadError`` at EOF, ``ValueError`` if oversized."""
    n = int.from_bytes(await reader.readexactly(_LEN), "little")
    if n > limit:
        raise ValueError(f"frame of {n} bytes (at most {limit})")
    return await reader.readexactly(n)


# -- server (the exporting node) -------------------------------------------------------------------
class LeaseServer:
    """Serves leases of one exporter (``kv_peers.KvExporter``) on a TCP port."""

    def __init__(
        self,
        pool_info: Callable[[], PoolInfo],
        lease: Callable[[list[int], float], dict[str, Any]],
        describe: Callable[[str], dict[str, Any]],
        release: Callable[[str], bool],
        auth: BearerAuth,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        self._auth = auth
        self._on_refused = on_refused
        self.refused = 0
        self._pool_info = pool_info
        self._lease = lease
        self._describe = describe
        self._release = release
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.bad_frames = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._conns):
                w.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            if not await self._handshake(reader, writer):
                return
            writer.write(frame({"pool": self._pool_info().to_json()}))
            while True:
                try:
                    body = await read_frame(reader)
                except asyncio.IncompleteReadError:
                    return  # the reader closed the channel
                except ValueError as e:
                    self.bad_frames += 1
                    writer.write(frame({"id": None, "error": str(e), "unknown": False}))
                    return
                answer = self._answer(body)
                if answer is not None:
                    writer.write(frame(answer))
                    if answer.get("id") is None:  # not a request: the stream cannot be trusted further
                        return
                await writer.drain()
        except ConnectionError as e:
            log.debug("lease channel closed: %s", e)
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Whether the first frame is a hello with the token; otherwise refuse (counted) and say why."""
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                body = await read_frame(reader, MAX_HELLO)
        except asyncio.IncompleteReadError:
            return False  # closed before saying anything
        except (TimeoutError, ValueError) as e:
            why = "no handshake in time" if isinstance(e, TimeoutError) else str(e)
        else:
            is_hello, authorization = _hello(body)
            if is_hello and self._auth.allows(authorization):
                return True
            why = "missing or wrong engine token" if is_hello else "the first frame is not a hello"
        self.refused += 1
        if self._on_refused is not None:
            self._on_refused()
        log.warning("lease channel: refused a connection: %s", why)
        writer.write(frame({"id": None, "error": f"unauthenticated: {why}", "unknown": False}))
        await writer.drain()
        return False

    def _answer(self, body: bytes) -> dict[str, Any] | None:
        try:
            req = _REQUEST.validate_json(body)
        except ValidationError as e:
            self.bad_frames += 1
            rid = _id_of(body)
            return {
                "id": rid,
                "error": f"bad lease request: {e.errors(include_url=False)}"[:2000],
                "unknown": False,
            }
        if isinstance(req, ReleaseOp):
            self._release(req.lease)
            return None
        try:
            if isinstance(req, LeaseOp):
                out = self._lease(req.block_hashes, req.ttl_s)
            else:
                out = self._describe(req.lease)
        except UnknownTransferError as e:
            return {"id": req.id, "error": str(e), "unknown": True}
        out["id"] = req.id
        return out


def _hello(body: bytes) -> tuple[bool, str | None]:
    """(whether ``body`` is a hello frame, its ``authorization`` or None when left out)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False, None
    if not isinstance(obj, dict) or obj.get("op") != "hello":
        return False, None
    given = obj.get("authorization")
    return True, given if isinstance(given, str) else None


def _id_of(body: bytes) -> int | None:
    with contextlib.suppress(orjson.JSONDecodeError):
        obj = orjson.loads(body)
        if isinstance(obj, dict) and isinstance(obj.get("id"), int):
            return int(obj["id"])
    return None


# -- client (the fetching node) --------------------------------------------------------------------
class LeaseChannel:
    """One open connection to a peer's lease server; calls are multiplexed by id."""

    def __init__(self, pool: PoolInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.pool = pool
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.closed = False
        self._task = asyncio.get_running_loop().create_task(self._read_answers())

    @classmethod
    async def connect(cls, host: str, port: int, timeout_s: float, authorization: str | None) -> LeaseChannel:
        """Open a channel; ``authorization``: the ``Bearer <engine token>`` value of the handshake
        (None towards an engine that takes no token)."""
        hello_frame: dict[str, Any] = {"op": "hello"}
        if authorization is not None:
            hello_frame["authorization"] = authorization
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(frame(hello_frame))
                try:
                    hello = orjson.loads(await read_frame(reader))
                    refused = hello.get("error") if isinstance(hello, dict) else None
                    pool = None if refused is not None else PoolInfo.from_json(hello["pool"])
                except (asyncio.IncompleteReadError, ValueError, KeyError, TypeError) as e:
                    writer.close()
                    raise FetchError(f"lease channel {host}:{port}: bad hello: {e!r}") from None
                if pool is None:
                    writer.close()
                    raise FetchError(f"lease channel {host}:{port} refused: {str(refused)[:300]}")
        except (OSError, TimeoutError) as e:
            raise FetchError(f"lease channel {host}:{port}: {type(e).__name__}: {e}") from None
        return cls(pool, reader, writer)

    async def call(self, msg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send a request and wait for its answer; :class:`FetchError` on an error answer, a closed
        channel or no answer within ``timeout_s``."""
        if self.closed:
            raise FetchError("lease channel closed")
        rid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self._writer.write(frame({**msg, "id": rid}))
            async with asyncio.timeout(timeout_s):
                answer = await fut
        except TimeoutError:
            raise FetchError(f"lease channel: no answer within {timeout_s:.3g} s") from None
        finally:
            self._pending.pop(rid, None)
        if "error" in answer:
            what = "unknown lease or transfer: " if answer.get("unknown") else ""
            raise FetchError(f"lease channel: {what}{str(answer['error'])[:300]}")
        return answer

    def send(self, msg: dict[str, Any]) -> None:
        """A request that has no answer (a release); dropped if the channel is closed (leases expire)."""
        if not self.closed:
            self._writer.write(frame(msg))

    def close(self) -> None:
        self._fail("lease channel closed")
        self._task.cancel()

    def _fail(self, why: str) -> None:
        self.closed = True
        self._writer.close()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(FetchError(why))
        self._pending.clear()

    async def _read_answers(self) -> None:
        why = "the peer closed the lease channel"
        try:
            while True:
                answer = orjson.loads(await read_frame(self._reader))
                rid = answer.get("id") if isinstance(answer, dict) else None
                fut = self._pending.get(rid) if isinstance(rid, int) else None
                if fut is not None:
                    if not fut.done():
                        fut.set_result(answer)
                elif isinstance(rid, int) and isinstance(answer.get("lease"), str):
                    self.send(
                        {"op": "release", "lease": answer["lease"]}
                    )  # answered after its caller gave up
                elif rid is None:
                    why = f"the peer refused a request: {str(answer)[:300]}"
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except ValueError as e:  # not JSON, oversized
            why = f"garbage on the lease channel: {e!r}"
        finally:
            self._fail(why)
