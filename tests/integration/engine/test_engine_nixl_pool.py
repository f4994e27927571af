"""Real NIXL (UCX, DRAM) between two processes on loopback: B reads A's host blocks; failures surface."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from process_helpers import ENGINE_AUTH, ENGINE_TOKEN

from agentpool.engine.blockdata import block_matches
from agentpool.engine.errors import FetchError
from agentpool.engine.hostpool import HostPool
from agentpool.engine.kv_peers import CHANNEL_PATH, LEASE_PATH, KvExporter, PeerFetcher
from agentpool.engine.lease_channel import LeaseChannel, frame, read_frame
from agentpool.engine.nixl_transport import NixlTransport, PoolInfo
from agentpool.engine.shm import ShmBuffer
from agentpool.kv import ROOT_HASH
from agentpool.secret_file import BearerAuth

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent
BLOCK_BYTES = 16 << 10
AUTH = BearerAuth.token(ENGINE_TOKEN)


def start_peer(blocks: int, *extra: str) -> tuple[subprocess.Popen[str], str, list[int]]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "pool_peer.py"), str(blocks), str(BLOCK_BYTES), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "POOL_PEER_TOKEN": ENGINE_TOKEN},
    )
    assert proc.stdout is not None
    line = "NIXL logs on stdout"
    while line and not line.startswith("{"):
        line = proc.stdout.readline()
    assert line, "the peer process printed no address"
    info = json.loads(line)
    return proc, info["url"], info["hashes"]


@pytest.fixture
def peer() -> Iterator[tuple[subprocess.Popen[str], str, list[int]]]:
    proc, url, hashes = start_peer(40)
    yield proc, url, hashes
    proc.kill()
    proc.wait()


@pytest.fixture
async def local() -> AsyncIterator[tuple[HostPool, PeerFetcher]]:
    pool = HostPool(64, BLOCK_BYTES)
    transport = NixlTransport("local", pool.buffer, BLOCK_BYTES)
    await transport.start()
    async with aiohttp.ClientSession() as session:
        yield pool, PeerFetcher(pool, transport, session, auth=AUTH, timeout_s=3.0)
    await transport.close()


async def test_b_reads_a_blocks_and_bytes_match(peer, local) -> None:  # type: ignore[no-untyped-def]
    _, url, hashes = peer
    pool, fetcher = local
    wanted = [*hashes[:30], 12345]  # the peer holds 30 leading blocks of this path
    res = await fetcher.fetch_prefix(url, wanted)
    assert fetcher.fallbacks == {"not_indexed": 1}  # 12345 is not in the peer's table: a lease
    assert res.blocks == hashes[:30]
    assert res.bytes == 30 * BLOCK_BYTES
    assert pool.held_prefix(hashes) == 30
    for h in hashes[:30]:
        assert block_matches(pool.slot_view(pool.slot_of[h]), h)
    assert pool.parent_of[hashes[5]] == hashes[4]
    # a second fetch of a longer prefix reads only what is missing
    res2 = await fetcher.fetch_prefix(url, hashes)
    assert res2.held_before == 30 and res2.bytes == 10 * BLOCK_BYTES
    assert fetcher.direct_reads == 1 and fetcher.fallbacks == {"not_indexed": 1}  # one-sided
    assert all(pool.matches(h) for h in hashes)
    assert [pool.parent_of[h] for h in hashes[29:]] == hashes[28:-1]


@pytest.mark.parametrize("replaced", [0, 3])
async def test_a_block_overwritten_during_a_one_sided_read_is_detected_and_leased(  # type: ignore[no-untyped-def]
    peer, local, replaced
) -> None:
    """The peer evicts block ``replaced`` and stores another in its slot after the reader looked the
    block up in the peer's slot table and before it READs the bytes: the reader must see it in the
    slot's header, fall back to a lease, and keep no wrong bytes (the byte check is off, so only the
    slot table can catch it)."""
    _, url, hashes = peer
    pool, fetcher = local
    fetcher.verify = False
    await fetcher.fetch_prefix(url, hashes[:1])  # the channel is open, block 0 held
    pool.remove(hashes[:1])
    slots: dict[str, int] = {}

    def overwrite() -> None:  # runs on the NIXL thread between the table READ and the data READ
        fetcher.transport.after_lookup = None
        body = json.dumps({"hash": hashes[replaced], "with": 777}).encode()
        req = urllib.request.Request(url + "/test/replace", data=body, method="POST", headers=ENGINE_AUTH)
        with urllib.request.urlopen(req, timeout=5) as r:
            slots.update(json.load(r))

    fetcher.transport.after_lookup = overwrite
    res = await fetcher.fetch_prefix(url, hashes[:8])
    assert slots["old"] == slots["new"]  # the slot the reader was about to read was overwritten
    assert all(pool.matches(h) for h in list(pool.slot_of))  # no block holds another's bytes
    assert fetcher.fallbacks == {"changed": 1} and fetcher.direct_reads == 1
    assert res.blocks == hashes[:replaced]  # the lease: the peer holds the chain up to the evicted block
    assert pool.held_prefix(hashes) == replaced and len(pool) == replaced
    assert all(pool.matches(h) for h in hashes[:replaced])
    assert pool.free_slots == 64 - replaced


async def test_reads_of_scattered_slots_land_in_the_slots_named(peer, local) -> None:  # type: ignore[no-untyped-def]
    _, url, hashes = peer
    pool, fetcher = local
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + LEASE_PATH, json={"block_hashes": hashes}, headers=ENGINE_AUTH) as r,
    ):
        lease = await r.json()
    info = PoolInfo.from_json(lease["pool"])
    remote = lease["slots"]
    # runs contiguous on one side only, reversed, a gap, a single block: each block where it was asked
    pairs = [
        (10, remote[0]),
        (11, remote[2]),
        (12, remote[1]),
        (30, remote[7]),
        (29, remote[8]),
        (40, remote[39]),
    ]
    moved = await fetcher.transport.read(info, pairs, 3.0)
    assert moved == len(pairs) * BLOCK_BYTES
    by_slot = {s: h for s, h in zip(remote, lease["block_hashes"], strict=True)}
    for local_slot, remote_slot in pairs:
        assert block_matches(pool.slot_view(local_slot), by_slot[remote_slot])
    assert not pool.slot_view(13).any()  # nothing written beside them
    with pytest.raises(FetchError, match="outside"):
        await fetcher.transport.read(info, [(0, info.slots)], 3.0)


async def test_wrong_bytes_from_a_peer_are_refused() -> None:
    proc, url, hashes = start_peer(8, "--garbage")
    try:
        pool = HostPool(16, BLOCK_BYTES)
        transport = NixlTransport("local", pool.buffer, BLOCK_BYTES)
        await transport.start()
        async with aiohttp.ClientSession() as session:
            fetcher = PeerFetcher(pool, transport, session, auth=AUTH, timeout_s=3.0)
            with pytest.raises(FetchError, match="wrong bytes"):
                await fetcher.fetch_prefix(url, hashes)
        assert len(pool) == 0 and pool.free_slots == 16  # nothing indexed, every slot back
    finally:
        proc.kill()
        proc.wait()


async def test_peer_killed_mid_fetch_surfaces_an_error_without_hanging(local) -> None:  # type: ignore[no-untyped-def]
    proc, url, hashes = start_peer(20)
    pool, fetcher = local
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + LEASE_PATH, json={"block_hashes": hashes}, headers=ENGINE_AUTH) as r,
    ):
        lease = await r.json()
    assert len(lease["slots"]) == 20
    # warm the connection first so the kill lands between the lease and the read
    await fetcher.transport.read(PoolInfo.from_json(lease["pool"]), [(0, lease["slots"][0])], 3.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    info = PoolInfo.from_json(lease["pool"])
    res = pool.reserve(20)
    with pytest.raises(FetchError):
        await asyncio.wait_for(
            fetcher.transport.read(info, list(zip(res.slots, lease["slots"], strict=True)), 3.0), 10
        )
    pool.release_slots(res.slots)
    # the whole fetch path against the dead peer fails fast too
    with pytest.raises(FetchError):
        await asyncio.wait_for(fetcher.fetch_prefix(url, hashes), 10)
    assert len(pool) == 0 and pool.free_slots == 64


async def test_unknown_lease_is_a_404_with_a_message(peer) -> None:  # type: ignore[no-untyped-def]
    _, url, _ = peer
    async with aiohttp.ClientSession(headers=ENGINE_AUTH) as s:
        async with s.get(url + LEASE_PATH + "/nope") as r:
            assert r.status == 404
            assert "nope" in (await r.json())["error"]["message"]
        async with s.post(url + LEASE_PATH, data=b"{not json") as r:
            assert r.status == 400
        async with s.post(url + LEASE_PATH, json={"block_hashes": [-1]}) as r:
            assert r.status == 400


async def test_lease_channel_refuses_garbage_and_keeps_serving_others(peer, local) -> None:  # type: ignore[no-untyped-def]
    _, url, hashes = peer
    pool, fetcher = local
    async with aiohttp.ClientSession() as s, s.get(url + CHANNEL_PATH, headers=ENGINE_AUTH) as r:
        port = (await r.json())["port"]
    for bad in (b"{not json", orjson.dumps({"op": "lease", "id": 7, "block_hashes": [-1]}), b"[1, 2]"):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frame({"op": "hello", "authorization": ENGINE_AUTH["Authorization"]}))
        hello = orjson.loads(await read_frame(reader))
        assert hello["pool"]["slots"] >= 40
        writer.write(len(bad).to_bytes(4, "little") + bad)
        answer = orjson.loads(await asyncio.wait_for(read_frame(reader), 5))
        assert "bad lease request" in answer["error"] and answer["id"] in (None, 7)
        if answer["id"] is None:  # not a request at all: the server hangs up
            assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(frame({"op": "hello", "authorization": ENGINE_AUTH["Authorization"]}))
    await read_frame(reader)
    writer.write((1 << 30).to_bytes(4, "little"))  # an oversized frame
    assert "at most" in orjson.loads(await asyncio.wait_for(read_frame(reader), 5))["error"]
    writer.close()
    res = await fetcher.fetch_prefix(url, hashes[:5])  # the server still serves a well-behaved peer
    assert res.blocks == hashes[:5] and all(pool.matches(h) for h in hashes[:5])


async def test_unknown_transfer_on_the_channel_is_a_fetch_error(peer, local) -> None:  # type: ignore[no-untyped-def]
    _, url, _ = peer
    pool, fetcher = local
    with pytest.raises(FetchError, match="unknown lease or transfer"):
        await fetcher.fetch_transfer(url, "no-such-transfer")
    assert len(pool) == 0 and pool.free_slots == 64


async def test_a_stalled_peer_times_out_without_hanging(local) -> None:  # type: ignore[no-untyped-def]
    proc, url, hashes = start_peer(20)
    pool, fetcher = local
    try:
        await fetcher.fetch_prefix(url, hashes[:2])  # the channel is open
        fetcher.timeout_s = 0.5
        os.kill(proc.pid, signal.SIGSTOP)
        # a prefix read one-sidedly needs nothing of the peer's process: a stopped peer still serves
        res = await asyncio.wait_for(fetcher.fetch_prefix(url, hashes[:6]), 5)
        assert res.blocks == hashes[:6] and fetcher.direct_reads == 2 and not fetcher.fallbacks
        assert all(pool.matches(h) for h in hashes[:6])
        fetcher.direct = False  # a lease needs the peer's process: no answer
        with pytest.raises(FetchError, match="no answer"):
            await asyncio.wait_for(fetcher.fetch_prefix(url, hashes[6:]), 5)
        assert len(pool) == 6 and pool.free_slots == 58
        os.kill(proc.pid, signal.SIGCONT)
        fetcher.timeout_s = 3.0
        res = await fetcher.fetch_prefix(url, hashes)  # the same channel serves again
        assert res.held_before == 6 and len(res.blocks) == 20
        assert all(pool.matches(h) for h in hashes)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


async def test_a_read_waiting_past_its_deadline_for_the_nixl_thread_fails_unstarted(peer, local) -> None:  # type: ignore[no-untyped-def]
    """Every NIXL call runs on one thread: a read's deadline counts from when it was asked for, and a
    read the thread has not started by then fails then (and never starts), however long the thread
    stays busy. Before, each queued read got a fresh deadline once the thread reached it, so reads
    behind a slow or hung one kept hand-overs waiting, silent, far past the timeout."""
    _, url, hashes = peer
    _, fetcher = local
    await fetcher.fetch_prefix(url, hashes[:2])  # the channel is open, the peer known to NIXL
    info = (await fetcher._channel(url)).pool
    nixl = fetcher.transport
    nixl.after_lookup = lambda: time.sleep(1.0)  # the next one-sided read holds the thread 1 s
    slow = asyncio.create_task(fetcher.fetch_prefix(url, hashes[:6]))
    await asyncio.sleep(0.3)
    assert nixl.pending == 1 and nixl.busy_since is not None
    t0 = time.monotonic()
    with pytest.raises(FetchError, match=r"timed out after 0\.3 s waiting for the NIXL thread"):
        await nixl.read(info, [(63, 0)], 0.3)
    assert time.monotonic() - t0 < 0.6  # not when the thread is free again, 0.7 s from now
    assert nixl.busy_since is not None
    nixl.after_lookup = None
    res = await slow
    assert res.blocks == hashes[:6] and res.held_before == 2
    assert nixl.pending == 0 and nixl.busy_since is None


async def test_a_lease_answered_after_its_caller_gave_up_is_released() -> None:
    pool = HostPool(8, BLOCK_BYTES)
    pool.store_generated(ROOT_HASH, [11, 12, 13], 0.0)
    transport = NixlTransport("exporter", pool.buffer, BLOCK_BYTES)
    await transport.start()
    exporter = KvExporter(pool, transport, AUTH)
    port = await exporter.serve_channel("127.0.0.1")
    ch = await LeaseChannel.connect("127.0.0.1", port, 3.0, AUTH.header)
    try:
        with pytest.raises(FetchError, match="no answer"):
            await ch.call({"op": "lease", "block_hashes": [11, 12, 13], "ttl_s": 60}, 0.0)
        for _ in range(200):  # the answer comes, the channel releases the lease it names
            if not exporter.leases and not pool.pins:
                break
            await asyncio.sleep(0.01)
        assert not exporter.leases and not pool.pins
        answer = await ch.call({"op": "lease", "block_hashes": [11, 12, 99], "ttl_s": 60}, 3.0)
        assert answer["block_hashes"] == [11, 12] and answer["slots"] == pool.slots([11, 12])
        assert pool.pins == {11: 1, 12: 1}
    finally:
        ch.close()
        await exporter.close()
        await transport.close()


async def test_peer_killed_with_an_open_channel_fails_fast(local) -> None:  # type: ignore[no-untyped-def]
    proc, url, hashes = start_peer(20)
    pool, fetcher = local
    await fetcher.fetch_prefix(url, hashes[:2])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with pytest.raises(FetchError):
        await asyncio.wait_for(fetcher.fetch_prefix(url, hashes), 10)
    assert len(pool) == 2 and pool.free_slots == 62


async def test_no_room_in_the_local_pool_is_a_fetch_error(peer, local) -> None:  # type: ignore[no-untyped-def]
    _, url, hashes = peer
    pool, fetcher = local
    mine = list(range(1, 65))
    pool.store_generated(ROOT_HASH, mine, 0.0)
    pool.pin(mine)  # every slot pinned: nothing can be evicted to make room
    with pytest.raises(FetchError, match="no room"):
        await fetcher.fetch_prefix(url, hashes[:4])
    pool.unpin(mine)
    assert len(pool) == 64 and pool.free_slots == 0
    res = await fetcher.fetch_prefix(url, hashes[:4])  # the peer's lease was released: it serves again
    assert res.blocks == hashes[:4]


async def test_a_failed_fetch_names_the_blocks_it_evicted(local) -> None:  # type: ignore[no-untyped-def]
    proc, url, hashes = start_peer(20)
    pool, fetcher = local
    await fetcher.fetch_prefix(url, hashes[:2])  # the channel is open
    pool.store_generated(ROOT_HASH, list(range(1, 63)), 0.0)  # the pool is full
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with pytest.raises(FetchError) as info:
        await asyncio.wait_for(fetcher.fetch_prefix(url, hashes), 10)
    evicted = info.value.evicted  # made room for 18 blocks, then the READ failed: the caller reports them
    assert len(evicted) == 18 and not any(h in pool for h in evicted)
    assert len(pool) == 46 and pool.free_slots == 18


async def test_a_pool_in_shared_memory_is_registered_and_read_into_by_nixl(peer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The sglang backend's pool (keepHostKv) lives in a shared-memory file: NIXL registers that
    mapping as DRAM, READs land in it, and another mapping of the file (SGLang's) sees the bytes."""
    _, url, hashes = peer
    pool = HostPool(64, BLOCK_BYTES, shm_path=tmp_path / "hostpool")
    transport = NixlTransport("local-shm", pool.buffer, BLOCK_BYTES)
    await transport.start()
    try:
        async with aiohttp.ClientSession() as session:
            fetcher = PeerFetcher(pool, transport, session, auth=AUTH, timeout_s=3.0)
            res = await fetcher.fetch_prefix(url, hashes[:20])
            assert res.blocks == hashes[:20]
            await fetcher.close()
        other = ShmBuffer(tmp_path / "hostpool", 64 * BLOCK_BYTES, create=False)
        for h in hashes[:20]:
            s = pool.slot_of[h]
            assert block_matches(other.array[s * BLOCK_BYTES : (s + 1) * BLOCK_BYTES], h)
    finally:
        await transport.close()
        pool.close()
