"""The engine client's line reader and the router's small hot-path helpers (no network)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import deque
from typing import cast

import aiohttp
import pytest

from agentpool.router.__main__ import loop_factory
from agentpool.router.engine_lines import MAX_EVENT_BYTES
from agentpool.router.engine_lines import EventLines as _Lines
from agentpool.router.metrics import RouterMetrics


class FakeContent:
    """``read_nowait``/``readany`` over scripted chunks; ``None`` in the script waits ``delay_s``."""

    def __init__(self, *chunks: bytes | None, delay_s: float = 0.05) -> None:
        self.script = deque(chunks)
        self.delay_s = delay_s
        self.buffered = b""
        self.waits = 0

    def read_nowait(self) -> bytes:
        while self.script and self.script[0] is not None:
            self.buffered += cast(bytes, self.script.popleft())
        data, self.buffered = self.buffered, b""
        return data

    async def readany(self) -> bytes:
        self.waits += 1
        if not self.script:
            return b""  # end of the body
        self.script.popleft()  # the pause
        await asyncio.sleep(self.delay_s)
        return self.read_nowait()


def lines_of(content: FakeContent) -> _Lines:
    return _Lines(cast(aiohttp.StreamReader, content))


async def test_lines_already_received_come_back_without_waiting() -> None:
    content = FakeContent(b'{"a":1}\n{"b":2}\n\n{"c"', b":3}\n")
    lines = lines_of(content)
    assert [await lines.next(1.0) for _ in range(4)] == [b'{"a":1}\n', b'{"b":2}\n', b"\n", b'{"c":3}\n']
    assert content.waits == 0
    assert await lines.next(1.0) == b""


async def test_a_line_split_across_pauses_is_joined() -> None:
    lines = lines_of(FakeContent(b'{"type":', None, b'"done"}\nrest', None, b"\n"))
    assert await lines.next(1.0) == b'{"type":"done"}\n'
    assert await lines.next(1.0) == b"rest\n"
    assert await lines.next(1.0) == b""


async def test_the_last_line_without_a_newline_is_returned_at_the_end() -> None:
    lines = lines_of(FakeContent(b'{"type":"done"}'))
    assert await lines.next(1.0) == b'{"type":"done"}'
    assert await lines.next(1.0) == b""


async def test_waiting_for_a_line_is_bounded_by_its_timeout() -> None:
    lines = lines_of(FakeContent(b"partial", None, b" line\n", delay_s=1.0))
    with pytest.raises(TimeoutError):
        await lines.next(0.05)


async def test_the_timeout_covers_the_whole_line_not_each_chunk() -> None:
    content = FakeContent(b"a", None, b"b", None, b"c", None, b"\n", delay_s=0.04)
    with pytest.raises(TimeoutError):
        await lines_of(content).next(0.1)  # each pause is shorter than the timeout, all three are not


async def test_a_line_over_the_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="over"):
        await lines_of(FakeContent(b"x" * (MAX_EVENT_BYTES + 1) + b"\n")).next(1.0)
    with pytest.raises(ValueError, match="over"):
        await lines_of(FakeContent(b"x" * (MAX_EVENT_BYTES + 1), None, b"\n")).next(1.0)
    ok = b"x" * (MAX_EVENT_BYTES - 1) + b"\n"
    assert await lines_of(FakeContent(ok)).next(1.0) == ok


def test_metric_children_are_memoized_and_count_like_labels() -> None:
    m = RouterMetrics()
    child = m.child(m.requests, "chat", "200")
    assert m.child(m.requests, "chat", "200") is child
    assert child is m.requests.labels("chat", "200")
    child.inc()
    m.child(m.requests, "chat", "502").inc(2)
    assert (
        m.registry.get_sample_value("agentpool_router_requests_total", {"endpoint": "chat", "code": "200"})
        == 1
    )
    assert (
        m.registry.get_sample_value("agentpool_router_requests_total", {"endpoint": "chat", "code": "502"})
        == 2
    )


def test_event_loop_flag() -> None:
    parser = argparse.ArgumentParser()
    loop = loop_factory("asyncio", parser)()
    assert isinstance(loop, asyncio.BaseEventLoop)
    loop.close()


def test_uvloop_flag_without_uvloop_is_a_clear_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    with pytest.raises(SystemExit) as exc:
        loop_factory("uvloop", argparse.ArgumentParser())
    assert exc.value.code == 2
    assert "pip install uvloop" in capsys.readouterr().err


def test_uvloop_flag_gives_a_uvloop_loop() -> None:
    uvloop = pytest.importorskip("uvloop")
    loop = loop_factory("uvloop", argparse.ArgumentParser())()
    assert isinstance(loop, uvloop.Loop)
    loop.close()
