"""The host pool in shared memory and SGLang's L3 storage keys over it: the index (prefix, pins,
eviction, clear kept during a switch), the agent's Unix-socket server and the blocking client that
SGLang's storage backend uses (real socket, real shared-memory file, a second process mapping it)."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from agentpool.engine.errors import PoolFullError
from agentpool.engine.hostpool import HostPool
from agentpool.engine.sglang.l3_client import L3Client, L3Error
from agentpool.engine.sglang.l3_index import L3Index, key_hash, sglang_event_hash
from agentpool.engine.sglang.l3_store import SHM_NAME, L3StoreServer, prepare_run_dir
from agentpool.engine.sglang.l3_wire import MAX_FRAME, WireError, decode, encode, frame_length
from agentpool.engine.shm import ShmBuffer, ShmError

B = 256


def page(i: int) -> np.ndarray:
    return np.full(B, i % 251, dtype=np.uint8)


def test_shm_pool_is_a_private_file_a_second_process_sees(tmp_path: Path) -> None:
    path = tmp_path / "pool"
    pool = HostPool(4, B, shm_path=path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    pool.slot_view(2)[:] = 7
    code = (
        "import mmap,sys,numpy as np;f=open(sys.argv[1],'r+b');m=mmap.mmap(f.fileno(),0);"
        f"a=np.frombuffer(m,dtype=np.uint8);print(int(a[2*{B}]), int(a[{B}]));a[3*{B}]=9"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["7", "0"]
    assert pool.slot_view(3)[0] == 9  # the other process's write is in the agent's pool
    with pytest.raises(ShmError, match="exists already"):
        HostPool(4, B, shm_path=path)
    with pytest.raises(ShmError, match="bytes, 512 expected"):
        ShmBuffer(path, 512, create=False)
    pool.close()
    assert not path.exists()
    assert pool.slot_view(2)[0] == 7  # the mapping outlives the name


def test_index_prefix_pins_eviction_and_clear() -> None:
    pool = HostPool(3, B)
    ix = L3Index(pool)
    keys = ["a", "b", "c"]
    slots = ix.reserve(keys)
    assert sorted(s for s in slots if s is not None) == [0, 1, 2]
    ix.commit(keys, [s for s in slots if s is not None], now=1.0)
    assert ix.prefix(["a", "b", "x", "c"], now=2.0) == 2
    assert ix.reserve(["a", "a"]) == [None, None]  # held: nothing to write
    # a pinned key is never evicted; the least recently used unpinned one is
    assert ix.pin(["b", "zz"], now=3.0) == [slots[1], None]
    ix.prefix(["c"], now=4.0)
    new = ix.reserve(["d"])
    assert new == [slots[0]]  # "a" was the oldest
    ix.commit(["d"], [new[0] or 0], now=5.0)
    assert ix.prefix(["a"], now=6.0) == 0 and ix.prefix(["d"], now=6.0) == 1
    ix.pin(["c", "d"], now=7.0)
    with pytest.raises(PoolFullError):
        ix.reserve(["e"])
    ix.unpin(["b", "c", "d"])
    # a switch keeps everything; any other clear drops what is not pinned
    ix.switching = True
    assert ix.clear() is True and len(ix) == 3
    ix.switching = False
    assert ix.clear() is False and len(ix) == 0 and len(pool) == 0
    assert key_hash("a") != key_hash("b")


def test_wire_frames() -> None:
    f = encode({"op": "exists", "keys": ["k"]})
    assert decode(f[4:]) == {"op": "exists", "keys": ["k"]}
    assert frame_length(f[:4]) == len(f) - 4
    with pytest.raises(WireError):
        frame_length(struct.pack(">I", MAX_FRAME + 1))
    with pytest.raises(WireError):
        decode(b"[1]")
    with pytest.raises(WireError):
        decode(b"\xff")


def test_run_dir_is_private_per_process_and_stale_ones_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os;print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f"agentpool-n1.{int(dead.stdout)}"
    stale.mkdir()
    (stale / SHM_NAME).write_bytes(b"x" * 100)
    live = tmp_path / f"agentpool-n1.{os.getppid()}"  # a live process's directory stays
    live.mkdir()
    other = tmp_path / "agentpool-n2.1"  # another node's stays
    other.mkdir()
    d = prepare_run_dir(tmp_path, "n1")
    assert d == tmp_path / f"agentpool-n1.{os.getpid()}"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert not stale.exists() and live.exists() and other.exists()
    (d / SHM_NAME).write_bytes(b"y")  # this process's own leftover (a restarted container's pid)
    assert prepare_run_dir(tmp_path, "n1") == d and not (d / SHM_NAME).exists()


async def test_server_and_client_copy_pages_byte_exact(tmp_path: Path) -> None:
    d = prepare_run_dir(tmp_path, "n")
    pool = HostPool(8, B, shm_path=d / SHM_NAME)
    ix = L3Index(pool)
    server = L3StoreServer(ix, d)
    await server.start()
    assert stat.S_IMODE(server.path.stat().st_mode) == 0o600
    try:
        with pytest.raises(L3Error, match="page is 128 bytes"):
            await asyncio.to_thread(L3Client, server.path, 128)
        c = await asyncio.to_thread(L3Client, server.path, B)
        keys = [f"k{i}_m_0_1" for i in range(5)]
        assert await asyncio.to_thread(c.write, keys, [page(i) for i in range(5)]) == [True] * 5
        assert await asyncio.to_thread(c.exists, [*keys[:3], "nope", keys[4]]) == 3
        dst = [np.zeros(B, dtype=np.uint8) for _ in range(3)]
        got = await asyncio.to_thread(c.read, [keys[1], "nope", keys[4]], dst)
        assert got == [True, False, True]
        assert (dst[0] == page(1)).all() and (dst[1] == 0).all() and (dst[2] == page(4)).all()
        assert not pool.pins  # the copy's pins are gone
        with pytest.raises(L3Error, match="a page of 8 bytes"):
            c.write(["x"], [np.zeros(8, dtype=np.uint8)])
        # a connection's reservations go back when it dies mid-write
        c2 = await asyncio.to_thread(L3Client, server.path, B)
        await asyncio.to_thread(c2._call, {"op": "reserve", "keys": ["half"]})
        free = pool.free_slots
        c2.close()
        for _ in range(100):
            if pool.free_slots > free:
                break
            await asyncio.sleep(0.01)
        assert pool.free_slots == free + 1
        with pytest.raises(L3Error, match="slots this connection reserved"):
            await asyncio.to_thread(c._call, {"op": "commit", "keys": ["x"], "slots": [0]})
        with pytest.raises(L3Error, match="unknown op 'drop'"):
            await asyncio.to_thread(c._call, {"op": "drop"})
        with pytest.raises(L3Error, match="keys must be"):
            await asyncio.to_thread(c._call, {"op": "exists", "keys": "k"})
        ix.switching = True
        assert await asyncio.to_thread(c.clear) is True
        ix.switching = False
        assert await asyncio.to_thread(c.exists, keys) == 5
        assert await asyncio.to_thread(c.clear) is False
        assert await asyncio.to_thread(c.exists, keys) == 0
        # the agent goes away: the channel fails, and keeps failing at once (no half-read frames)
        await server.close()
        with pytest.raises(L3Error, match="L3 store channel"):
            await asyncio.to_thread(c.exists, keys)
        with pytest.raises(L3Error, match="closed after an earlier failure"):
            await asyncio.to_thread(c.exists, keys)
        c.close()
    finally:
        await server.close()
        pool.close()
    assert not server.path.exists()


async def test_server_refuses_another_user() -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another user")
    top = Path(tempfile.mkdtemp(prefix="l3-peer-"))  # pytest's tmp_path is closed to other users
    os.chmod(top, 0o755)
    d = prepare_run_dir(top, "n")
    os.chmod(d, 0o755)
    pool = HostPool(2, B, shm_path=d / SHM_NAME)
    server = L3StoreServer(L3Index(pool), d)
    await server.start()
    os.chmod(server.path, 0o666)  # only the peer check stands in the way now
    code = (
        "import os,socket,struct,sys;os.setuid(65534);s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1]);"
        "s.sendall(struct.pack('>I',14)+b'{\"op\":\"clear\"}');print(len(s.recv(100)))"
    )
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, str(server.path), stdout=asyncio.subprocess.PIPE
        )
        out, _ = await proc.communicate()
        assert out.strip() in (b"0", b"")  # closed at once: no answer (or a reset)
        assert server.refused == 1
    finally:
        await server.close()
        pool.close()
        shutil.rmtree(top)


def test_sglang_event_hash_is_hash_str_to_int64_of_the_page_hash() -> None:
    # SGLang 0.5.23 mem_cache/utils.py hash_str_to_int64: the first 16 hex digits, as a signed int64
    assert sglang_event_hash("0000000000000007" + "a" * 48 + "@tp0of2") == 7
    assert sglang_event_hash("ffffffffffffffff" + "0" * 48) == -1
    assert sglang_event_hash("8000000000000000" + "0" * 48) == -(1 << 63)
    assert sglang_event_hash("not-hex-at-all!!") is None and sglang_event_hash("abc") is None


def test_pages_take_the_directory_counts_of_the_blocks_their_events_map_to() -> None:
    pool = HostPool(3, B)
    ours = {7: 1007, 8: 1008}  # SGLang event hash -> our block hash (the mirror's map)
    ix = L3Index(pool, resolve=ours.get)
    keys = [f"{h:016x}" + "0" * 48 + "@tp0of1" for h in (7, 8, 9)]
    for i, k in enumerate(keys):  # written oldest first: LRU alone would evict keys[0] first
        [slot] = ix.reserve([k])
        assert slot is not None
        ix.commit([k], [slot], now=float(i))
    assert ix.aliased == 2
    pool.set_counts({1007: 5}, snapshot=True)  # the directory: our block 1007 is on 5 branches
    assert pool.counts[key_hash(keys[0])] == 5
    # eviction: zero-count pages first (keys[1], then keys[2] by age), the counted one last
    assert ix.reserve(["x" * 64]) != [None] and ix.prefix(keys[:1], now=9.0) == 1
    assert len(ix) == 2 and ix.prefix([keys[1]], now=9.0) == 0
    pool.set_counts({1007: 0}, snapshot=False)
    assert key_hash(keys[0]) not in pool.counts
    pool.set_counts({1008: 2}, snapshot=True)  # an evicted page's alias is gone with it
    assert key_hash(keys[1]) not in pool.counts and key_hash(keys[1]) not in pool.alias_of


def test_a_page_whose_event_comes_later_is_aliased_then() -> None:
    pool = HostPool(2, B)
    ours: dict[int, int] = {}
    ix = L3Index(pool, resolve=ours.get)
    k = f"{5:016x}" + "0" * 48
    [slot] = ix.reserve([k])
    ix.commit([k], [slot or 0], now=1.0)
    assert ix.aliased == 0
    ours[5] = 2005  # the mirror learns the block from SGLang's event
    ix.alias_pending()
    assert ix.aliased == 1 and pool.alias_of[key_hash(k)] == 2005
