"""The router's whole request path in one process, for instruction counts (callgrind) and profiles.

``python -m bench.bench_router_inprocess [N] [--stream] [--warm W] [--loop uvloop|asyncio]``

``RouterService`` (policy ``evolving``, in-process directory, 4 nodes) behind its real
:class:`~agentpool.router.http_server.HttpServer` protocol and :class:`~agentpool.router.engine_client.
EngineClient` protocol, with fake transports at their seams: the client side feeds the bench's
request (one 300-word chat message, ``max_tokens: 1``) to the server protocol on 4 connections, one
request in flight on each; the engine side answers every ``generate`` with the instant engine's three
events in one read. No sockets, no other process: what is counted is the router's own work.

With ``--warm W`` it serves ``W`` requests first and then runs ``callgrind_control -i on`` on itself,
and ``-i off`` after the ``N`` measured ones: run it under ``valgrind --tool=callgrind
--instr-atstart=no`` (the python binary itself, not a shim), for ``N`` = 100 and 600, and take
(Ir(600) - Ir(100)) / 500 as the instructions per request (bench/results/router_cpu.md, round of
2026-12-03 evening).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

from agentpool.kv import Directory
from agentpool.router import engine_client
from agentpool.router.auth import ReportAuth
from agentpool.router.config import parse_config
from agentpool.router.directory_view import InProcessDirectoryView
from agentpool.router.http_server import HttpServer
from agentpool.router.http_server import _Connection as ServerConnection
from agentpool.router.server import build_routes
from agentpool.router.service import RouterService

EVENTS = b"".join(
    json.dumps(e).encode() + b"\n"
    for e in (
        {"type": "started"},
        {"type": "token", "text": "ok"},
        {"type": "done", "finish_reason": "stop", "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
    )
)
ENGINE_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nContent-Length: %d\r\n"
    b"Date: Thu, 03 Dec 2026 18:00:00 GMT\r\nServer: Python/3.11 aiohttp/3.9\r\n\r\n%s"
    % (len(EVENTS), EVENTS)
)


def client_request(stream: bool) -> bytes:
    """The bench load generator's request (aiohttp's headers)."""
    body: dict[str, object] = {
        "model": "bench",
        "messages": [{"role": "user", "content": "word " * 300}],
        "max_tokens": 1,
    }
    if stream:
        body["stream"] = True
    raw = json.dumps(body).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
        b"User-Agent: Python/3.11 aiohttp/3.9\r\n"
        b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw)
    )


class _Transport:
    """The transport methods the two protocols call."""

    def __init__(self) -> None:
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


class EngineTransport(_Transport):
    """An engine that answers each request at once, in one read."""

    def __init__(self, loop: asyncio.AbstractEventLoop, proto: engine_client._Connection) -> None:
        super().__init__()
        self.loop, self.proto = loop, proto

    def write(self, data: bytes) -> None:
        self.loop.call_soon(self.proto.data_received, ENGINE_ANSWER)


class ClientTransport(_Transport):
    """A client that sends its next request when the answer to the last one is whole."""

    def __init__(self, on_answer: Callable[[ClientTransport], None], stream: bool) -> None:
        super().__init__()
        self.on_answer, self.stream = on_answer, stream
        self.buf = b""

    def write(self, data: bytes) -> None:
        self.buf += data
        if self.stream:
            if self.buf.endswith(b"0\r\n\r\n"):
                self.buf = b""
                self.on_answer(self)
            return
        head, sep, rest = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return
        i = head.find(b"Content-Length: ")
        j = head.find(b"\r\n", i)
        if len(rest) < int(head[i + 16 : j if j >= 0 else len(head)]):
            return
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"the router answered {self.buf[:400]!r}")
        self.buf = b""
        self.on_answer(self)


def callgrind(switch: str) -> None:
    """Instrumentation on or off (the loop waits for it on purpose: nothing may run meanwhile)."""
    subprocess.run(
        ["callgrind_control", "-i", switch, str(os.getpid())], check=True, stdout=subprocess.DEVNULL
    )


async def run(n: int, warm: int, stream: bool) -> float:
    """CPU seconds per request of the ``n`` measured requests (after ``warm`` unmeasured ones)."""
    loop = asyncio.get_running_loop()
    nodes = [{"id": f"e{i}", "url": f"http://e{i}:80", "role": "both"} for i in range(4)]
    cfg = parse_config(json.dumps({"model": "bench", "policy": "evolving", "nodes": nodes}), "json")
    service = RouterService(
        cfg,
        InProcessDirectoryView(Directory(cfg.page_size), time.monotonic),
        report_auth=ReportAuth.unauthenticated(),
    )

    async def connect(_target: object) -> engine_client._Connection:
        conn = engine_client._Connection()
        conn.connection_made(EngineTransport(loop, conn))  # type: ignore[arg-type]
        return conn

    service.engines._connect = connect  # type: ignore[method-assign,assignment]
    await service.start()
    http = HttpServer(
        build_routes(service),
        max_body_bytes=lambda: service.config.max_body_bytes,
        body_timeout_s=lambda: service.config.timeouts.body_s,
    )
    request = client_request(stream)
    left = warm + n
    warmed = loop.create_future()
    done = loop.create_future()
    conns: dict[int, ServerConnection] = {}

    def on_answer(t: ClientTransport) -> None:
        nonlocal left
        left -= 1
        if left == n and not warmed.done():
            warmed.set_result(None)
        if left <= 0:
            if not done.done():
                done.set_result(None)
        elif left >= 4:
            loop.call_soon(conns[id(t)].data_received, request)

    gc.collect()
    gc.freeze()  # as the router CLI does once built
    for _ in range(4):
        conn = ServerConnection(http)
        t = ClientTransport(on_answer, stream)
        conns[id(t)] = conn
        conn.connection_made(t)  # type: ignore[arg-type]
        loop.call_soon(conn.data_received, request)
    if warm:
        await warmed
        callgrind("on")
    t0 = time.process_time()
    await done
    used = time.process_time() - t0
    if warm:
        callgrind("off")
    await service.close()
    return used / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("n", type=int, nargs="?", default=600, help="measured requests")
    p.add_argument(
        "--warm", type=int, default=0, help="unmeasured requests first; then callgrind_control -i on"
    )
    p.add_argument("--stream", action="store_true", help="streamed answers (SSE)")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = p.parse_args()
    if args.loop == "uvloop":
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    else:
        factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        per_request = runner.run(run(args.n, args.warm, args.stream))
    print(f"{args.n} requests, {per_request * 1e6:.1f} us CPU per request", file=sys.stderr)


if __name__ == "__main__":
    main()
