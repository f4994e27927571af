"""The lean engine client against real loopback HTTP servers: pooling, stale connections, aborts,
broken answers and timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from agentpool.router.engine_client import EngineBusy, EngineClient, EngineFailure, EngineRejected
from agentpool.wire.engine import GenerateRequest

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
EVENTS = [{"type": "started"}, {"type": "token", "text": "a"}, {"type": "done", "finish_reason": "stop"}]


def request(i: int = 0) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"r{i}", dispatch_seq=i, phase="both", endpoint="chat", body={}, prompt_token_ids=[1, 2]
    )


async def read_request(reader: asyncio.StreamReader) -> dict[str, object] | None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return dict(json.loads(await reader.readexactly(length)))


def chunked(events: list[dict[str, object]], close: bool = False) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n"
    head += b"Connection: close\r\n\r\n" if close else b"\r\n"
    body = b""
    for e in events:
        line = json.dumps(e).encode() + b"\n"
        body += b"%x\r\n%s\r\n" % (len(line), line)
    return head + body + b"0\r\n\r\n"


@contextlib.asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A raw HTTP server on 127.0.0.1:0; yields its URL and the list of connections it accepted."""
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(len(accepted))
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        srv.close()


@pytest.fixture
async def client() -> AsyncIterator[EngineClient]:
    c = EngineClient(connect_s=1.0, first_event_s=1.0, between_events_s=1.0)
    await c.start()
    yield c
    await c.close()


async def types(client: EngineClient, url: str, i: int = 0) -> list[str]:
    return [e.type async for e in client.generate(url, request(i))]


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        await read_request(reader)
        writer.write(chunked(EVENTS))
        await writer.drain()


async def test_sequential_requests_share_one_connection(client: EngineClient) -> None:
    async with server(keep_alive) as (url, accepted):
        for i in range(5):
            assert await types(client, url, i) == ["started", "token", "done"]
            await asyncio.sleep(0.01)  # the pool takes it back once the chunked end arrived
        assert len(accepted) == 1


async def test_an_idle_connection_the_engine_closed_is_not_a_failure(client: EngineClient) -> None:
    async def one_per_connection_then_idle_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(chunked(EVENTS))  # keep-alive promised, then closed while idle
        await writer.drain()
        await asyncio.sleep(0.05)

    async with server(one_per_connection_then_idle_close) as (url, accepted):
        for i in range(3):
            assert await types(client, url, i) == ["started", "token", "done"]
            await asyncio.sleep(0.1)
        assert len(accepted) == 3


async def test_the_request_reaches_the_engine_whole(client: EngineClient) -> None:
    seen: list[dict[str, object] | None] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(chunked(EVENTS, close=True))
        await writer.drain()

    async with server(record) as (url, _):
        await types(client, url, 7)
    assert seen[0] is not None
    assert seen[0]["request_id"] == "r7" and seen[0]["prompt_token_ids"] == [1, 2]
    assert seen[0]["phase"] == "both" and seen[0]["kv_source"] is None


async def test_a_stream_the_router_stops_reading_is_not_reused(client: EngineClient) -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(chunked(EVENTS)[:-60])  # headers and the first event(s), then nothing
            await writer.drain()

    async with server(slow) as (url, accepted):
        for _ in range(2):
            async with contextlib.aclosing(client.generate(url, request())) as events:
                assert (await anext(events)).type == "started"
        assert len(accepted) == 2


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", EngineBusy),
        (b"HTTP/1.1 429 Too Many\r\nContent-Length: 0\r\n\r\n", EngineBusy),
        (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 7\r\n\r\nno good", EngineRejected),
        (b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nboom", EngineFailure),
        (b"NOT HTTP AT ALL\r\n\r\n", EngineFailure),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nnot json!!\n\n", EngineFailure),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 18\r\n\r\n" + b'{"type":"token"}\n\n', EngineFailure),
    ],
    ids=["503", "429", "400", "500", "garbage", "bad-event", "no-done"],
)
async def test_answers_map_to_the_right_error(
    client: EngineClient, answer: bytes, error: type[Exception]
) -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(0.05)

    async with server(reply) as (url, _):
        with pytest.raises(error):
            await types(client, url)


async def test_silence_times_out_and_a_closed_port_fails(client: EngineClient) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    client.first_event_s = 0.2
    async with server(silent) as (url, _):
        with pytest.raises(EngineFailure, match="timed out"):
            await types(client, url)
    with pytest.raises(EngineFailure):
        await types(client, url)  # the server is gone: connection refused


async def answered_then_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The first request on the connection answered at once, the next never."""
    await read_request(reader)
    writer.write(chunked(EVENTS))
    await writer.drain()
    await read_request(reader)
    await asyncio.sleep(10)


async def test_a_reused_connection_times_out_at_its_own_deadline(client: EngineClient) -> None:
    """One timer per connection: the one armed for the first request's wait fires during the second's
    (0.3 s later) and must not fail it early; it times out 0.5 s after its own start."""
    loop = asyncio.get_running_loop()
    client.first_event_s = 0.5
    async with server(answered_then_silent) as (url, accepted):
        assert await types(client, url) == ["started", "token", "done"]
        await asyncio.sleep(0.3)
        t0 = loop.time()
        with pytest.raises(EngineFailure, match="timed out"):
            await types(client, url, 1)
        assert loop.time() - t0 >= 0.45
        assert accepted == [0]  # the same connection


async def test_a_shorter_deadline_than_the_armed_timer_is_kept(client: EngineClient) -> None:
    loop = asyncio.get_running_loop()
    client.first_event_s = 5.0  # the first wait arms the connection's timer 5 s out
    async with server(answered_then_silent) as (url, accepted):
        assert await types(client, url) == ["started", "token", "done"]
        client.first_event_s = 0.2
        t0 = loop.time()
        with pytest.raises(EngineFailure, match="timed out"):
            await types(client, url, 1)
        assert 0.15 <= loop.time() - t0 < 1.0
        assert accepted == [0]


async def test_the_engine_token_rides_on_every_request_and_a_401_says_so() -> None:
    heads: list[bytes] = []

    async def check_token(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            heads.append(head)
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            if b"\r\nAuthorization: Bearer right-token-0123456789\r\n" in head:
                writer.write(chunked(EVENTS))
            else:
                body = b'{"error": {"type": "Unauthenticated", "message": "missing or wrong engine token"}}'
                writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    right = EngineClient(1.0, 1.0, 1.0, authorization="Bearer right-token-0123456789")
    wrong = EngineClient(1.0, 1.0, 1.0, authorization="Bearer wrong-token-0123456789")
    await right.start()
    await wrong.start()
    try:
        async with server(check_token) as (url, _):
            for i in range(2):
                assert await types(right, url, i) == ["started", "token", "done"]
            with pytest.raises(EngineFailure, match="refused the router's engine token"):
                await types(wrong, url)
        assert len(heads) == 3
    finally:
        await right.close()
        await wrong.close()
