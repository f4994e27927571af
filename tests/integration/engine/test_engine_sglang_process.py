"""The engine agent with ``backend: sglang`` from its command line, launching a stand-in SGLang
(``sglang_standin.py``: SGLang's HTTP endpoints and ZMQ KV-event frames) as a real child process:
readiness, generate forwarding and streaming, KV events to the directory on Redis, load reports from
``/v1/loads``, a role switch through SGLang's endpoints that keeps the node's host blocks in the
directory, P->D bootstrap fields, and a clean stop. Plus the clear refusals where SGLang cannot run."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from engine_processes import (
    PAGE,
    engine_config,
    gen_body,
    generate,
    start_engine,
    state,
    wait_ready,
    wait_until,
)
from process_helpers import ENGINE_AUTH, Proc, free_port, launch, redis_namespace, start_directory

from agentpool.directory.client import DirectoryClient
from agentpool.kv import block_hashes
from agentpool.wire.engine import TOO_LONG

pytestmark = pytest.mark.integration
TOKEN = "s" * 32
STANDIN = str(Path(__file__).with_name("sglang_standin.py"))


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    async with redis_namespace("agentpool-engine-sglang") as ns:
        yield ns


class ReportSink:
    """Where the engine posts load reports (answers as a router does, with its router id)."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    async def report(self, r: web.Request) -> web.Response:
        self.reports.append(await r.json())
        return web.json_response({"ok": True, "router_id": "router-1"})


def sglang_section(tmp: Path, **kw: Any) -> dict[str, Any]:
    return {
        "model": "stand-in/model",
        "port": free_port(),
        "kvEventsEndpoint": f"tcp://127.0.0.1:{free_port()}",
        "bootstrapPort": 8998,
        "hostKvGib": 1,
        "launcher": [sys.executable, STANDIN, "--record", str(tmp / "argv.json"), "--load-s", "1.0"],
        "requireGpu": False,
        "loadPollS": 0.1,
        **kw,
    }


async def test_the_agent_runs_sglang_and_keeps_the_host_blocks_across_a_switch(
    tmp_path: Path, namespace: str
) -> None:
    token_file = tmp_path / "dir-token"
    token_file.write_text(TOKEN)
    directory, address = await start_directory(namespace, token_file, PAGE)
    sink = ReportSink()
    app = web.Application()
    app.router.add_post("/agentpool/v1/report", sink.report)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    router_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    role_file = tmp_path / "role"
    role_file.write_text("prefill")
    cfg = engine_config(
        "sg0",
        backend="sglang",
        role="prefill",
        roleFile=str(role_file),
        directory={"target": address, "tokenFile": str(token_file), "heartbeatS": 0.5},
        routers=[{"url": router_url}],
        sglang=sglang_section(tmp_path),
    )
    engine = await start_engine(tmp_path, cfg)
    try:
        async with aiohttp.ClientSession() as http, DirectoryClient(address, token=TOKEN) as d:
            async with http.get(engine.url + "/ready") as r:  # SGLang is still loading
                assert r.status == 503 and "SGLang" in await r.text()

            await wait_ready(http, engine, "the agent to be ready once SGLang is healthy")
            argv = json.loads((tmp_path / "argv.json").read_text())
            assert argv[argv.index("--disaggregation-mode") + 1] == "prefill"
            assert "--enable-pd-role-switch" in argv and "--enable-hierarchical-cache" in argv
            assert argv[argv.index("--page-size") + 1] == str(PAGE)
            sg = f"http://127.0.0.1:{cfg['sglang']['port']}"

            # generate: forwarded to SGLang, its cumulative stream back as our token events
            prompt = list(range(100, 100 + 6 * PAGE))
            events = await generate(http, engine.url, gen_body("c1", prompt, max_tokens=3))
            assert [e["type"] for e in events] == ["started", "token", "token", "token", "done"], events
            assert "".join(e.get("text", "") for e in events) == "w0 w1 w2 "
            usage = events[-1]["usage"]
            assert (usage["prompt_tokens"], usage["completion_tokens"]) == (24, 3)
            events = await generate(http, engine.url, gen_body("c2", prompt, max_tokens=1))
            assert events[0] == {"type": "started", "cached_tokens": 24, "fetched_tokens": 0}
            async with http.get(sg + "/standin/requests") as r:
                sent = (await r.json())["requests"][0]
            assert sent["input_ids"] == prompt and sent["sampling_params"] == {"max_new_tokens": 3}
            assert sent["stream"] is True and sent["rid"].startswith("sg0-")

            # SGLang's KV events reach the directory under our block hashes, GPU and host tiers
            ours = block_hashes(prompt, PAGE)

            async def held(gpu: int, host: int) -> bool:
                n = (await d.resolve(ours)).nodes.get("sg0")
                return n is not None and (n.gpu_blocks, n.host_blocks) == (gpu, host)

            await wait_until(lambda: held(6, 6), 20, "the directory to learn SGLang's blocks")

            # a prefill: the KV waits in SGLang's bootstrap room named by the transfer id
            events = await generate(http, engine.url, gen_body("p1", prompt, phase="prefill", max_tokens=4))
            assert [e["type"] for e in events] == ["started", "prefilled"]
            port, room = events[1]["transfer_id"].split(":")[1:]
            assert port == "8998"

            async def recorded() -> list[dict[str, Any]]:
                async with http.get(sg + "/standin/requests") as r:
                    out: list[dict[str, Any]] = (await r.json())["requests"]
                    return out

            # the prefill runs on in SGLang after "prefilled" (it waits for the decode node)
            for _ in range(100):
                if "bootstrap_room" in (await recorded())[-1]:
                    break
                await asyncio.sleep(0.05)
            sent = (await recorded())[-1]
            assert sent["bootstrap_room"] == int(room) and sent["bootstrap_port"] == 8998
            assert sent["bootstrap_host"] == "127.0.0.1" and sent["stream"] is False

            # load reports: SGLang's /v1/loads capacity, our role, per-router dispatch numbers
            await wait_until(
                lambda: _true(bool(sink.reports) and sink.reports[-1]["kv_room_tokens"] == 500000),
                10,
                "a report with SGLang's KV room",
            )
            assert sink.reports[-1]["role"] == "prefill"
            # a request SGLang holds (paused) is in the reported queue, with the router's cached tokens
            async with http.post(sg + "/pause_generation", json={"mode": "retract"}) as r:
                assert r.status == 200
            held_back = asyncio.create_task(
                generate(http, engine.url, gen_body("q1", [*prompt, 7, 8, 9], max_tokens=1, cached_tokens=24))
            )
            await wait_until(
                lambda: _true(sink.reports[-1]["queue"] == [{"request_id": "q1", "t_uc": 3, "t_c": 24}]),
                10,
                "a report with the held request queued",
            )
            async with http.post(sg + "/continue_generation", json={}) as r:
                assert r.status == 200
            assert (await held_back)[-1]["type"] == "done"
            await wait_until(lambda: _true(sink.reports[-1]["queue"] == []), 10, "an empty queue again")

            # SGLang cannot become colocated in place: the switch is refused, prefill goes on serving
            role_file.write_text("both")

            async def refused() -> bool:
                return bool((await state(http, engine.url))["switches"])

            await wait_until(refused, 20, "the refused switch")
            st = await state(http, engine.url)
            assert st["role"] == "prefill" and not st["draining"]
            assert "prefill and decode only" in st["switches"][0]["failed"]
            async with http.get(engine.url + "/ready") as r:
                assert r.status == 200  # still serving after the refused switch
            async with http.get(engine.url + "/metrics") as r:
                assert 'switch_failures_total{from_role="prefill",to_role="both"} 1.0' in await r.text()

            # the switch: drained, paused, switched, continued; the host tier stays in the directory
            role_file.write_text("decode")

            async def decode_now() -> bool:  # the role, then the switch's record (written after it)
                st = await state(http, engine.url)
                return bool(st["role"] == "decode" and st["switches"][-1].get("to") == "decode")

            await wait_until(decode_now, 20, "the switch to decode")
            async with http.get(sg + "/standin/requests") as r:
                assert (await r.json())["calls"][-3:] == ["pause", "switch:decode", "continue"]
            await wait_until(lambda: held(0, 6), 20, "the directory to drop the GPU tier only")
            st = await state(http, engine.url)
            assert st["sglang"]["kept_across_switch"] == 6 and st["switches"][-1]["to"] == "decode"
            await wait_until(
                lambda: _true(sink.reports[-1]["role"] == "decode"), 10, "a report with the new role"
            )

            # decode with another node's transfer id: SGLang gets that node's bootstrap endpoint
            kv = {"node_id": "p9", "url": "http://10.1.2.3:8080", "transfer_id": "sglang-bootstrap:8998:77"}
            events = await generate(
                http, engine.url, gen_body("d1", prompt, phase="decode", max_tokens=2, kv_source=kv)
            )
            assert [e["type"] for e in events] == ["started", "token", "token", "done"], events
            async with http.get(sg + "/standin/requests") as r:
                sent = (await r.json())["requests"][-1]
            assert (sent["bootstrap_host"], sent["bootstrap_port"], sent["bootstrap_room"]) == (
                "10.1.2.3",
                8998,
                77,
            )
            bad = dict(kv, transfer_id="not-ours")
            body = gen_body("d2", prompt, phase="decode", kv_source=bad)
            async with http.post(engine.url + "/agentpool/v1/generate", json=body, headers=ENGINE_AUTH) as r:
                assert r.status == 400 and "transfer id" in await r.text()
            pid = st["sglang"]["pid"]
        # SIGTERM: the agent stops SGLang's process group, then exits 0
        assert await engine.stop() == 0
        assert "stand-in stopped" in engine.text()
        assert "Traceback" not in engine.text(), engine.text()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        await engine.stop()
        await runner.cleanup()
        await directory.stop()


async def test_the_agent_refuses_to_run_sglang_where_it_cannot(tmp_path: Path) -> None:
    # the default launcher needs the sglang package, absent here
    cfg = engine_config("sg1", backend="sglang", sglang={"model": "m", "port": free_port()})
    path = tmp_path / "no-package.json"
    path.write_text(json.dumps(cfg))
    p = await launch("engine", "agentpool.engine", "--config", str(path))
    assert await p.proc.wait() == 2
    await p.stop()
    assert "the sglang package is not installed" in p.text(), p.text()
    # a launcher of its own, but no GPU
    cfg = engine_config("sg2", backend="sglang", sglang=sglang_section(tmp_path, requireGpu=True))
    path = tmp_path / "no-gpu.json"
    path.write_text(json.dumps(cfg))
    p = await launch("engine", "agentpool.engine", "--config", str(path))
    assert await p.proc.wait() == 2
    await p.stop()
    assert "needs an NVIDIA GPU" in p.text(), p.text()
    # no sglang section at all
    path = tmp_path / "no-section.json"
    path.write_text(json.dumps(engine_config("sg3", backend="sglang")))
    p = await launch("engine", "agentpool.engine", "--config", str(path))
    assert await p.proc.wait() == 2
    await p.stop()
    assert "needs the sglang section" in p.text(), p.text()


async def test_the_agent_stops_when_sglang_dies(tmp_path: Path) -> None:
    cfg = engine_config("sg4", backend="sglang", sglang=sglang_section(tmp_path))
    engine = await start_engine(tmp_path, cfg)
    try:
        async with aiohttp.ClientSession() as http:

            async def has_pid() -> bool:
                return (await state(http, engine.url))["sglang"]["pid"] is not None

            await wait_until(has_pid, 20, "SGLang to start")
            pid = (await state(http, engine.url))["sglang"]["pid"]
        os.kill(pid, 9)
        assert await engine.proc.wait() == 1
        assert "SGLang exited with code -9" in engine.text(), engine.text()
    finally:
        await engine.stop()


async def _true(v: bool) -> bool:
    return v


async def stream_into(
    http: aiohttp.ClientSession, engine: Proc, body: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    """POST ``body`` to the agent's generate API; each event is appended to ``events`` as it comes."""
    async with http.post(engine.url + "/agentpool/v1/generate", json=body, headers=ENGINE_AUTH) as r:
        async for line in r.content:
            events.append(json.loads(line))


async def start_slow_sglang_agent(tmp_path: Path, node: str) -> Proc:
    """An sglang-backed agent whose stand-in decodes a token per 50 ms, once it is ready."""
    launcher = sglang_section(tmp_path)["launcher"] + ["--standin-decode-s", "0.05,0"]
    cfg = engine_config(node, backend="sglang", sglang=sglang_section(tmp_path, launcher=launcher))
    engine = await start_engine(tmp_path, cfg)
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, engine, "the agent to be ready once SGLang is healthy")
    except BaseException:
        await engine.stop()
        raise
    return engine


async def test_the_agent_stops_promptly_with_requests_in_sglang(tmp_path: Path) -> None:
    """SIGINT (a stop without a drain, as a second SIGTERM is) while requests stream from SGLang: the
    agent ends its requests in SGLang before stopping it, so SGLang's server is not held open by
    them and the agent exits in seconds, not after its 30 s stop timeout and a SIGKILL (a CI run
    hung here)."""
    engine = await start_slow_sglang_agent(tmp_path, "sg5")
    try:
        async with aiohttp.ClientSession() as http:
            streams: list[asyncio.Task[list[dict[str, Any]]]] = []
            first_tokens = 0

            async def long_generate(rid: str) -> list[dict[str, Any]]:
                nonlocal first_tokens
                events: list[dict[str, Any]] = []
                body = gen_body(rid, list(range(200, 200 + 4 * PAGE)), max_tokens=2000)
                async with http.post(
                    engine.url + "/agentpool/v1/generate", json=body, headers=ENGINE_AUTH
                ) as r:
                    async for line in r.content:
                        events.append(json.loads(line))
                        if events[-1]["type"] == "token" and sum(e["type"] == "token" for e in events) == 1:
                            first_tokens += 1
                return events

            streams = [asyncio.create_task(long_generate(f"long{i}")) for i in range(3)]
            await wait_until(lambda: _true(first_tokens == 3), 20, "every request to stream")
            started = asyncio.get_running_loop().time()
            engine.proc.send_signal(signal.SIGINT)
            rc = await asyncio.wait_for(engine.proc.wait(), 60)
            took = asyncio.get_running_loop().time() - started
            ends = await asyncio.gather(*streams, return_exceptions=True)
        assert rc == 0, engine.text()
        assert took < 10, f"the agent took {took:.1f} s to stop:\n{engine.text()}"
        assert "SGLang stopped (exit code 0)" in engine.text(), engine.text()
        for events in ends:  # each request was told, not cut off silently
            assert not isinstance(events, BaseException), ends
            assert events[-1] == {"type": "error", "message": "the engine is stopping"}, events[-3:]
    finally:
        await engine.stop()


async def test_sigterm_lets_the_requests_in_sglang_finish_then_stops_it(tmp_path: Path) -> None:
    """SIGTERM, as Kubernetes sends it: the agent drains (a request streaming from SGLang finishes,
    a new one is handed back), then stops SGLang and exits 0."""
    engine = await start_slow_sglang_agent(tmp_path, "sg8")
    try:
        async with aiohttp.ClientSession() as http:
            events: list[dict[str, Any]] = []
            body = gen_body("long", list(range(200, 200 + 4 * PAGE)), max_tokens=30)
            stream = asyncio.create_task(stream_into(http, engine, body, events))
            await wait_until(lambda: _true(bool(events)), 20, "a first event")
            engine.proc.send_signal(signal.SIGTERM)
            await engine.wait_for("SIGTERM: draining", within_s=5)
            status, refused = await generate_16(http, engine, "late", 4)
            assert status == 200 and [e["type"] for e in refused] == ["requeue"], refused
            await asyncio.wait_for(stream, 20)
            assert events[-1]["type"] == "done", events[-2:]
            assert events[-1]["usage"]["completion_tokens"] == 30, events[-1]
            assert await asyncio.wait_for(engine.proc.wait(), 20) == 0, engine.text()
    finally:
        await engine.stop()
    out = engine.text()
    assert "drained: stopping" in out and "SGLang stopped (exit code 0)" in out, out


async def test_a_request_silent_in_sglang_is_logged_with_what_the_agent_knows(tmp_path: Path) -> None:
    """The stall log of the ``sim`` backend, on ``sglang`` too: SGLang retracts a streaming request
    (its KV ran short) and sends nothing for it; the agent logs the request, its SGLang rid and
    SGLang's load, and logs again when it streams once more."""
    launcher = sglang_section(tmp_path)["launcher"] + ["--standin-decode-s", "0.05,0"]
    cfg = engine_config(
        "sg6", backend="sglang", sglang=sglang_section(tmp_path, launcher=launcher), stallLogS=1.0
    )
    engine = await start_engine(tmp_path, cfg)
    sg = f"http://127.0.0.1:{cfg['sglang']['port']}"
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, engine, "the agent to be ready once SGLang is healthy")
            events: list[dict[str, Any]] = []
            body = gen_body("quiet", list(range(300, 300 + 4 * PAGE)), max_tokens=100)  # 5 s of decode
            task = asyncio.create_task(stream_into(http, engine, body, events))
            await wait_until(lambda: _true(any(e["type"] == "token" for e in events)), 20, "a first token")
            async with http.post(sg + "/standin/retract", json={"running": 0}) as r:
                assert r.status == 200
            await engine.wait_for(r"request quiet \(both, decode\) has sent nothing for", within_s=15)
            async with http.post(sg + "/standin/retract", json={"running": None}) as r:
                assert r.status == 200
            await engine.wait_for(r"request quiet \(both\) streams again after a stall", within_s=15)
            await asyncio.wait_for(task, 30)
        line = next(x for x in engine.output if "has sent nothing for" in x)
        assert "SGLang rid sg6-" in line and "tokens out, the last chunk" in line, line
        assert re.search(r"SGLang's last load: \d+ running, \d+ waiting, KV \d+ of \d+ tokens", line), line
        assert events[-1]["type"] == "done", events[-3:]
    finally:
        await engine.stop()


async def generate_16(
    http: aiohttp.ClientSession, engine: Proc, rid: str, max_tokens: int
) -> tuple[int, Any]:
    """A 16-token prompt with ``max_tokens``: (status, its events, or its error when refused)."""
    body = gen_body(rid, list(range(200, 200 + 4 * PAGE)), max_tokens=max_tokens)
    async with http.post(engine.url + "/agentpool/v1/generate", json=body, headers=ENGINE_AUTH) as r:
        if r.status != 200:
            return r.status, (await r.json())["error"]
        return r.status, [json.loads(line) async for line in r.content]


async def test_the_agent_refuses_a_request_over_sglangs_context_length(tmp_path: Path) -> None:
    """With ``sglang.contextLength`` the agent refuses a longer request itself, with a 400 whose
    error type the router turns into ``context_length_exceeded`` (SGLang would refuse it mid-stream,
    an error the router cannot tell from another); a request within it goes to SGLang."""
    section = sglang_section(tmp_path, contextLength=4 * PAGE + 10)
    engine = await start_engine(tmp_path, engine_config("sg6", backend="sglang", sglang=section))
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, engine, "the agent to be ready once SGLang is healthy")
            # as SGLang takes it: 16 + 11 is refused, 16 + 10 fits
            status, error = await generate_16(http, engine, "too-long", 11)
            assert (status, error["type"]) == (400, "ContextLengthError"), error
            assert f"more than this engine's context length of {4 * PAGE + 10}" in error["message"]
            status, events = await generate_16(http, engine, "fits", 10)
            assert status == 200 and events[-1]["type"] == "done", events[-3:]
        argv = json.loads((tmp_path / "argv.json").read_text())
        assert argv[argv.index("--context-length") + 1] == str(4 * PAGE + 10)
    finally:
        await engine.stop()


async def test_sglangs_own_refusal_for_length_reaches_the_router_as_too_long(tmp_path: Path) -> None:
    """Without ``sglang.contextLength`` the agent cannot check the length (the model's own context is
    SGLang's to know): SGLang refuses mid-stream with an error chunk, and the agent passes it on as an
    ``error`` event with status 400 and reason ``ContextLengthError``, which the router answers as
    ``context_length_exceeded``; a request within it streams."""
    launcher = sglang_section(tmp_path)["launcher"] + ["--standin-model-context", str(4 * PAGE + 10)]
    section = sglang_section(tmp_path, launcher=launcher)
    engine = await start_engine(tmp_path, engine_config("sg7", backend="sglang", sglang=section))
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, engine, "the agent to be ready once SGLang is healthy")
            status, events = await generate_16(http, engine, "too-long", 11)
            assert status == 200 and events[-1]["type"] == "error", events  # refused once streaming
            assert (events[-1]["status"], events[-1]["reason"]) == (400, TOO_LONG), events[-1]
            assert "maximum context length of" in events[-1]["message"]
            status, events = await generate_16(http, engine, "fits", 5)
            assert status == 200 and events[-1]["type"] == "done", events[-3:]
    finally:
        await engine.stop()
