"""Authentication of the directory: a bearer token on every RPC, TLS and mutual TLS.

The token is read from a file (a Kubernetes Secret mounted as a file); clients send it as gRPC metadata
``authorization: Bearer <token>`` and the server compares it in constant time on every call, streams
included. TLS: the server's certificate and key (PEM files); with a client CA file the server also
requires and verifies client certificates (mTLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

from agentpool.errors import UnauthenticatedError, grpc_code_name
from agentpool.secret_file import MIN_TOKEN_CHARS, read_secret_file

_UNAUTHENTICATED = grpc.StatusCode[grpc_code_name(UnauthenticatedError)]


class ConfigurationError(ValueError):
    """A secret or certificate file is missing, empty or unusable; a setting would leak a secret."""


def read_token_file(path: Path, min_chars: int = MIN_TOKEN_CHARS) -> str:
    """A directory bearer token from ``path`` (:class:`SecretFileError` if missing, empty or short)."""
    return read_secret_file(path, "directory token", min_chars)


def url_has_password(url: str) -> bool:
    """``redis://user:secret@host`` (or ``redis://:secret@host``): a password in a URL."""
    try:
        return urlsplit(url).password is not None
    except ValueError:
        return False


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


async def _take_first(requests: Any) -> None:
    """Read a denied stream's first message (for at most a second) before ending it: ending a client
    stream while its first message is still in flight can reach the client as INTERNAL instead of the
    status sent (seen under load), so the caller would not learn that its token was wrong."""
    if not hasattr(requests, "__anext__"):  # a unary request: already read
        return
    with contextlib.suppress(TimeoutError, StopAsyncIteration, grpc.aio.AioRpcError):
        await asyncio.wait_for(anext(requests), timeout=1.0)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Rejects calls without ``authorization: Bearer <token>`` with UNAUTHENTICATED."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(_UNAUTHENTICATED, "missing or wrong bearer token")

        async def deny_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await _take_first(request)
            await context.abort(_UNAUTHENTICATED, "missing or wrong bearer token")
            yield None

        self._deny_unary = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_stream_rpc_method_handler(deny_stream)
        self._deny_unary_stream = grpc.unary_stream_rpc_method_handler(deny_stream)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        given: str | bytes | None = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                given = value
        if isinstance(given, str):
            given = given.encode()
        if isinstance(given, bytes) and hmac.compare_digest(given, self._expected):  # constant time
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if handler.request_streaming:
            return self._deny_stream
        if handler.response_streaming:
            return self._deny_unary_stream
        return self._deny_unary


def server_credentials(cert: Path, key: Path, client_ca: Path | None) -> grpc.ServerCredentials:
    """TLS with the server's certificate chain and key; with ``client_ca`` client certificates signed
    by it are required (mTLS)."""
    pair = [(_read_pem(key, "TLS key"), _read_pem(cert, "TLS certificate"))]
    if client_ca is None:
        return grpc.ssl_server_credentials(pair)
    return grpc.ssl_server_credentials(
        pair, root_certificates=_read_pem(client_ca, "client CA"), require_client_auth=True
    )


def channel_credentials(
    ca: bytes | None, client_cert: bytes | None = None, client_key: bytes | None = None
) -> grpc.ChannelCredentials:
    if (client_cert is None) != (client_key is None):
        raise ConfigurationError("a client certificate needs its key, and a key its certificate")
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=client_key, certificate_chain=client_cert
    )


@dataclass(frozen=True, slots=True)
class ClientTls:
    """A directory client's TLS material (PEM), as :class:`agentpool.directory.client.DirectoryClient`
    takes it: the CA it trusts and, for mutual TLS, its certificate and key."""

    root_certificates: bytes | None = None
    client_cert: bytes | None = None
    client_key: bytes | None = None


def read_client_tls(
    ca_file: Path | None, cert_file: Path | None = None, key_file: Path | None = None
) -> ClientTls:
    """The files the router, planner and engines name (blocking reads: call it before serving or in
    a thread); ConfigurationError for an unreadable or non-PEM file, or half a certificate pair."""
    if (cert_file is None) != (key_file is None):
        raise ConfigurationError(
            "a client certificate file needs its key file, and a key file its certificate"
        )
    return ClientTls(
        None if ca_file is None else _read_pem(ca_file, "directory CA"),
        None if cert_file is None else _read_pem(cert_file, "client certificate"),
        None if key_file is None else _read_pem(key_file, "client key"),
    )


def _read_pem(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigurationError(f"cannot read the {what} file {path}: {e.strerror or e}") from None
    if b"-----BEGIN" not in data:
        raise ConfigurationError(f"the {what} file {path} is not PEM")
    return data
