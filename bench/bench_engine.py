"""The engine agent: host-pool fetch vs raw NIXL, switch times, overhead per request.

    python -m bench.bench_engine [--block-kib 1024] [--repeats 40] [--switches 12] [--requests 2000]
                                 [--parts fetch progress switch overhead]

1. Host-pool fetch: a peer process holds blocks in its NIXL-registered pool; this process fetches a
   prefix of N blocks as the engine does (one-sided: READs of the peer's slot table, the blocks, the
   slots' headers; index; with and without the ``sim`` backend's byte check against the block hashes),
   the previous way (``lease``: a lease on the lease channel, NIXL READ, index, release) and,
   interleaved in the same run and on the same slots, a raw NIXL READ of the same bytes. Throughput
   (GiB/s, best of the repeats) and median latency by size, with ratios; target: pool and pool+check
   >= 80% of raw (median of the paired ratios) at every size; the exit code is 1 when it is missed.
   Four fetches in flight at once as well (a queue of requests fetching their prefixes).
1b. The NIXL progress thread: CPU of an idle process holding a pool with the thread's delay at 0 (the
   nixl_agent wrapper's fixed value: the thread spins) and at the engine's delay, and the median
   latency of a small fetch from each (the delay must not slow fetches).
2. Switch times on the ``sim`` backend (an engine started from its CLI, the role flipped through its
   role file): drain excluded (``switch``) and included (``total``), idle and under load.
3. Engine overhead per request with zero-time iterations: requests per CPU second of the engine
   process (its utime+stime), against a bare aiohttp server streaming the same NDJSON events.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from agentpool.engine.hostpool import HostPool
from agentpool.engine.kv_peers import LEASE_PATH, PeerFetcher
from agentpool.engine.nixl_transport import PROGRESS_DELAY_US, NixlTransport, PoolInfo
from bench.engine_harness import (
    AUTH,
    HEADERS,
    PAGE,
    bare_server,
    chain,
    cpu_seconds,
    generate,
    pct,
    serve_pool,
    start_engine,
    start_peer,
    state,
    wait_switches,
)


# -- 1. host-pool fetch vs raw NIXL ------------------------------------------------------------------
async def bench_fetch(block_kib: int, repeats: int) -> bool:
    block_bytes = block_kib << 10
    sizes = [n for n in (4, 16, 64, 256) if n * block_bytes <= 64 << 20]
    n_max = max(sizes)
    proc, url = await start_peer(4 * n_max, block_bytes)
    pool = HostPool(4 * n_max, block_bytes)
    transport = NixlTransport("bench-local", pool.buffer, block_bytes, table=pool.table)
    await transport.start()
    hashes = chain(4 * n_max)
    met = {"pool": True, "pool+check": True}
    try:
        async with aiohttp.ClientSession() as http:
            checked = PeerFetcher(pool, transport, http, auth=AUTH, timeout_s=30.0, verify_stride=512)
            plain = PeerFetcher(pool, transport, http, auth=AUTH, timeout_s=30.0, verify=False)
            leased = PeerFetcher(pool, transport, http, auth=AUTH, timeout_s=30.0, verify=False, direct=False)
            fetchers = {"pool": plain, "pool+check": checked, "lease": leased}
            async with http.post(url + LEASE_PATH, json={"block_hashes": hashes}, headers=HEADERS) as r:
                lease = await r.json()
            peer = PoolInfo.from_json(lease["pool"])
            remote_slots = lease["slots"]
            for f in fetchers.values():
                await f.fetch_prefix(url, hashes[:1])  # open the lease channel, connect NIXL
                pool.remove(list(pool.slot_of))
            print(
                f"host-pool fetch (pool: one-sided, READs of the peer's slot table, the blocks and the "
                f"slots' headers, index; +check: the sim backend's byte check, one word per 4 KiB; lease: "
                f"the previous way, a lease on the lease channel, NIXL READ, index, release) vs raw NIXL "
                f"READ of the same slots, {block_kib} KiB blocks, {repeats} repeats (x 16 / blocks where "
                f"that is more), the four in turn (order rotated); GiB/s: best; ms: median; ratio = raw "
                f"time / fetch time: median of the per-repeat ratios (paired), and of the medians"
            )
            kinds = ["raw", "pool", "pool+check", "lease"]
            print(
                f"{'blocks':>6} {'MiB':>5} | "
                + " ".join(f"{k[-6:]:>6}" for k in kinds)
                + " GiB/s | "
                + " ".join(f"{k[-6:]:>6}" for k in kinds)
                + " ms | paired: "
                + " ".join(f"{k[-6:]:>6}" for k in kinds[1:])
                + " | of medians: "
                + " ".join(f"{k[-6:]:>6}" for k in kinds[1:])
            )
            for n in sizes:
                times: dict[str, list[float]] = {k: [] for k in kinds}
                # small fetches are quick and their ratio the noisiest (one scheduling delay is a large
                # part of a 4 MiB READ): more repeats for them (16 MiB of fetches per kind and repeat)
                for i in range(max(repeats, repeats * 16 // n)):
                    rot = i % len(kinds)
                    for kind in kinds[rot:] + kinds[:rot]:
                        f = fetchers.get(kind, plain)
                        took = await _one_fetch(kind, n, pool, transport, peer, remote_slots, f, url, hashes)
                        times[kind].append(took)
                size = n * block_bytes
                best = {k: min(v) for k, v in times.items()}
                med = {k: statistics.median(v) for k, v in times.items()}
                paired = {
                    k: statistics.median(r / t for r, t in zip(times["raw"], times[k], strict=True))
                    for k in kinds[1:]
                }
                print(
                    f"{n:>6} {size / 2**20:>5.0f} | "
                    + " ".join(f"{size / best[k] / 2**30:>6.2f}" for k in kinds)
                    + "       | "
                    + " ".join(f"{med[k] * 1e3:>6.2f}" for k in kinds)
                    + "    |         "
                    + " ".join(f"{paired[k]:>6.2f}" for k in kinds[1:])
                    + " |             "
                    + " ".join(f"{med['raw'] / med[k]:>6.2f}" for k in kinds[1:])
                )
                for k in met:
                    met[k] = met[k] and paired[k] >= 0.8
            for k, ok in met.items():
                print(
                    f"target: {k} >= 0.80 x raw (paired median) at every size: {'met' if ok else 'NOT met'}"
                )
            for k in ("pool", "pool+check"):
                f = fetchers[k]
                print(f"{k}: {f.direct_reads} one-sided reads, fallbacks to a lease: {f.fallbacks or 'none'}")
            await lease_round_trips(http, plain, url, hashes[: sizes[0]], repeats)
            await concurrent_fetches(checked, transport, peer, url, hashes, remote_slots, repeats)
            for f in fetchers.values():
                await f.close()
    finally:
        proc.kill()
        await proc.wait()
        await transport.close()
    return met["pool"] and met["pool+check"]


async def lease_round_trips(
    http: aiohttp.ClientSession, fetcher: PeerFetcher, url: str, hashes: list[int], repeats: int
) -> None:
    """The fixed cost of a fetch: a lease of ``hashes`` and its release, on the channel and on HTTP."""
    ch = await fetcher._channel(url)
    chan: list[float] = []
    http_t: list[float] = []
    for _ in range(repeats * 5):
        t0 = time.perf_counter()
        lease = await ch.call({"op": "lease", "block_hashes": hashes, "ttl_s": 30.0}, 30.0)
        chan.append(time.perf_counter() - t0)
        ch.send({"op": "release", "lease": lease["lease"]})
        t0 = time.perf_counter()
        async with http.post(url + LEASE_PATH, json={"block_hashes": hashes}, headers=HEADERS) as r:
            lease = await r.json()
        http_t.append(time.perf_counter() - t0)
        async with http.delete(f"{url}{LEASE_PATH}/{lease['lease']}", headers=HEADERS) as r:
            await r.read()
        await asyncio.sleep(0.001)
    print(
        f"lease of {len(hashes)} blocks, {repeats * 5} interleaved, 1 ms apart: lease channel median "
        f"{statistics.median(chan) * 1e3:.2f} ms (p10 {pct(chan, 10) * 1e3:.2f}); HTTP POST (the previous "
        f"way, plus a DELETE per fetch) median {statistics.median(http_t) * 1e3:.2f} ms (p10 "
        f"{pct(http_t, 10) * 1e3:.2f})"
    )


async def _one_fetch(
    kind: str,
    n: int,
    pool: HostPool,
    transport: NixlTransport,
    peer: PoolInfo,
    remote_slots: list[int],
    fetcher: PeerFetcher,
    url: str,
    hashes: list[int],
) -> float:
    """Seconds of one raw READ of ``n`` blocks into the slots a fetch would use, or of one fetch."""
    if kind == "raw":
        res = pool.reserve(n)
        pairs = list(zip(res.slots, remote_slots[:n], strict=True))
        t0 = time.perf_counter()
        await transport.read(peer, pairs, 30.0)
        took = time.perf_counter() - t0
        pool.release_slots(res.slots)
        return took
    t0 = time.perf_counter()
    got = await fetcher.fetch_prefix(url, hashes[:n])
    took = time.perf_counter() - t0
    assert len(got.blocks) == n and got.bytes == n * pool.block_bytes
    pool.remove(hashes[:n])
    return took


async def bench_progress(block_kib: int, repeats: int) -> None:
    """Idle CPU of a pool process by progress-thread delay, and fetch latency from each."""
    block_bytes = block_kib << 10
    n = 4
    peers = [await start_peer(n, block_bytes, d) for d in (0, PROGRESS_DELAY_US)]
    pool = HostPool(n, block_bytes)
    transport = NixlTransport("bench-progress", pool.buffer, block_bytes)
    await transport.start()
    hashes = chain(n)
    try:
        async with aiohttp.ClientSession() as http:
            fetcher = PeerFetcher(pool, transport, http, auth=AUTH, timeout_s=30.0, verify=False)
            for _, url in peers:
                await fetcher.fetch_prefix(url, hashes)
                pool.remove(hashes)
            await asyncio.sleep(1.0)
            cpu0 = [cpu_seconds(p.pid) for p, _ in peers]
            t0 = time.perf_counter()
            await asyncio.sleep(3.0)
            idle = [
                (cpu_seconds(p.pid) - c) / (time.perf_counter() - t0)
                for (p, _), c in zip(peers, cpu0, strict=True)
            ]
            lat: list[list[float]] = [[], []]
            for _ in range(repeats):
                for k, (_, url) in enumerate(peers):
                    t = time.perf_counter()
                    await fetcher.fetch_prefix(url, hashes)
                    lat[k].append(time.perf_counter() - t)
                    pool.remove(hashes)
            await fetcher.close()
    finally:
        for p, _ in peers:
            p.kill()
            await p.wait()
        await transport.close()
    print(
        f"NIXL progress thread: an idle pool process (after a fetch), and {repeats} fetches of "
        f"{n} x {block_kib} KiB from it"
    )
    for k, d in enumerate((0, PROGRESS_DELAY_US)):
        what = "0 (nixl_agent's fixed value: spins)" if d == 0 else f"{d} us (the engine's)"
        print(
            f"  delay {what:>36}: idle CPU {idle[k] * 100:5.1f}% of a core, fetch median "
            f"{statistics.median(lat[k]) * 1e3:6.2f} ms, best {min(lat[k]) * 1e3:6.2f} ms"
        )


async def concurrent_fetches(
    fetcher: PeerFetcher,
    transport: NixlTransport,
    peer: PoolInfo,
    url: str,
    hashes: list[int],
    remote_slots: list[int],
    repeats: int,
) -> None:
    """Four fetches in flight at once (several queued requests each fetching their prefix): the lease
    round trips overlap the reads, as they do in an engine with a queue."""
    pool = fetcher.pool
    print(
        f"four fetches in flight at once (different blocks), aggregate throughput, best/median of {repeats}"
    )
    print(f"{'blocks':>7} {'MiB':>6} | {'raw GiB/s':>9} {'pool GiB/s':>10} {'ratio':>5} | median ratio")
    for n in (m for m in (4, 16, 64) if 4 * m <= pool.capacity):
        parts = [hashes[k * n : (k + 1) * n] for k in range(4)]
        slots = [remote_slots[k * n : (k + 1) * n] for k in range(4)]
        raw_t: list[float] = []
        pool_t: list[float] = []
        for _ in range(repeats):
            reserved = [pool.reserve(n) for _ in range(4)]
            t0 = time.perf_counter()
            await asyncio.gather(
                *(
                    transport.read(peer, list(zip(r.slots, sl, strict=True)), 30.0)
                    for r, sl in zip(reserved, slots, strict=True)
                )
            )
            raw_t.append(time.perf_counter() - t0)
            for r in reserved:
                pool.release_slots(r.slots)
            t0 = time.perf_counter()
            await asyncio.gather(*(fetcher.fetch_prefix(url, part) for part in parts))
            pool_t.append(time.perf_counter() - t0)
            pool.remove([h for part in parts for h in part])
        size = 4 * n * peer.block_bytes
        print(
            f"{n:>7} {size / 2**20:>6.1f} | {size / min(raw_t) / 2**30:>9.2f} "
            f"{size / min(pool_t) / 2**30:>10.2f} "
            f"{min(raw_t) / min(pool_t):>5.2f} | {statistics.median(raw_t) / statistics.median(pool_t):.2f}"
        )


# -- 2. switch times ---------------------------------------------------------------------------------
def switch_roles(current: str, n: int) -> list[str]:
    """The roles to write for ``n`` switches of an engine serving ``current``: each the other one.
    (Counting from a fixed role instead made a second series after an odd first one write the role
    the engine already served, and wait for a switch that never came.)"""
    other = {"prefill": "decode", "decode": "prefill"}
    out: list[str] = []
    for _ in range(n):
        current = other[current]
        out.append(current)
    return out


async def bench_switch(tmp: Path, switches: int) -> None:
    role_file = tmp / "role"
    role_file.write_text("prefill")
    cfg = {
        "nodeId": "sw", "port": 0, "role": "prefill", "roleFile": str(role_file), "rolePollS": 0.02,
        "pageSize": PAGE, "hostKvBytes": 4096 * 4096, "blockBytes": 4096,
        "sim": {"c0": 0.02, "c1": 2e-5, "d0": 0.01, "d1": 0.0, "d2": 0.0, "chunkTokens": 2048},
    }  # fmt: skip
    proc, url = await start_engine(tmp, cfg)
    try:
        async with aiohttp.ClientSession() as http:
            for load in (False, True):
                stop = asyncio.Event()
                workers: list[asyncio.Task[None]] = []
                if load:

                    async def worker(w: int, stop: asyncio.Event) -> None:
                        i = 0
                        while not stop.is_set():
                            i += 1
                            role = (await state(http, url))["role"]
                            phase = "prefill" if role == "prefill" else "decode"
                            if phase == "prefill":
                                await generate(http, url, f"w{w}-{i}", list(range(w, w + 512)), phase, 1)
                            else:
                                await asyncio.sleep(0.01)

                    workers = [asyncio.create_task(worker(w, stop)) for w in range(8)]
                    await asyncio.sleep(0.3)
                before = await state(http, url)
                done0 = len(before["switches"])
                for k, role in enumerate(switch_roles(before["role"], switches)):
                    role_file.write_text(role)
                    await wait_switches(http, url, done0 + k + 1)
                    await asyncio.sleep(0.1 if load else 0.02)
                stop.set()
                for t in workers:
                    t.cancel()
                for r in await asyncio.gather(*workers, return_exceptions=True):
                    if isinstance(r, Exception):  # not CancelledError (a BaseException): a failed worker
                        raise r
                hist = (await state(http, url))["switches"][done0:]
                total = [h["total_s"] * 1e3 for h in hist]
                drain = [h["drain_s"] * 1e3 for h in hist]
                switch = [t - d for t, d in zip(total, drain, strict=True)]
                what = "under load (8 clients of 512-token prefills)" if load else "idle"
                print(f"switch times, {what}, {len(hist)} switches (ms, from the new role seen in the file):")
                for name, xs in (
                    ("drain excluded", switch),
                    ("drain included", total),
                    ("drain alone", drain),
                ):
                    print(f"  {name:>15}: p50 {pct(xs, 50):8.2f}  p90 {pct(xs, 90):8.2f}  max {max(xs):8.2f}")
    finally:
        proc.terminate()
        await proc.wait()


# -- 3. overhead per request -------------------------------------------------------------------------
async def one(http: aiohttp.ClientSession, url: str, sem: asyncio.Semaphore, i: int) -> str:
    async with sem:
        return await generate(http, url, f"r{i}", list(range(i, i + 256)), "both", 8)


async def bench_overhead(tmp: Path, requests: int) -> None:
    cfg = {
        "nodeId": "ov", "port": 0, "role": "both", "pageSize": PAGE, "hostKvBytes": 8192 * 4096,
        "blockBytes": 4096, "maxQueue": 100000,
        "sim": {"c0": 1e-9, "c1": 0, "c2": 0, "c3": 0, "d0": 1e-9, "d1": 0, "d2": 0},  # ~zero-time
    }  # fmt: skip
    results: dict[str, float] = {}
    for name in ("bare aiohttp NDJSON", "engine (sim)"):
        proc, url = await (bare_server(tmp) if name.startswith("bare") else start_engine(tmp, cfg))
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as http:
                for i in range(20):  # warm up
                    await generate(http, url, f"warm{i}", list(range(i, i + 256)), "both", 8)
                c0, t0 = cpu_seconds(proc.pid), time.perf_counter()
                sem = asyncio.Semaphore(16)
                ends = await asyncio.gather(*(one(http, url, sem, i) for i in range(requests)))
                cpu, wall = cpu_seconds(proc.pid) - c0, time.perf_counter() - t0
                assert all(e == "done" for e in ends), set(ends)
                results[name] = requests / cpu
                print(
                    f"  {name:>20}: {requests} requests (256-token prompts, 8 tokens out), "
                    f"{cpu:.2f} CPU s, {requests / cpu:8.0f} req per CPU s, {requests / wall:7.0f} req/s wall"
                )
        finally:
            proc.terminate()
            await proc.wait()
    base, eng = results["bare aiohttp NDJSON"], results["engine (sim)"]
    print(
        f"  engine CPU per request: {1e3 / eng:.2f} ms, {base / eng:.2f}x the bare server's {1e3 / base:.2f}"
    )


async def amain(args: argparse.Namespace) -> int:
    ok = True
    if "fetch" in args.parts:
        ok = await bench_fetch(args.block_kib, args.repeats)
    if "progress" in args.parts:
        await bench_progress(args.block_kib, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        if "switch" in args.parts:
            await bench_switch(Path(tmp), args.switches)
        if "overhead" in args.parts:
            print("engine overhead per request, zero-time iterations:")
            await bench_overhead(Path(tmp), args.requests)
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_engine")
    p.add_argument(
        "--block-kib", type=int, default=1024, help="KV block size (64 tokens of a 30B MoE: ~6 MiB)"
    )
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--switches", type=int, default=12)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument(
        "--parts",
        nargs="+",
        default=["fetch", "progress", "switch", "overhead"],
        choices=["fetch", "progress", "switch", "overhead"],
    )
    p.add_argument(
        "--serve-pool", nargs=3, type=int, metavar=("BLOCKS", "BYTES", "DELAY_US"), help=argparse.SUPPRESS
    )
    args = p.parse_args()
    if args.serve_pool:
        asyncio.run(serve_pool(*args.serve_pool))
        return 0
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
