"""The router's side of the Route link (:mod:`agentpool.directory.link`): Route operations on a framed
asyncio connection instead of a gRPC stream, with the same token and TLS.

    client = LinkClient("directory:50062", token=token)
    session = DirectorySession(client)  # as with a DirectoryClient: resolve, place, end_branch
    health = await client.health()  # the directory's Health, over a short connection of its own

Errors are the gRPC client's: :class:`DirectoryRpcError` with the status the directory ended the
connection with (UNAUTHENTICATED for a wrong token), UNAVAILABLE when it cannot be reached or the
connection broke, DEADLINE_EXCEEDED when connecting takes longer than ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError

from agentpool.directory.auth import ConfigurationError
from agentpool.directory.client import DirectoryRpcError, Health
from agentpool.directory.link import (
    BATCH,
    DONE,
    END,
    HEALTH,
    HELLO,
    MAGIC,
    REPLIES,
    FrameError,
    frame,
    read_frame,
)
from agentpool.secret_file.tls import TlsFilesError, client_context
from agentpool.v1 import directory_pb2 as pb

_CODES = {c.value[0]: c for c in grpc.StatusCode}

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def client_ssl_context(
    ca_file: Path | None, client_cert_file: Path | None = None, client_key_file: Path | None = None
) -> ssl.SSLContext:
    """TLS to the link, trusting ``ca_file`` (the system's CAs without one); with a certificate and
    its key, mutual TLS. Reads the files (blocking: call it before serving); ConfigurationError when
    they cannot be loaded."""
    try:
        return client_context(ca_file, client_cert_file, client_key_file, "the directory link")
    except TlsFilesError as e:
        raise ConfigurationError(str(e)) from None


class LinkClient:
    """Opens Route links to ``target`` (``HOST:PORT``, the directory's ``--link-port``)."""

    def __init__(
        self,
        target: str,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout_s: float = 5.0,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        host, sep, port = target.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ValueError(f"a Route link target is HOST:PORT, got {target!r}")
        self.host, self.port = host.strip("[]"), int(port)
        self.target = target
        self._hello = frame(HELLO, MAGIC + (f"Bearer {token}".encode() if token else b""))
        self._ssl = ssl_context
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes

    async def connect(self) -> Connection:
        """A new connection that has said HELLO (the directory answers a wrong token when read)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                    limit=1 << 20,
                )
        except TimeoutError:
            raise DirectoryRpcError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"connecting to the directory link at {self.target} timed out",
            ) from None
        except (OSError, ssl.SSLError) as e:
            raise DirectoryRpcError(
                grpc.StatusCode.UNAVAILABLE, f"cannot connect to the directory link at {self.target}: {e}"
            ) from None
        writer.write(self._hello)
        return reader, writer

    def open_route(self) -> LinkRouteStream:
        return LinkRouteStream(self)

    async def health(self) -> Health:
        """The directory's Health over a connection of its own (so it also checks the link's token)."""
        reader, writer = await self.connect()
        try:
            writer.write(frame(HEALTH) + frame(DONE))
            async with asyncio.timeout(self.timeout_s):
                payload = await _expect(reader, HEALTH, self.max_message_bytes)
            r = pb.HealthResponse.FromString(payload)
        except TimeoutError:
            raise DirectoryRpcError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "no Health answer on the link"
            ) from None
        except DecodeError as e:
            raise DirectoryRpcError(grpc.StatusCode.INTERNAL, f"malformed HealthResponse: {e}") from None
        finally:
            writer.close()
        return Health(r.serving, r.store_ok, r.nodes, r.branches, r.blocks)

    async def close(self) -> None:
        return None  # connections belong to their streams


class LinkRouteStream:
    """One Route link connection (a :class:`agentpool.directory.client.RouteStream`). It connects in
    the background; writes and reads wait for it."""

    def __init__(self, client: LinkClient) -> None:
        self._max = client.max_message_bytes
        self._connected = asyncio.ensure_future(client.connect())
        self._connected.add_done_callback(_retrieve)
        self._open: Connection | None = None
        self._cancelled = False

    async def _connection(self) -> Connection:
        if self._open is None:
            self._open = await asyncio.shield(self._connected)  # a cancelled waiter leaves it be
            if self._cancelled:
                self._open[1].close()
        return self._open

    async def write(self, data: bytes) -> None:
        _, writer = await self._connection()
        try:
            writer.write(frame(BATCH, data))
            await writer.drain()
        except OSError as e:
            raise DirectoryRpcError(grpc.StatusCode.UNAVAILABLE, f"the Route link broke: {e}") from None

    async def read(self) -> bytes:
        reader, _ = await self._connection()
        return await _expect(reader, REPLIES, self._max)

    async def done_writing(self) -> None:
        _, writer = await self._connection()
        try:
            writer.write(frame(DONE))
            await writer.drain()
        except OSError as e:
            raise DirectoryRpcError(grpc.StatusCode.UNAVAILABLE, f"the Route link broke: {e}") from None

    def cancel(self) -> None:
        self._cancelled = True
        if not self._connected.done():
            self._connected.cancel()
        elif not self._connected.cancelled() and self._connected.exception() is None:
            self._connected.result()[1].close()


async def _expect(reader: asyncio.StreamReader, kind: int, max_bytes: int) -> bytes:
    """The payload of the next frame, which must be of ``kind``; an END frame or the connection's end
    raises :class:`DirectoryRpcError` with the directory's status (or UNAVAILABLE)."""
    try:
        got = await read_frame(reader, max_bytes)
    except (OSError, asyncio.IncompleteReadError, ssl.SSLError) as e:
        raise DirectoryRpcError(grpc.StatusCode.UNAVAILABLE, f"the Route link broke: {e}") from None
    except FrameError as e:
        raise DirectoryRpcError(grpc.StatusCode.INTERNAL, f"the directory link sent {e}") from None
    if got is None:
        raise DirectoryRpcError(grpc.StatusCode.UNAVAILABLE, "the directory closed the Route link")
    got_kind, payload = got
    if got_kind == kind:
        return payload
    if got_kind == END:
        try:
            end = pb.RouteError.FromString(payload)
        except DecodeError:
            end = pb.RouteError(code=grpc.StatusCode.INTERNAL.value[0], reason="malformed END frame")
        code = _CODES.get(end.code, grpc.StatusCode.UNKNOWN)
        if code is grpc.StatusCode.OK:
            raise DirectoryRpcError(grpc.StatusCode.UNAVAILABLE, "the directory closed the Route link")
        raise DirectoryRpcError(code, end.reason)
    raise DirectoryRpcError(grpc.StatusCode.INTERNAL, f"the directory link sent a frame of kind {got_kind}")


def _retrieve(task: asyncio.Future[Connection]) -> None:
    """A connection failure is raised to whoever waits for it; none may (no "never retrieved")."""
    if not task.cancelled():
        task.exception()
