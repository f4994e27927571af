"""The router's lean HTTP/1.1 server on a real socket: framing, limits, keep-alive, errors.

Raw requests over ``asyncio.open_connection`` (the cases an HTTP client library would not send), plus
aiohttp as a client for the ordinary ones.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest

from agentpool.router.http_server import HttpServer, Request, Response, Routes, Stream, json_response

pytestmark = pytest.mark.integration


class Boom(RuntimeError):
    pass


@dataclass
class Served:
    server: HttpServer
    host: str
    port: int
    seen: list[Request]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def raw(self, data: bytes, *, until_close: bool = True, wait_s: float = 5.0) -> bytes:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(data)
        await writer.drain()
        try:
            if until_close:
                return await asyncio.wait_for(reader.read(), wait_s)
            return await asyncio.wait_for(reader.read(65536), wait_s)
        finally:
            writer.close()


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    seen: list[Request] = []

    async def echo(req: Request) -> Response:
        seen.append(req)
        return json_response({"method": req.method, "query": req.query, "body": req.body.decode()})

    async def ticks(req: Request) -> Stream:
        out = req.stream(b"text/event-stream")
        for i in range(3):
            await out.write(f"data: {i}\n\n".encode())
        return out

    async def fails(req: Request) -> Response:
        raise Boom("a bug in a handler")

    async def branch(req: Request) -> Response:
        return json_response({"id": req.params})

    routes = Routes()
    routes.add("POST", "/echo", echo)
    routes.add("GET", "/echo", echo)
    routes.add("GET", "/ticks", ticks)
    routes.add("GET", "/fails", fails)
    routes.add_prefix("DELETE", "/things/", branch)
    server = HttpServer(routes, max_body_bytes=lambda: 1000, body_timeout_s=lambda: 0.3, keepalive_s=0.4)
    port = await server.start("127.0.0.1", 0)
    yield Served(server, "127.0.0.1", port, seen)
    await server.stop(0.1)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def body_of(answer: bytes) -> dict[str, object]:
    payload = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert isinstance(payload, dict)
    return payload


async def test_keep_alive_routes_and_openai_errors(served: Served) -> None:
    async with aiohttp.ClientSession() as http:
        for i in range(3):  # one pooled connection, several requests
            async with http.post(served.url + "/echo?x=1", data=f"body {i}") as resp:
                assert resp.status == 200
                assert await resp.json() == {"method": "POST", "query": "x=1", "body": f"body {i}"}
        async with http.delete(served.url + "/things/abc") as resp:
            assert (await resp.json()) == {"id": "abc"}
        for method, path, status in (("PUT", "/echo", 405), ("GET", "/nope", 404), ("GET", "/things/a", 405)):
            async with http.request(method, served.url + path) as resp:
                payload = await resp.json()
                assert resp.status == status
                assert set(payload["error"]) == {"message", "type", "param", "code"}
        async with http.get(served.url + "/ticks") as resp:
            assert resp.headers["Transfer-Encoding"] == "chunked"
            assert await resp.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        async with http.head(served.url + "/echo") as resp:
            assert resp.status == 200 and await resp.read() == b""


async def test_pipelined_requests_are_answered_in_order(served: Served) -> None:
    reqs = b"".join(
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b)
        for b in (b"one", b"two", b"three")
    )
    answer = await served.raw(reqs + b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    bodies = [json.loads(part.split(b"\r\n\r\n", 1)[1]) for part in answer.split(b"HTTP/1.1 ")[1:]]
    assert [b["body"] for b in bodies] == ["one", "two", "three", ""]


async def test_chunked_request_body_and_expect_continue(served: Served) -> None:
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n"
    answer = await served.raw(head + b"Connection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert body_of(answer.split(b"\r\n\r\n", 1)[1])["body"] == "abcde"


async def test_http10_closes_unless_asked_to_keep_alive(served: Served) -> None:
    answer = await served.raw(b"GET /echo HTTP/1.0\r\n\r\n")
    assert status_of(answer) == 200 and b"Connection: close" in answer
    answer = await served.raw(b"GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", until_close=False)
    assert b"Connection: keep-alive" in answer
    answer = await served.raw(b"GET /ticks HTTP/1.0\r\n\r\n")  # streamed: no chunking, ends by closing
    assert answer.endswith(b"data: 2\n\n") and b"chunked" not in answer


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"POST /echo HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", 413, "body_too_large"),
        (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"3e8\r\n" + b"x" * 1000 + b"\r\n"
         + b"1\r\nx\r\n0\r\n\r\n", 413, "body_too_large"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414, None),
        (b"GET /echo HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431, None),
        (b"GET /echo HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n", 431, None),
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "bad_request"),
        (b"POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", 408, None),  # partial body
        (b"GET /echo HTTP/1.1\r\nHost: x\r\n", 408, None),  # headers never end
    ],
    ids=["content-length", "chunked", "url", "header-size", "header-count", "malformed", "partial", "slow"],
)  # fmt: skip
async def test_bad_requests_get_an_error_and_the_connection_closed(
    served: Served, request_bytes: bytes, status: int, code: str | None
) -> None:
    answer = await served.raw(request_bytes)  # read() to EOF: the server closes
    assert status_of(answer) == status, answer[:200]
    assert b"Connection: close" in answer
    error = body_of(answer)["error"]
    assert isinstance(error, dict) and error["type"] == "invalid_request_error"
    if code is not None:
        assert error["code"] == code
    assert not served.seen


async def test_a_failing_handler_gets_a_500_json_error_and_is_logged(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    answer = await served.raw(b"GET /fails HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(answer) == 500 and b"Connection: close" in answer
    assert body_of(answer)["error"] == {
        "message": "internal error", "type": "server_error", "param": None, "code": None
    }  # fmt: skip
    for _ in range(100):  # the task's done callback logs it
        if "request handler failed" in caplog.text:
            break
        await asyncio.sleep(0.01)
    assert "a bug in a handler" in caplog.text


async def test_idle_connections_are_closed_after_the_keepalive(served: Served) -> None:
    served.server.keepalive_s = 0.2
    reader, writer = await asyncio.open_connection(served.host, served.port)
    try:
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await asyncio.wait_for(reader.read(65536), 5)
        assert status_of(first) == 200
        rest = await asyncio.wait_for(reader.read(), 10)  # EOF once the sweep finds it idle
        assert rest == b""
    finally:
        writer.close()
