"""Run the router: ``python -m agentpool.router --config router.yaml [--directory HOST:PORT] [...]``.

``--directory inprocess`` keeps a KV directory in this process (single-router deployments, demos);
``--directory HOST:PORT`` uses the directory service over gRPC (its bearer token from
``--directory-token-file``); ``--directory link://HOST:PORT`` over its Route link (the directory's
``--link-port``: the same operations, token and TLS files on a framed connection, less CPU on both
sides). The router runs on uvloop by default (it cut the router's CPU per
request at concurrency 1 by about a fifth, bench/results/router_cpu.md); ``--loop asyncio`` runs it
on the standard event loop.

Engine load reports (``POST /agentpool/v1/report``) need ``Authorization: Bearer <token>`` with the
token in ``--report-token-file`` (or the file named by ``$AGENTPOOL_REPORT_TOKEN_FILE``; without
either, the per-user ``report`` token file of ``agentpool.secret_file.local_tokens``, made if absent);
``--insecure-allow-unauthenticated-reports`` accepts reports from anyone.

Requests to the engines carry the pool's engine token from ``--engine-token-file`` (or the file named
by ``$AGENTPOOL_ENGINE_TOKEN_FILE``; without either, the per-user ``engine`` token file);
``--insecure-engines-without-token`` sends none and warns (engines refuse it unless they were started
with ``insecureAllowUnauthenticated``). The directory's token likewise defaults to the per-user
``directory`` file: services started by hand by one user agree on all three without flags.

A start-up refusal (an unreadable or short token, a token file others can read, a bad config or TLS
file) exits with code 2 and the reason on stderr.

Everything (the gRPC channel included) is built inside the event loop that serves: a gRPC aio
channel made before the loop runs is bound to another loop and fails every call. ``--port 0``
picks a free port; the router prints ``router listening on http://HOST:PORT`` once it serves.
SIGTERM or SIGINT stops it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agentpool.directory.auth import ConfigurationError as DirectoryTlsError
from agentpool.directory.auth import read_client_tls
from agentpool.kv import Directory
from agentpool.router.auth import (
    ENGINE_TOKEN_FILE_ENV,
    TOKEN_FILE_ENV,
    AuthConfigError,
    EngineToken,
    ReportAuth,
)
from agentpool.router.config import ConfigError, ConfigFile
from agentpool.router.directory_view import DirectoryView, InProcessDirectoryView
from agentpool.router.server import serve as serve_http
from agentpool.router.service import RouterService
from agentpool.secret_file import SecretFileError
from agentpool.secret_file.local_tokens import LocalToken, local_or_given_secret, token_file_or_local
from agentpool.secret_file.tls import TlsFilesError, server_context

log = logging.getLogger("agentpool.router")

LINK_SCHEME = "link://"


def directory_view(
    spec: str,
    page_size: int,
    token_file: Path | None = None,
    ca_file: Path | None = None,
    client_cert_file: Path | None = None,
    client_key_file: Path | None = None,
) -> DirectoryView:
    """The directory the router asks; call it inside the running event loop (gRPC channels bind to it).
    ``ca_file``: TLS, trusting that CA; ``client_cert_file``/``client_key_file``: mutual TLS."""
    if spec == "inprocess":
        if any(f is not None for f in (token_file, ca_file, client_cert_file, client_key_file)):
            raise AuthConfigError(
                "--directory-token-file and the --directory-*-file TLS files need --directory HOST:PORT"
            )
        return InProcessDirectoryView(Directory(page_size), time.monotonic)
    from agentpool.router.grpc_directory import GrpcDirectoryView

    token = local_or_given_secret(
        token_file, LocalToken.DIRECTORY, "--directory-token-file", "directory token"
    )
    if spec.startswith(LINK_SCHEME):
        from agentpool.directory.link_client import LinkClient, client_ssl_context

        tls_wanted = any(f is not None for f in (ca_file, client_cert_file, client_key_file))
        context = client_ssl_context(ca_file, client_cert_file, client_key_file) if tls_wanted else None
        try:
            client = LinkClient(spec.removeprefix(LINK_SCHEME), token=token, ssl_context=context)
        except ValueError as e:
            raise SystemExit(f"--directory: {e}") from None
        return GrpcDirectoryView(client)
    tls = read_client_tls(ca_file, client_cert_file, client_key_file)
    return GrpcDirectoryView(
        spec,
        token=token,
        root_certificates=tls.root_certificates,
        client_cert=tls.client_cert,
        client_key=tls.client_key,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agentpool.router", description=__doc__)
    p.add_argument("--config", required=True, help="router config file (YAML or JSON); reloaded on change")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000, help="0: a free port (printed)")
    p.add_argument(
        "--directory",
        default="inprocess",
        help="'inprocess', the directory's gRPC HOST:PORT, or link://HOST:PORT (its --link-port)",
    )
    p.add_argument(
        "--directory-token-file", type=Path, default=None, help="bearer token for the directory service"
    )
    p.add_argument(
        "--directory-ca-file", type=Path, default=None, help="CA certificate (PEM): use TLS to the directory"
    )
    p.add_argument(
        "--directory-client-cert-file", type=Path, default=None, help="client certificate (PEM): mutual TLS"
    )
    p.add_argument("--directory-client-key-file", type=Path, default=None, help="its private key (PEM)")
    p.add_argument(
        "--report-token-file",
        type=Path,
        default=None,
        help=f"file with the bearer token engines send with load reports (default: ${TOKEN_FILE_ENV})",
    )
    p.add_argument(
        "--insecure-allow-unauthenticated-reports",
        action="store_true",
        help="accept load reports from anyone (tests and demos only: a forged report can switch roles)",
    )
    p.add_argument(
        "--engine-token-file",
        type=Path,
        default=None,
        help=f"file with the pool's engine token, sent to the engines (default: ${ENGINE_TOKEN_FILE_ENV})",
    )
    p.add_argument(
        "--insecure-engines-without-token",
        action="store_true",
        help="call the engines without a token (tests and demos only: engines that require one refuse)",
    )
    p.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="event loop: uvloop (the default), or the standard asyncio one",
    )
    p.add_argument("--tls-cert-file", type=Path, default=None, help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-key-file", type=Path, default=None, help="its private key (PEM)")
    p.add_argument(
        "--tls-client-ca-file",
        type=Path,
        default=None,
        help="verify client certificates signed by this CA (PEM); a verified one authenticates load "
        "reports and fitted models without the report token (mutual TLS: a CA of the pool's engines "
        "and planners only)",
    )
    return p


def server_tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    """HTTPS from ``--tls-cert-file``/``--tls-key-file`` (None without them); with
    ``--tls-client-ca-file`` client certificates are asked for, optional, verified when presented."""
    if args.tls_cert_file is None and args.tls_key_file is None:
        if args.tls_client_ca_file is not None:
            raise TlsFilesError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
        return None
    if args.tls_cert_file is None or args.tls_key_file is None:
        raise TlsFilesError("--tls-cert-file and --tls-key-file go together")
    return server_context(
        args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file, "optional", "the router"
    )


def report_auth(args: argparse.Namespace, env: dict[str, str]) -> ReportAuth:
    path = args.report_token_file
    if path is None and env.get(TOKEN_FILE_ENV):
        path = Path(env[TOKEN_FILE_ENV])
    if path is not None:
        if args.insecure_allow_unauthenticated_reports:
            raise AuthConfigError(
                "give a report token file or --insecure-allow-unauthenticated-reports, not both"
            )
        return ReportAuth.token_file(path)
    if args.insecure_allow_unauthenticated_reports:
        return ReportAuth.unauthenticated()
    return ReportAuth.token_file(token_file_or_local(None, LocalToken.REPORT, "--report-token-file", env))


def engine_token(args: argparse.Namespace, env: dict[str, str]) -> EngineToken:
    """The engine token from ``--engine-token-file``, ``$AGENTPOOL_ENGINE_TOKEN_FILE`` or the per-user
    file; none only with ``--insecure-engines-without-token``."""
    path = args.engine_token_file
    if path is None and env.get(ENGINE_TOKEN_FILE_ENV):
        path = Path(env[ENGINE_TOKEN_FILE_ENV])
    if path is not None:
        if args.insecure_engines_without_token:
            raise AuthConfigError("give an engine token file or --insecure-engines-without-token, not both")
        return EngineToken.token_file(path)
    if args.insecure_engines_without_token:
        return EngineToken.unauthenticated()
    return EngineToken.token_file(token_file_or_local(None, LocalToken.ENGINE, "--engine-token-file", env))


async def serve(
    args: argparse.Namespace, auth: ReportAuth, engine_token: EngineToken, tls: ssl.SSLContext | None
) -> None:
    config_file = ConfigFile(args.config)
    config = await asyncio.to_thread(config_file.load)
    view = directory_view(
        args.directory,
        config.page_size,
        args.directory_token_file,
        args.directory_ca_file,
        args.directory_client_cert_file,
        args.directory_client_key_file,
    )
    service = RouterService(config, view, config_file=config_file, report_auth=auth, engine_auth=engine_token)
    # what start-up built (modules, pydantic schemas, config: about 60k objects) lives as long as the
    # process: out of the cyclic GC's full collections, which walked it all (about 40 ms each; 0.4 ms
    # after, bench/results/router_cpu.md); done before the server listens
    gc.collect()
    gc.freeze()
    server = await serve_http(service, args.host, args.port, ssl_context=tls)
    try:
        scheme = "http" if tls is None else "https"
        print(f"router listening on {scheme}://{args.host}:{server.port}", flush=True)
        if auth.open:
            log.warning("engine load reports are NOT authenticated (--insecure-allow-unauthenticated-*)")
        if engine_token.open:
            log.warning("requests to the engines carry NO token (--insecure-engines-without-token)")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await server.stop()
    log.info("router stopped")


def loop_factory(kind: str, parser: argparse.ArgumentParser) -> Callable[[], asyncio.AbstractEventLoop]:
    if kind == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        parser.error("uvloop is not installed (pip install uvloop), or run with --loop asyncio")
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    factory = loop_factory(args.loop, p)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        auth = report_auth(args, dict(os.environ))
        token = engine_token(args, dict(os.environ))
        tls = server_tls(args)
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(args, auth, token, tls))
    except (AuthConfigError, ConfigError, SecretFileError, DirectoryTlsError, TlsFilesError) as e:
        print(f"agentpool.router: {e}", file=sys.stderr)
        raise SystemExit(2) from e


if __name__ == "__main__":
    main()
