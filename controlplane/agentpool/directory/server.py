"""Run the directory: ``python -m agentpool.directory --auth-token-file F --redis-url redis://H:P/0``.

:class:`DirectoryServer` wires the core, the store, the servicer, bearer-token authentication (metadata
``authorization: Bearer <token>``, required unless ``--insecure``), optional TLS or mTLS and a
Prometheus metrics endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import grpc
from prometheus_client import start_http_server
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from agentpool.directory.auth import (
    ConfigurationError,
    TokenAuthInterceptor,
    read_token_file,
    server_credentials,
    url_has_password,
)
from agentpool.directory.handlers import directory_handler
from agentpool.directory.ingest import (
    DEFAULT_MAX_BLOCKS_PER_NODE,
    DEFAULT_MAX_BRANCHES,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_NODES,
    ServiceLimits,
    resync_block_limit,
)
from agentpool.directory.link import RouteLinkServer, server_ssl_context
from agentpool.directory.metrics import DirectoryMetrics
from agentpool.directory.redis_store import RedisBranchStore
from agentpool.directory.service import DEFAULT_NODE_TIMEOUT_S, DirectoryService, ServiceTimers
from agentpool.directory.store import BranchStore, MemoryBranchStore, StoreUnavailableError
from agentpool.kv import DEFAULT_PAGE_SIZE, Directory
from agentpool.secret_file import SecretFileError, read_secret_file
from agentpool.secret_file.local_tokens import LocalToken, token_file_or_local

REDIS_PASSWORD_ENV = "AGENTPOOL_REDIS_PASSWORD"
MIN_SERVER_TOKEN_CHARS = 16

log = logging.getLogger(__name__)


class DirectoryConfig(BaseModel):
    """Settings of one directory server. Secure by default: a bearer token is required unless
    ``insecure`` says otherwise explicitly, and the Redis password never travels in ``redis_url``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(50061, ge=0, le=65535)  # 0: ephemeral
    redis_url: str | None = "redis://127.0.0.1:6379/0"  # None: in-memory store (loses state on exit)
    redis_password: SecretStr | None = None  # from a file or the environment, never in the URL
    namespace: str = "agentpool:dir"
    page_size: int = Field(DEFAULT_PAGE_SIZE, gt=0)
    idle_ttl_s: float = Field(3600.0, gt=0)
    node_timeout_s: float = Field(DEFAULT_NODE_TIMEOUT_S, gt=0)
    sweep_interval_s: float = Field(0.5, gt=0)
    store_check_interval_s: float = Field(0.5, gt=0)
    max_blocks_per_request: int = Field(1 << 16, gt=0)
    max_message_bytes: int = Field(DEFAULT_MAX_MESSAGE_BYTES, ge=4096)  # also bounds resyncs
    max_blocks_per_node: int = Field(DEFAULT_MAX_BLOCKS_PER_NODE, gt=0)  # what one engine may index
    max_branches: int = Field(DEFAULT_MAX_BRANCHES, gt=0)  # live branches the routers may create
    max_nodes: int = Field(DEFAULT_MAX_NODES, gt=0)  # registered engines
    auth_token: SecretStr | None = None
    insecure: bool = False  # True: serve without a token (tests, a loopback-only demo)
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None  # set: require client certificates signed by it (mTLS)
    metrics_port: int | None = None  # None: no metrics endpoint; 0: ephemeral
    link_port: int | None = Field(None, ge=0, le=65535)  # the Route link (None: off; 0: ephemeral)
    loop: Literal["uvloop", "asyncio"] = "uvloop"  # the event loop main() runs the server on

    @model_validator(mode="after")
    def _secure(self) -> DirectoryConfig:
        if self.auth_token is None and not self.insecure:
            raise ValueError(
                "the directory needs a bearer token (auth_token, or --auth-token-file with the path of a "
                "mounted Secret); set insecure (--insecure) to serve without authentication"
            )
        if self.auth_token is not None and not self.auth_token.get_secret_value().strip():
            raise ValueError("auth_token is empty")
        if self.redis_url is not None and url_has_password(self.redis_url):
            raise ValueError(
                "redis_url carries a password: pass it in a file (--redis-password-file) or the "
                f"{REDIS_PASSWORD_ENV} environment variable, never in the URL"
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TLS needs both tls_cert_file and tls_key_file")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("mTLS (tls_client_ca_file) needs the server's tls_cert_file and tls_key_file")
        return self


class DirectoryServer:
    def __init__(self, config: DirectoryConfig, store: BranchStore | None = None) -> None:
        self.config = config
        if store is None:
            password = config.redis_password.get_secret_value() if config.redis_password else None
            store = (
                RedisBranchStore.from_url(config.redis_url, config.namespace, config.idle_ttl_s, password)
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
                max_blocks_per_node=config.max_blocks_per_node,
                max_branches=config.max_branches,
                max_nodes=config.max_nodes,
            ),
            ServiceTimers(
                idle_ttl_s=config.idle_ttl_s,
                node_timeout_s=config.node_timeout_s,
                sweep_interval_s=config.sweep_interval_s,
                store_check_interval_s=config.store_check_interval_s,
            ),
        )
        token = config.auth_token.get_secret_value().strip() if config.auth_token else None
        interceptors = [TokenAuthInterceptor(token)] if token else []
        opts = [
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes),
        ]
        self.server = grpc.aio.server(interceptors=interceptors, options=opts)
        self.server.add_generic_rpc_handlers((directory_handler(self.service),))
        self.port = 0
        self.metrics_port: int | None = None
        self._metrics_http: Any = None
        self.link: RouteLinkServer | None = None

    @property
    def link_address(self) -> str | None:
        return None if self.link is None else f"{self.config.host}:{self.link.port}"

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        cfg = self.config
        creds = None
        if cfg.tls_cert_file is not None and cfg.tls_key_file is not None:
            creds = server_credentials(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file)
        await self.service.start()
        addr = f"{cfg.host}:{cfg.port}"
        self.port = self.server.add_secure_port(addr, creds) if creds else self.server.add_insecure_port(addr)
        await self.server.start()
        if cfg.link_port is not None:
            context = None
            if cfg.tls_cert_file is not None and cfg.tls_key_file is not None:
                context = server_ssl_context(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file)
            token = cfg.auth_token.get_secret_value().strip() if cfg.auth_token else None
            self.link = RouteLinkServer(self.service, token, context, cfg.max_message_bytes)
            await self.link.start(cfg.host, cfg.link_port)
        if cfg.metrics_port is not None:
            self._metrics_http, _ = start_http_server(
                cfg.metrics_port, cfg.host, registry=self.metrics.registry
            )
            self.metrics_port = self._metrics_http.server_port
        if cfg.auth_token is None:
            log.warning("directory serving WITHOUT authentication (--insecure)")
        log.info("directory serving on %s", self.address)

    async def stop(self, grace: float | None = 0.5) -> None:
        if self.link is not None:
            await self.link.stop()
        await self.server.stop(grace)
        await self.service.stop()
        await self.store.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()


def parse_args(argv: list[str] | None = None) -> DirectoryConfig:
    """The config from the command line; exits with a clear message (status 2) when it is unusable."""
    p = argparse.ArgumentParser(prog="python -m agentpool.directory", description="KV directory gRPC service")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50061)
    p.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/0",
        help="'' for an in-memory store; never with a password (see --redis-password-file)",
    )
    p.add_argument(
        "--redis-password-file",
        type=Path,
        default=None,
        help=f"file holding the Redis password (a mounted Secret); or set {REDIS_PASSWORD_ENV}",
    )
    p.add_argument("--namespace", default="agentpool:dir")
    p.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE)
    p.add_argument("--idle-ttl-s", type=float, default=3600.0)
    p.add_argument(
        "--node-timeout-s",
        type=float,
        default=DEFAULT_NODE_TIMEOUT_S,
        help="purge an engine silent (no batch, no heartbeat) this long",
    )
    p.add_argument("--max-blocks-per-node", type=int, default=DEFAULT_MAX_BLOCKS_PER_NODE)
    p.add_argument("--max-branches", type=int, default=DEFAULT_MAX_BRANCHES)
    p.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES)
    p.add_argument(
        "--auth-token-file",
        type=Path,
        default=None,
        help=f"bearer token clients must send (a mounted Secret; at least {MIN_SERVER_TOKEN_CHARS} chars); "
        "default: the per-user token file (agentpool.secret_file.local_tokens), made if absent",
    )
    p.add_argument("--insecure", action="store_true", help="serve without a token (never in a cluster)")
    p.add_argument("--tls-cert-file", type=Path, default=None)
    p.add_argument("--tls-key-file", type=Path, default=None)
    p.add_argument(
        "--tls-client-ca-file", type=Path, default=None, help="require client certificates it signed (mTLS)"
    )
    p.add_argument("--metrics-port", type=int, default=None)
    p.add_argument(
        "--link-port",
        type=int,
        default=None,
        help="serve the Route link (routers' Resolve/Place on a framed connection; the same token and "
        "TLS) on this port; 0: a free one (printed)",
    )
    p.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="event loop: uvloop (the default: less CPU per Route message), or the standard asyncio one",
    )
    a = p.parse_args(argv)
    if a.redis_url and url_has_password(a.redis_url):
        p.error(
            "--redis-url must not carry a password (it would show in the process list): "
            f"use --redis-password-file or {REDIS_PASSWORD_ENV}"
        )
    if a.auth_token_file is not None and a.insecure:
        p.error("--insecure and --auth-token-file exclude each other")
    try:
        token_file = (
            None
            if a.insecure
            else token_file_or_local(a.auth_token_file, LocalToken.DIRECTORY, "--auth-token-file")
        )
        token = read_token_file(token_file, MIN_SERVER_TOKEN_CHARS) if token_file else None
        password = (
            read_secret_file(a.redis_password_file, "Redis password", min_chars=1)
            if a.redis_password_file is not None
            else os.environ.get(REDIS_PASSWORD_ENV) or None
        )
        return DirectoryConfig(
            host=a.host,
            port=a.port,
            redis_url=a.redis_url or None,
            redis_password=SecretStr(password) if password else None,
            namespace=a.namespace,
            page_size=a.page_size,
            idle_ttl_s=a.idle_ttl_s,
            node_timeout_s=a.node_timeout_s,
            max_blocks_per_node=a.max_blocks_per_node,
            max_branches=a.max_branches,
            max_nodes=a.max_nodes,
            auth_token=SecretStr(token) if token else None,
            insecure=a.insecure,
            tls_cert_file=a.tls_cert_file,
            tls_key_file=a.tls_key_file,
            tls_client_ca_file=a.tls_client_ca_file,
            metrics_port=a.metrics_port,
            link_port=a.link_port,
            loop=a.loop,
        )
    except (ConfigurationError, SecretFileError) as e:
        p.error(str(e))
    except ValidationError as e:
        p.error("; ".join(f"{'.'.join(map(str, x['loc'])) or 'config'}: {x['msg']}" for x in e.errors()))


async def serve(config: DirectoryConfig) -> None:
    server = DirectoryServer(config)
    await server.start()
    # Everything made so far (modules, gRPC and protobuf state, the agent state loaded from Redis)
    # lives as long as the process: leave it out of the garbage collector's full collections, which
    # otherwise walk it every few seconds under load, holding every RPC meanwhile
    gc.freeze()
    print(f"directory listening on {server.address}", flush=True)
    if server.metrics_port is not None:
        print(f"metrics on http://{config.host}:{server.metrics_port}/metrics", flush=True)
    if server.link_address is not None:
        print(f"directory link listening on {server.link_address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop (its transports and timers in C: the Route link's messages cost the directory less
    CPU), or the standard one."""
    if kind == "asyncio":
        return asyncio.new_event_loop
    import uvloop  # a dependency of the package

    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_args(argv)
    try:
        with asyncio.Runner(loop_factory=loop_factory(config.loop)) as runner:
            runner.run(serve(config))
    except ConfigurationError as e:
        print(f"python -m agentpool.directory: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except StoreUnavailableError as e:
        print(
            f"python -m agentpool.directory: error: cannot load the agent state from {config.redis_url}: {e}",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
