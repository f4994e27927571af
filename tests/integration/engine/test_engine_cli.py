"""The engine agent started from its command line: streams, probes, metrics, and bad input -> 4xx."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest
from engine_processes import engine_config, gen_body, generate, start_engine, state
from process_helpers import ENGINE_AUTH, ENGINE_TOKEN, launch

from agentpool.engine.errors import FetchError
from agentpool.engine.kv_peers import CHANNEL_PATH, LEASE_PATH
from agentpool.engine.lease_channel import LeaseChannel, frame, read_frame
from agentpool.secret_file import read_secret_file
from agentpool.secret_file.local_tokens import LocalToken, local_token_file

pytestmark = pytest.mark.integration


def test_help_names_the_config_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agentpool.engine", "--help"], capture_output=True, text=True, check=True
    )
    assert "--config" in out.stdout and "NIXL" in out.stdout


async def test_a_bad_config_exits_2_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("nodeId: a\nblockBytes: 12\n")
    p = await launch("engine", "agentpool.engine", "--config", str(path))
    assert await p.proc.wait() == 2
    await p.stop()
    assert "multiple of 8" in p.text() and "Traceback" not in p.text()


async def test_generate_streams_events_and_bad_input_gets_4xx(tmp_path: Path) -> None:
    eng = await start_engine(tmp_path, engine_config("solo", maxBodyBytes=4096, sim={"defaultMaxTokens": 3}))
    try:
        async with aiohttp.ClientSession() as http:
            events = await generate(http, eng.url, gen_body("r1", list(range(10)), max_tokens=5))
            assert [e["type"] for e in events] == ["started"] + ["token"] * 5 + ["done"]
            assert "".join(e["text"] for e in events if e["type"] == "token") == "t0 t1 t2 t3 t4 "
            usage = {
                "prompt_tokens": 10,
                "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
            assert events[-1]["usage"] == usage
            # the same prompt again: its two full blocks are cached now
            events = await generate(http, eng.url, gen_body("r2", list(range(10)), max_tokens=1))
            assert events[0] == {"type": "started", "cached_tokens": 8, "fetched_tokens": 0}
            assert events[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
            st = await state(http, eng.url)
            assert st["host_blocks"] == 2 and st["gpu_blocks"] == 2 and st["jobs"] == 0

            bad_bodies: list[tuple[bytes | dict[str, object], int, str]] = [
                (b"{not json", 400, "invalid generate request"),
                ({"request_id": "x"}, 400, "dispatch_seq"),
                (gen_body("x", [1, 2], dispatch_seq=-1), 400, "dispatch_seq"),
                (gen_body("x", [1, 2], phase="sideways"), 400, "phase"),
                (gen_body("x", [], phase="both"), 400, "empty"),
                (gen_body("x", [1, 2], phase="decode"), 400, "kv_source"),
                (gen_body("x", [1, 2], max_tokens=0), 400, "max_tokens"),
                (gen_body("x", [1, 2], surprise=1), 400, "surprise"),
                (gen_body("x", [-5, 2]), 400, "token"),
                (gen_body("x", list(range(3000))), 413, ""),
            ]
            for body, status, text in bad_bodies:
                kw = {"data": body} if isinstance(body, bytes) else {"json": body}
                async with http.post(eng.url + "/agentpool/v1/generate", headers=ENGINE_AUTH, **kw) as r:
                    got = await r.text()
                    assert r.status == status, (body, r.status, got)
                    assert text in got, (body, got)
            async with http.get(
                eng.url + "/agentpool/v1/kv/lease/unknown-transfer", headers=ENGINE_AUTH
            ) as r:
                assert r.status == 404 and "unknown-transfer" in await r.text()
            async with http.get(eng.url + "/health") as r:
                assert r.status == 200
            async with http.get(eng.url + "/ready") as r:
                assert r.status == 200
            async with http.get(eng.url + "/metrics") as r:
                text = await r.text()
            for name in (
                'agentpool_engine_requests_total{outcome="done",phase="both"} 2.0',
                'agentpool_engine_bad_requests_total{reason="invalid"}',
                "agentpool_engine_unknown_transfers_total 1.0",
                'agentpool_engine_iteration_seconds_count{phase="prefill"}',
                "agentpool_engine_switch_seconds",
                "agentpool_engine_fetch_bytes_total",
                "agentpool_engine_queue_requests",
            ):
                assert name in text, name
        assert await eng.stop() == 0
        assert "Traceback" not in eng.text(), eng.text()
    finally:
        await eng.stop()


async def test_an_engine_without_a_token_file_wants_the_per_user_token_and_the_opt_out_serves_anyone(
    tmp_path: Path,
) -> None:
    cfg = engine_config("bare")
    del cfg["tokenFile"]
    bare = await start_engine(tmp_path, cfg)
    token = read_secret_file(local_token_file(LocalToken.ENGINE), "engine token")
    try:
        url, body = bare.url + "/agentpool/v1/generate", gen_body("r", [1, 2, 3])
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=body) as r:
                assert r.status == 401
            async with http.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as r:
                assert r.status == 200, await r.text()
        assert "tokenFile not given: using the per-user engine token" in bare.text(), bare.text()
    finally:
        await bare.stop()
    # the explicit opt-out serves anyone, and says so
    eng = await start_engine(tmp_path, {**cfg, "insecureAllowUnauthenticated": True})
    try:
        url, body = eng.url + "/agentpool/v1/generate", gen_body("r", [1, 2, 3])
        async with aiohttp.ClientSession() as http, http.post(url, json=body) as r:
            assert r.status == 200
        assert "NOT authenticated" in eng.text()
    finally:
        await eng.stop()


async def test_the_api_and_the_lease_channel_refuse_a_missing_or_wrong_token(tmp_path: Path) -> None:
    eng = await start_engine(tmp_path, engine_config("guarded"))
    wrong = "Bearer " + "w" * 40
    try:
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": wrong}, {"Authorization": ENGINE_TOKEN}):  # no "Bearer"
                async with http.post(
                    eng.url + "/agentpool/v1/generate", json=gen_body("r", [1, 2, 3]), headers=headers
                ) as r:
                    assert r.status == 401
                    assert "engine token" in (await r.json())["error"]["message"]
            async with http.get(eng.url + LEASE_PATH + "/some-lease") as r:
                assert r.status == 401
            async with http.post(eng.url + LEASE_PATH, json={"block_hashes": [1]}) as r:
                assert r.status == 401
            async with http.get(eng.url + CHANNEL_PATH, headers={"Authorization": wrong}) as r:
                assert r.status == 401
            for open_path in ("/health", "/ready", "/metrics", "/agentpool/v1/state"):
                async with http.get(eng.url + open_path) as r:
                    assert r.status == 200, open_path
            async with http.get(eng.url + CHANNEL_PATH, headers=ENGINE_AUTH) as r:
                port = (await r.json())["port"]

            # the lease channel: a wrong token, none, a first frame that is not a hello
            with pytest.raises(FetchError, match="refused: unauthenticated: missing or wrong engine token"):
                await LeaseChannel.connect("127.0.0.1", port, 3.0, wrong)
            with pytest.raises(FetchError, match="refused"):
                await LeaseChannel.connect("127.0.0.1", port, 3.0, None)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(frame({"op": "lease", "id": 1, "block_hashes": [1]}))
            answer = orjson.loads(await asyncio.wait_for(read_frame(reader), 5))
            assert answer["id"] is None and "not a hello" in answer["error"]
            assert await asyncio.wait_for(reader.read(), 5) == b""  # and the server hung up
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write((1 << 20).to_bytes(4, "little"))  # a big "hello": refused before it is read
            answer = orjson.loads(await asyncio.wait_for(read_frame(reader), 5))
            assert "at most 4096" in answer["error"]
            writer.close()
            # with the token it serves
            ch = await LeaseChannel.connect("127.0.0.1", port, 3.0, ENGINE_AUTH["Authorization"])
            try:
                answer = await ch.call({"op": "lease", "block_hashes": [1], "ttl_s": 1}, 3.0)
                assert answer["block_hashes"] == []
            finally:
                ch.close()

            async with http.get(eng.url + "/metrics") as r:
                text = await r.text()
            assert 'agentpool_engine_unauthenticated_total{channel="http"} 6.0' in text, text
            assert 'agentpool_engine_unauthenticated_total{channel="lease_channel"} 4.0' in text, text
    finally:
        await eng.stop()
