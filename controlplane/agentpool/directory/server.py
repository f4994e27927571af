"""Run the directory: ``python -m agentpool.directory --redis-url redis://... --port 50061``.

:class:`DirectoryServer` wires the core, the store, the servicer, optional bearer-token authentication
(metadata ``authorization: Bearer <token>``), optional TLS and a Prometheus metrics endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import start_http_server
from pydantic import BaseModel, ConfigDict, Field

from agentpool.directory.handlers import directory_handler
from agentpool.directory.ingest import DEFAULT_MAX_MESSAGE_BYTES, ServiceLimits, resync_block_limit
from agentpool.directory.metrics import DirectoryMetrics
from agentpool.directory.redis_store import RedisBranchStore
from agentpool.directory.service import DirectoryService, ServiceTimers
from agentpool.directory.store import BranchStore, MemoryBranchStore
from agentpool.kv import DEFAULT_PAGE_SIZE, Directory

log = logging.getLogger(__name__)


class DirectoryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(50061, ge=0, le=65535)  # 0: ephemeral
    redis_url: str | None = "redis://127.0.0.1:6379/0"  # None: in-memory store (loses state on exit)
    namespace: str = "agentpool:dir"
    page_size: int = Field(DEFAULT_PAGE_SIZE, gt=0)
    idle_ttl_s: float = Field(3600.0, gt=0)
    node_timeout_s: float = Field(30.0, gt=0)
    sweep_interval_s: float = Field(1.0, gt=0)
    store_check_interval_s: float = Field(0.5, gt=0)
    max_blocks_per_request: int = Field(1 << 16, gt=0)
    max_message_bytes: int = Field(DEFAULT_MAX_MESSAGE_BYTES, ge=4096)  # also bounds resyncs
    auth_token: str | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    metrics_port: int | None = None  # None: no metrics endpoint; 0: ephemeral


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Rejects calls without ``authorization: Bearer <token>`` with UNAUTHENTICATED."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        async def deny_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
            yield None

        self._deny_unary = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_stream_rpc_method_handler(deny_stream)
        self._deny_unary_stream = grpc.unary_stream_rpc_method_handler(deny_stream)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = metadata.get("authorization")
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


class DirectoryServer:
    def __init__(self, config: DirectoryConfig, store: BranchStore | None = None) -> None:
        self.config = config
        if store is None:
            store = (
                RedisBranchStore.from_url(config.redis_url, config.namespace, config.idle_ttl_s)
                if config.redis_url
                else MemoryBranchStore()
            )
        self.store = store
        self.metrics = DirectoryMetrics()
        self.service = DirectoryService(
            Directory(config.page_size),
            store,
            self.metrics,
            ServiceLimits(
                max_blocks_per_request=config.max_blocks_per_request,
                max_resync_blocks=resync_block_limit(config.max_message_bytes),
            ),
            ServiceTimers(
                idle_ttl_s=config.idle_ttl_s,
                node_timeout_s=config.node_timeout_s,
                sweep_interval_s=config.sweep_interval_s,
                store_check_interval_s=config.store_check_interval_s,
            ),
        )
        interceptors = [TokenAuthInterceptor(config.auth_token)] if config.auth_token else []
        opts = [
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes),
        ]
        self.server = grpc.aio.server(interceptors=interceptors, options=opts)
        self.server.add_generic_rpc_handlers((directory_handler(self.service),))
        self.port = 0
        self.metrics_port: int | None = None
        self._metrics_http: Any = None

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        await self.service.start()
        addr = f"{self.config.host}:{self.config.port}"
        cert, key = self.config.tls_cert_file, self.config.tls_key_file
        if (cert is None) != (key is None):
            raise ValueError("TLS needs both tls_cert_file and tls_key_file")
        if cert is not None and key is not None:
            creds = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
            self.port = self.server.add_secure_port(addr, creds)
        else:
            self.port = self.server.add_insecure_port(addr)
        await self.server.start()
        if self.config.metrics_port is not None:
            self._metrics_http, _ = start_http_server(
                self.config.metrics_port, self.config.host, registry=self.metrics.registry
            )
            self.metrics_port = self._metrics_http.server_port
        log.info("directory serving on %s", self.address)

    async def stop(self, grace: float | None = 0.5) -> None:
        await self.server.stop(grace)
        await self.service.stop()
        await self.store.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()


def parse_args(argv: list[str] | None = None) -> DirectoryConfig:
    p = argparse.ArgumentParser(prog="python -m agentpool.directory", description="KV directory gRPC service")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50061)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="'' for an in-memory store")
    p.add_argument("--namespace", default="agentpool:dir")
    p.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE)
    p.add_argument("--idle-ttl-s", type=float, default=3600.0)
    p.add_argument("--node-timeout-s", type=float, default=30.0)
    p.add_argument("--auth-token-file", type=Path, default=None)
    p.add_argument("--tls-cert-file", type=Path, default=None)
    p.add_argument("--tls-key-file", type=Path, default=None)
    p.add_argument("--metrics-port", type=int, default=None)
    a = p.parse_args(argv)
    return DirectoryConfig(
        host=a.host,
        port=a.port,
        redis_url=a.redis_url or None,
        namespace=a.namespace,
        page_size=a.page_size,
        idle_ttl_s=a.idle_ttl_s,
        node_timeout_s=a.node_timeout_s,
        auth_token=a.auth_token_file.read_text().strip() if a.auth_token_file else None,
        tls_cert_file=a.tls_cert_file,
        tls_key_file=a.tls_key_file,
        metrics_port=a.metrics_port,
    )


async def serve(config: DirectoryConfig) -> None:
    server = DirectoryServer(config)
    await server.start()
    print(f"directory listening on {server.address}", flush=True)
    if server.metrics_port is not None:
        print(f"metrics on http://{config.host}:{server.metrics_port}/metrics", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(parse_args(argv)))
