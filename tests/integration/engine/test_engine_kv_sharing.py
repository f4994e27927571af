"""Two sim engines from their CLIs share KV through their host pools with real NIXL on loopback.

- B's queued request finds its prefix in A's host pool (the directory on Redis says where), READs it
  while it waits, and its prefill starts with the KV present (the fetched bytes are checked against
  their block hashes, or the fetch fails);
- a peer killed before the read: the request recomputes, counted, without hanging;
- P->D: the decode node READs the prefill node's KV under the transfer id, then decodes;
- a prefill node killed in the middle of a hand-over: the decode node prefills the prompt itself,
  counted, and the stream goes on after the first token (nothing lost, nothing repeated).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from engine_processes import PAGE, engine_config, gen_body, generate, start_engine, state, wait_until
from process_helpers import redis_namespace, start_directory

from agentpool.directory.client import DirectoryClient
from agentpool.kv import block_hashes

pytestmark = pytest.mark.integration
TOKEN = "t" * 32


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    async with redis_namespace("agentpool-engine-test") as ns:
        yield ns


async def metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_queued_request_fetches_a_peers_host_blocks_and_recomputes_when_the_peer_is_gone(
    tmp_path: Path, namespace: str
) -> None:
    token_file = tmp_path / "dir-token"
    token_file.write_text(TOKEN)
    directory, address = await start_directory(namespace, token_file, PAGE)
    dir_cfg = {"target": address, "tokenFile": str(token_file), "heartbeatS": 0.5}
    a = b = None
    try:
        a = await start_engine(tmp_path, engine_config("a", directory=dir_cfg))
        b = await start_engine(tmp_path, engine_config("b", directory=dir_cfg, peers={"a": a.url}))
        p = list(range(100, 140))  # 10 blocks
        q = list(range(500, 532))  # 8 blocks
        async with aiohttp.ClientSession() as http, DirectoryClient(address, token=TOKEN) as d:
            for rid, prompt in (("a1", p), ("a2", q)):
                events = await generate(http, a.url, gen_body(rid, prompt, max_tokens=1))
                assert events[-1]["type"] == "done"

            async def a_holds_both() -> bool:
                rp = await d.resolve(block_hashes(p, PAGE))
                rq = await d.resolve(block_hashes(q, PAGE))
                held_p, held_q = rp.nodes.get("a"), rq.nodes.get("a")  # the events may come apart
                return (
                    held_p is not None
                    and held_q is not None
                    and (held_p.host_blocks, held_q.host_blocks) == (10, 8)
                )

            await wait_until(a_holds_both, 20, "the directory to learn A's blocks")
            # B's request extends A's prefix: it READs A's 10 blocks while queued, then prefills 5 more
            events = await generate(http, b.url, gen_body("b1", [*p, *range(900, 920)], max_tokens=2))
            assert events[0] == {"type": "started", "cached_tokens": 40, "fetched_tokens": 40}, events
            assert events[-1]["type"] == "done"
            assert (
                await metric(http, b.url, 'agentpool_engine_fetch_bytes_total{kind="prefix"}') == 10 * 16384
            )
            sb = await state(http, b.url)
            assert sb["host_blocks"] == 15
            await wait_until(lambda: _no_leases(http, a.url), 10, "A's lease to be released")

            # A dies (its blocks stay in the directory until its liveness times out): B recomputes
            a.kill()
            await a.proc.wait()
            events = await asyncio.wait_for(generate(http, b.url, gen_body("b2", q, max_tokens=2)), 20)
            assert events[0]["cached_tokens"] == 0 and events[0]["fetched_tokens"] == 0
            assert events[-1]["type"] == "done"
            assert await metric(http, b.url, 'agentpool_engine_fetch_failures_total{kind="prefix"}') == 1
            assert await metric(http, b.url, "agentpool_engine_fetch_recomputed_tokens_total") == 32
        assert await b.stop() == 0
        assert "Traceback" not in b.text(), b.text()
    finally:
        for e in (a, b):
            if e is not None:
                await e.stop()
        await directory.stop()


async def _no_leases(http: aiohttp.ClientSession, url: str) -> bool:
    return bool((await state(http, url))["leases"] == 0)


async def test_prefill_to_decode_hand_over_reads_the_kv_through_nixl(tmp_path: Path) -> None:
    a = await start_engine(tmp_path, engine_config("pa", role="prefill"))
    b = await start_engine(tmp_path, engine_config("db", role="decode"))
    try:
        async with aiohttp.ClientSession() as http:
            prompt = list(range(7, 7 + 4 * 12 + 3))  # 12 full blocks and a partial page
            events = await generate(http, a.url, gen_body("r1", prompt, phase="prefill", max_tokens=4))
            assert [e["type"] for e in events] == ["started", "prefilled"]
            transfer = events[1]["transfer_id"]
            assert events[1]["text"] == "t0 "
            assert (await state(http, a.url))["leases"] == 1  # the KV waits, pinned, for its decode node
            # a decode node refuses prefill work, a prefill node decode work: handed back, not failed
            refused = await generate(http, b.url, gen_body("r9", prompt, phase="both"))
            assert [e["type"] for e in refused] == ["requeue"]

            kv = {"node_id": "pa", "url": a.url, "transfer_id": transfer}
            events = await generate(
                http, b.url, gen_body("r1", prompt, phase="decode", max_tokens=4, kv_source=kv)
            )
            assert [e["type"] for e in events] == ["token", "token", "token", "done"], events
            assert "".join(e["text"] for e in events[:-1]) == "t1 t2 t3 "
            assert (await state(http, b.url))["host_blocks"] == 12
            await wait_until(lambda: _no_leases(http, a.url), 10, "the transfer's lease to be released")
            # the transfer id is spent: a second decode of it cannot read the KV and prefills it here
            events = await generate(http, b.url, gen_body("r2", prompt, phase="decode", kv_source=kv))
            assert [e["type"] for e in events] == ["started", "token", "token", "token", "done"], events
            assert events[0]["cached_tokens"] == 48  # the 12 blocks of the first hand-over are here
            assert await metric(http, b.url, "agentpool_engine_handover_recomputed_total") == 1
            async with http.get(a.url + "/metrics") as r:
                assert "agentpool_engine_unknown_transfers_total 1.0" in await r.text()
    finally:
        await a.stop()
        await b.stop()


async def test_a_prefill_node_killed_mid_hand_over_is_recomputed_on_the_decode_node(tmp_path: Path) -> None:
    a = await start_engine(tmp_path, engine_config("pk", role="prefill"))
    b = await start_engine(tmp_path, engine_config("dk", role="decode"))
    try:
        async with aiohttp.ClientSession() as http:
            prompt = list(range(3000, 3000 + 4 * 20))  # 20 blocks
            events = await generate(http, a.url, gen_body("k1", prompt, phase="prefill", max_tokens=5))
            assert [e["type"] for e in events] == ["started", "prefilled"] and events[1]["text"] == "t0 "
            kv = {"node_id": "pk", "url": a.url, "transfer_id": events[1]["transfer_id"]}
            # the prefill node dies with the KV pinned for the decode node, before the READ
            a.kill()
            await a.proc.wait()
            events = await asyncio.wait_for(
                generate(http, b.url, gen_body("k1", prompt, phase="decode", max_tokens=5, kv_source=kv)), 30
            )
            types = [e["type"] for e in events]
            assert types == ["started", "token", "token", "token", "token", "done"], events
            assert events[0]["cached_tokens"] == 0
            # the decode continues after the prefill node's first token: t1..t4, none twice
            assert "".join(e.get("text", "") for e in events) == "t1 t2 t3 t4 "
            assert events[-1]["usage"] == {"prompt_tokens": 80, "completion_tokens": 5}
            assert await metric(http, b.url, 'agentpool_engine_fetch_failures_total{kind="handover"}') == 1
            assert await metric(http, b.url, "agentpool_engine_handover_recomputed_total") == 1
            assert await metric(http, b.url, "agentpool_engine_fetch_recomputed_tokens_total") == 80
            sb = await state(http, b.url)
            assert sb["host_blocks"] == 20 and sb["jobs"] == 0 and sb["running"] == 0
        assert await b.stop() == 0
        assert "Traceback" not in b.text(), b.text()
    finally:
        await a.stop()
        await b.stop()
