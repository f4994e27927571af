"""The Route link: a router's Route operations on a plain framed connection (the directory's side).

The ``Route`` gRPC stream carries a router's Resolves, Places and EndBranches as bytes
(:class:`agentpool.directory.route.RouteSession` takes encoded ``RouteBatch`` messages and gives
encoded ``RouteReplies``). At one request in flight, grpc.aio's machinery cost the router about 30%
of its CPU and the directory as much again; the same batches on an asyncio connection with a length
prefix cost each side 0.35-0.7x of that (``bench/results/bench_directory.md``). The link is that
connection, with the gRPC service's bearer token and TLS files (``--link-port``).

A frame is a 4-byte big-endian length (of what follows), one kind byte and the payload:

========  =========  ===========================================================================
kind      sent by    payload
========  =========  ===========================================================================
HELLO 1   client     first frame, ``agentpool-route/1`` then a newline and ``Bearer <token>``
BATCH 2   client     an encoded ``RouteBatch``, applied in order as on the gRPC stream
DONE 3    client     no more batches: the directory answers what it has, then ends
HEALTH 4  both       client: empty; the directory answers an encoded ``HealthResponse``
REPLIES 5 directory  an encoded ``RouteReplies``
END 6     directory  last frame: an encoded ``RouteError`` with the gRPC status code it ends with
                     (0 after DONE; UNAUTHENTICATED, INVALID_ARGUMENT, ... with the reason)
========  =========  ===========================================================================

A missing or wrong token is answered END(UNAUTHENTICATED) (compared in constant time), a frame over
``max_message_bytes`` or a malformed one END(INVALID_ARGUMENT); a bad operation gets an error reply
and the connection goes on, as on the stream.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from agentpool.directory.auth import ConfigurationError
from agentpool.directory.convert import InvalidRequestError
from agentpool.directory.route import RouteSession
from agentpool.directory.service import DirectoryService, grpc_status
from agentpool.secret_file.tls import TlsFilesError, server_context
from agentpool.v1 import directory_pb2 as pb

log = logging.getLogger(__name__)

MAGIC = b"agentpool-route/1\n"
HELLO, BATCH, DONE, HEALTH, REPLIES, END = 1, 2, 3, 4, 5, 6
HEADER = struct.Struct(">IB")  # length of kind + payload, kind

HELLO_TIMEOUT_S = 5.0  # a connection that does not say who it is within this long is closed


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol (or an oversized one)."""


def frame(kind: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload) + 1, kind) + payload


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> tuple[int, bytes] | None:
    """The next frame; None at a clean end of the connection (between frames). Raises FrameError
    for an oversized or empty frame, ``asyncio.IncompleteReadError`` when it ends inside one."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise
    size, kind = HEADER.unpack(header)
    if size < 1:
        raise FrameError("a frame without a kind")
    if size - 1 > max_bytes:
        raise FrameError(f"a frame of {size - 1} bytes, more than the limit of {max_bytes}")
    return kind, await reader.readexactly(size - 1)


def server_ssl_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """TLS for the link from the gRPC service's files (client certificates required with a CA);
    ConfigurationError when they cannot be loaded."""
    try:
        return server_context(cert, key, client_ca, "required", "the Route link")
    except TlsFilesError as e:
        raise ConfigurationError(str(e)) from None


class RouteLinkServer:
    """Serves Route links for ``service`` (the gRPC server's service: one core, one store)."""

    def __init__(
        self,
        service: DirectoryService,
        token: str | None,
        ssl_context: ssl.SSLContext | None,
        max_message_bytes: int,
    ) -> None:
        self.service = service
        self._expected = None if token is None else f"Bearer {token}".encode()
        self._ssl = ssl_context
        self._max = max_message_bytes
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            status = await self._session(reader, writer)
            if status is not None:
                code, reason = status
                writer.write(frame(END, pb.RouteError(code=code.value[0], reason=reason).SerializeToString()))
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client went away: nothing to tell it
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()

    async def _session(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[grpc.StatusCode, str] | None:
        """Run one connection; the status to end it with (None: say nothing, the client is gone)."""
        try:
            hello = await asyncio.wait_for(read_frame(reader, 4096), HELLO_TIMEOUT_S)
        except (TimeoutError, FrameError):
            return grpc.StatusCode.INVALID_ARGUMENT, "expected a HELLO frame first"
        if hello is None:
            return None
        kind, payload = hello
        if kind != HELLO or not payload.startswith(MAGIC):
            return grpc.StatusCode.INVALID_ARGUMENT, "expected a HELLO frame of agentpool-route/1 first"
        given = payload[len(MAGIC) :]
        if self._expected is not None and not hmac.compare_digest(given, self._expected):  # constant time
            return grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token"
        session = RouteSession(self.service)
        batches = asyncio.create_task(session.read(self._batches(reader, writer)))
        try:
            while (replies := await session.next_replies()) is not None:
                writer.write(frame(REPLIES, replies))
                await writer.drain()
            await batches  # done: raises what it did not expect
        except InvalidRequestError as e:
            return grpc_status(e), str(e)
        finally:
            batches.cancel()
            await session.close()
        return grpc.StatusCode.OK, ""

    async def _batches(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> AsyncIterator[bytes]:
        """The client's batches until DONE (or it closed); HEALTH is answered on the way."""
        while True:
            try:
                got = await read_frame(reader, self._max)
            except FrameError as e:
                raise InvalidRequestError(str(e)) from None
            except (OSError, asyncio.IncompleteReadError):
                return  # the connection broke: what was read is applied and written
            if got is None:
                return
            kind, payload = got
            if kind == BATCH:
                yield payload
            elif kind == DONE:
                return
            elif kind == HEALTH:
                writer.write(frame(HEALTH, self.service.health_response().SerializeToString()))
            else:
                raise InvalidRequestError(f"unexpected frame of kind {kind} on a Route link")
