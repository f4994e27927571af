"""The directory service through gRPC on loopback, with its agent state in Redis (127.0.0.1:6379).

    python -m bench.bench_directory [--nodes 64] [--prompt 2000]

Starts ``python -m agentpool.directory`` as a separate process and measures from this one: engine
event ingest (blocks/s over one pipelined stream), Resolve p50/p99 for a 2,000-block prompt over 64
nodes, and a routed disaggregated request as the router sends it (Resolve with a branch, read-only;
Place on the chosen prefill node once it took the request; Place on a decode node when the prefill
starts) with its Redis round trips (the server's ``agentpool_directory_store_writes_total``; each store
write is one pipelined MULTI/EXEC, and the count includes every write the server made meanwhile,
sweeper included). The in-process core doing
the same work is the baseline. Target: <= 2 Redis round trips per routed request.

Resolves are measured both as unary calls and on the ``Route`` stream the router uses
(``agentpool.directory.session.DirectorySession``), interleaved, with an empty unary RPC (Health) as
the transport floor. Then CPU per routed request (``--cpu-seconds``, 0 skips it): workers route as the
router does (a Resolve with a branch, then a Place) with unary calls or on the Route stream,
interleaved, at concurrency 1 and 64, and the CPU of this process and of the directory process is
divided by the requests routed. Last, Resolve p99 during a bulk resync and purge (``--bulk-blocks``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis

from agentpool.directory.client import DirectoryClient, NodePublisher, resync_batch, stored_event
from agentpool.directory.link_client import LinkClient
from agentpool.directory.session import DirectorySession
from agentpool.directory.steps import SLICE_S
from agentpool.kv import Directory, HeldBlock, Role, Tier
from agentpool.kv.hashing import ROOT_HASH
from agentpool.kv.types import split_blocks
from agentpool.v1 import directory_pb2 as pb
from bench.directory_cpu import cpu_per_request

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = "redis://127.0.0.1:6379/0"


def pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


async def resolve_buckets(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The server's Resolve handling-time histogram: upper bound (s) -> cumulative count."""
    async with session.get(url) as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if (
            line.startswith("agentpool_directory_request_duration_seconds_bucket{")
            and 'method="Resolve"' in line
        ):
            le = line.split('le="')[1].split('"')[0]
            out[le] = float(line.split()[-1])
    return out


async def store_writes(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url) as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith('agentpool_directory_store_writes_total{outcome="ok"}'):
            return float(line.split()[-1])
    return 0.0


async def run(a: argparse.Namespace) -> None:
    ns = f"agentpool-bench:{uuid.uuid4().hex}"
    env = dict(os.environ, PYTHONPATH=str((a.directory_tree or ROOT) / "controlplane"))
    token = secrets.token_hex(16)
    token_dir = tempfile.mkdtemp(prefix="agentpool-bench-")
    token_file = Path(token_dir) / "token"
    token_file.write_text(token + "\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentpool.directory",
        "--auth-token-file",
        str(token_file),
        "--port",
        "0",
        "--redis-url",
        REDIS_URL,
        "--namespace",
        ns,
        "--metrics-port",
        "0",
        "--node-timeout-s",
        "600",
        *([] if a.no_link else ["--link-port", "0"]),
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    addr = (await proc.stdout.readline()).decode().split()[-1]
    metrics_url = (await proc.stdout.readline()).decode().split()[-1]
    link = None if a.no_link else LinkClient((await proc.stdout.readline()).decode().split()[-1], token=token)
    rng = random.Random(0)
    prompt = [rng.getrandbits(64) | 1 for _ in range(a.prompt)]
    core = Directory()
    try:
        async with DirectoryClient(addr, token=token) as client, aiohttp.ClientSession() as http:
            stream = client.open_events()
            pubs = []
            for i in range(a.nodes):
                node = f"node-{i}"
                depth = rng.randint(a.prompt // 2, a.prompt)
                held = [
                    HeldBlock(h, prompt[j - 1] if j else ROOT_HASH, Tier.GPU | Tier.HOST)
                    for j, h in enumerate(prompt[:depth])
                ]
                pub = NodePublisher(stream, node, Role.PREFILL if i % 2 == 0 else Role.DECODE)
                await pub.resync(held)
                core.register_node(node, pub.phase)
                core.resync_node(node, held, 1.0)
                pubs.append(pub)

            # event ingest: batches of one stored event of `per_event` new blocks, pipelined
            batches = []
            seq = pubs[0].seq
            for _ in range(a.batches):
                chain = [rng.getrandbits(64) | 1 for _ in range(a.per_event)]
                seq += 1
                batches.append(
                    pb.KvEventBatch(node="node-0", seq=seq, events=[stored_event(prompt[0], chain, Tier.GPU)])
                )
            t0 = time.perf_counter()
            for i in range(0, len(batches), 256):
                acks = await stream.send_many(batches[i : i + 256])
                assert not any(x.resync_requested for x in acks), acks[0]
            grpc_rate = a.batches * a.per_event / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            for b in batches:
                ev = b.events[0].stored
                core.apply_stored("node-0", ev.parent_hash, list(ev.block_hashes), Tier.GPU, 2.0)
            core_rate = a.batches * a.per_event / (time.perf_counter() - t0)
            print(
                f"gRPC events: {grpc_rate / 1e3:.0f}k blocks/s "
                f"({grpc_rate / a.per_event / 1e3:.2f}k batches/s "
                f"of {a.per_event}); in-process core {core_rate / 1e3:.0f}k blocks/s "
                f"({core_rate / grpc_rate:.1f}x)"
            )

            session = DirectorySession(client)
            linked = None if link is None else DirectorySession(link)
            buckets0 = await resolve_buckets(http, metrics_url)
            lat, streamed, base, floor, on_link = [], [], [], [], []
            for _ in range(a.resolves):  # interleaved: they all see the same machine load
                t0 = time.perf_counter()
                res = await client.resolve(prompt)
                lat.append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                answer = await session.resolve(prompt)
                streamed.append((time.perf_counter() - t0) * 1e3)
                if linked is not None:
                    t0 = time.perf_counter()
                    assert len((await linked.resolve(prompt)).nodes) == a.nodes
                    on_link.append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                core.resolve(prompt, None, 3.0)
                base.append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                await client.health()
                floor.append((time.perf_counter() - t0) * 1e3)
            assert len(res.nodes) == a.nodes and len(answer.nodes) == a.nodes
            print(
                f"Resolve ({a.prompt} blocks, {a.nodes} nodes) on the Route stream: p50 "
                f"{pct(streamed, 50):.2f} ms, p99 {pct(streamed, 99):.2f} ms (target p99 <= 2 ms: "
                f"{verdict(pct(streamed, 99) <= 2)}); unary: p50 {pct(lat, 50):.2f} ms, "
                f"p99 {pct(lat, 99):.2f} ms; "
                f"in-process core p50 {pct(base, 50):.2f} ms, p99 {pct(base, 99):.2f} ms; an empty unary RPC "
                f"(Health, the transport floor) p50 {pct(floor, 50):.2f} ms, p99 {pct(floor, 99):.2f} ms"
            )
            if on_link:
                print(
                    f"Resolve ({a.prompt} blocks, {a.nodes} nodes) on the Route link: "
                    f"p50 {pct(on_link, 50):.2f} ms, p99 {pct(on_link, 99):.2f} ms "
                    f"(target p99 <= 2 ms: {verdict(pct(on_link, 99) <= 2)})"
                )
            buckets = await resolve_buckets(http, metrics_url)
            n = buckets["+Inf"] - buckets0.get("+Inf", 0)
            share = {le: (buckets[le] - buckets0.get(le, 0)) / n for le in ("0.001", "0.002")}
            print(
                f"  the server's own handling of those Resolves (its histogram, no transport): "
                f"{share['0.001']:.1%} within 1 ms, {share['0.002']:.1%} within 2 ms"
            )
            with_branch, with_branch_unary, with_branch_link = [], [], []
            for i in range(a.resolves // 2):
                t0 = time.perf_counter()
                await session.resolve(prompt, f"agent-{i % 16}")  # as the router asks
                with_branch.append((time.perf_counter() - t0) * 1e3)
                if linked is not None:
                    t0 = time.perf_counter()
                    await linked.resolve(prompt, f"agent-{i % 16}")
                    with_branch_link.append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                await client.resolve(prompt, f"agent-{i % 16}", omit_paths=True)
                with_branch_unary.append((time.perf_counter() - t0) * 1e3)
            print(
                "Resolve with a branch (as the router asks) on the Route stream: "
                f"p50 {pct(with_branch, 50):.2f} ms, "
                f"p99 {pct(with_branch, 99):.2f} ms; unary p50 {pct(with_branch_unary, 50):.2f} ms, "
                f"p99 {pct(with_branch_unary, 99):.2f} ms"
                + (
                    f"; on the Route link p50 {pct(with_branch_link, 50):.2f} ms, "
                    f"p99 {pct(with_branch_link, 99):.2f} ms"
                    if with_branch_link
                    else ""
                )
            )

            writes0 = await store_writes(http, metrics_url)
            routed = []
            prefill = [f"node-{i}" for i in range(0, a.nodes, 2)]
            decode = [f"node-{i}" for i in range(1, a.nodes, 2)]
            for i in range(a.routed):
                branch = f"agent-{i % 16}"
                t0 = time.perf_counter()
                path = prompt[: a.prompt // 2 + i]
                r = await client.resolve(path, branch)  # read-only
                best = max(prefill, key=lambda n: r.nodes[n].local_blocks if n in r.nodes else -1)
                await client.place(branch, best, path)  # the prefill node took it: E.1 + E.2
                await client.place(branch, decode[i % len(decode)], path)  # decode binding at prefill start
                routed.append((time.perf_counter() - t0) * 1e3)
            writes = await store_writes(http, metrics_url) - writes0
            print(
                f"routed disaggregated request (Resolve with branch + Place prefill + Place decode): "
                f"p50 {pct(routed, 50):.2f} ms, p99 {pct(routed, 99):.2f} ms; "
                f"Redis round trips per routed request {writes / a.routed:.2f} (target <= 2)"
            )
            prefill_stream = []
            writes0 = await store_writes(http, metrics_url)
            for i in range(a.routed):  # the router's way: the Places are sent, not waited for
                branch = f"agent-s{i % 16}"
                t0 = time.perf_counter()
                path = prompt[: a.prompt // 2 + i]
                answer = await session.resolve(path, branch)
                local = {n.node: n.local_blocks for n in answer.nodes}
                best = max(prefill, key=lambda n: local.get(n, -1))
                session.place(branch, best, path)
                session.place(branch, decode[i % len(decode)], path)
                prefill_stream.append((time.perf_counter() - t0) * 1e3)
            await session.place_and_wait("agent-s0", decode[0])  # after every Place before it
            writes = await store_writes(http, metrics_url) - writes0 - 1
            print(
                f"routed disaggregated request on the Route stream (Resolve + 2 Places not waited for): "
                f"p50 {pct(prefill_stream, 50):.2f} ms, p99 {pct(prefill_stream, 99):.2f} ms; "
                f"Redis round trips per routed request {writes / a.routed:.2f}"
            )
            if a.cpu_seconds:
                await cpu_per_request(client, link, proc.pid, prompt, prefill, a)
            if a.bulk_blocks:
                await resolve_under_bulk_work(
                    client, session, linked, addr, token, prompt, a, http, metrics_url
                )
            if linked is not None:
                await linked.close()
            await session.close()
            await stream.close()
    finally:
        proc.terminate()
        await proc.wait()
        shutil.rmtree(token_dir, ignore_errors=True)
        redis = aioredis.Redis.from_url(REDIS_URL)
        keys = [k async for k in redis.scan_iter(match=f"{ns}:*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


async def resolves_until(
    ways: dict[str, Callable[[], Awaitable[object]]], done: Callable[[], bool]
) -> dict[str, list[float]]:
    """Resolve back to back until ``done``, each way in turn (unary, Route stream, Route link); the
    latencies in ms of each."""
    out: dict[str, list[float]] = {how: [] for how in ways}
    while not done():
        for how, resolve in ways.items():
            t0 = time.perf_counter()
            await resolve()
            out[how].append((time.perf_counter() - t0) * 1e3)
    return out


async def resolve_under_bulk_work(
    client: DirectoryClient,
    session: DirectorySession,
    linked: DirectorySession | None,
    addr: str,
    token: str,
    prompt: list[int],
    a: argparse.Namespace,
    http: aiohttp.ClientSession,
    metrics_url: str,
) -> None:
    """Resolve p99 while another engine resyncs ``bulk_blocks`` blocks and then while it is purged,
    against Resolve p99 with the directory idle, measured here too (target: under 10 ms during both);
    and the server's own handling time of those Resolves (its histogram: the directory's part)."""
    ways: dict[str, Callable[[], Awaitable[object]]] = {
        "unary": lambda: client.resolve(prompt),
        "Route stream": lambda: session.resolve(prompt),
    }
    if linked is not None:
        ways["Route link"] = lambda: linked.resolve(prompt)
    rounds = iter(range(a.resolves))
    handled = [await resolve_buckets(http, metrics_url)]
    idle = await resolves_until(ways, lambda: next(rounds, None) is None)
    handled.append(await resolve_buckets(http, metrics_url))
    rng = random.Random(1)
    big = [rng.getrandbits(64) | 1 for _ in range(a.bulk_blocks)]
    held = [HeldBlock(h, big[i - 1] if i else ROOT_HASH, Tier.HOST) for i, h in enumerate(big)]
    batch = resync_batch("bulk-engine", 1, Role.PREFILL, held)
    print(
        f"bulk work: a resync of {a.bulk_blocks:,} blocks ({batch.ByteSize() / 2**20:.1f} MiB), then a purge "
        f"with {a.bulk_branches} branches counting up to 2,000 blocks each on the engine"
    )
    core_pauses(held)
    # the bulk engine has a connection of its own, as a separate engine process would
    async with DirectoryClient(
        addr, token=token, timeout_s=600, options=[("grpc.use_local_subchannel_pool", 1)]
    ) as engine:
        stream = engine.open_events()
        t0 = time.perf_counter()
        send = asyncio.ensure_future(stream.send(batch))
        handled.append(await resolve_buckets(http, metrics_url))
        during_resync = await resolves_until(ways, send.done)
        handled.append(await resolve_buckets(http, metrics_url))
        ack = send.result()
        resync_s = time.perf_counter() - t0
        assert not ack.resync_requested, ack
        assert (await client.health()).blocks >= a.bulk_blocks
        per = a.bulk_blocks // max(1, a.bulk_branches)
        for i in range(a.bulk_branches):  # branches counting on the engine: the purge releases them
            await session.place_and_wait(f"bulk-{i}", "bulk-engine", big[i * per : (i + 1) * per][:2000])
        t0 = time.perf_counter()
        drop = asyncio.ensure_future(engine.drop_node("bulk-engine"))
        handled.append(await resolve_buckets(http, metrics_url))
        during_purge = await resolves_until(ways, drop.done)
        handled.append(await resolve_buckets(http, metrics_url))
        drop.result()
        purge_s = time.perf_counter() - t0
        await stream.close()
    for what, lats, took in (("resync", during_resync, resync_s), ("purge", during_purge, purge_s)):
        for how, lat in lats.items():
            base = pct(idle[how], 99)
            p99 = pct(lat, 99) if len(lat) >= 2 else float("nan")
            print(
                f"Resolve p99 ({how}) during the {a.bulk_blocks:,}-block {what} ({took:.1f} s, {len(lat)} "
                f"Resolves): {p99:.2f} ms (max {max(lat, default=0):.1f} ms); idle p99 {base:.2f} ms "
                f"({p99 / base:.1f}x); target < 10 ms: {verdict(p99 < 10)}"
            )
    shares = []
    phases = zip(handled[::2], handled[1::2], strict=True)
    for what, (before, after) in zip(("idle", "resync", "purge"), phases, strict=True):
        n = after["+Inf"] - before.get("+Inf", 0)
        within = [(after[le] - before.get(le, 0)) / n for le in ("0.001", "0.002", "0.005", "0.01")]
        shares.append(f"{what} " + "/".join(f"{w:.1%}" for w in within))
    print(
        "  the server's own handling of those Resolves (its histogram, no transport; within 1/2/5/10 ms): "
        + ", ".join(shares)
    )


def timed_steps(steps: Generator[None, None, object]) -> list[float]:
    """Run a stepwise core operation to its end; the seconds of each step."""
    out = []
    while True:
        t0 = time.perf_counter()
        try:
            next(steps)
        except StopIteration:
            out.append(time.perf_counter() - t0)
            return out
        out.append(time.perf_counter() - t0)


def slices(steps: list[float], budget: float = SLICE_S) -> list[float]:
    """The runs of steps the service makes between two turns of its event loop (``run_steps``)."""
    out, run = [], 0.0
    for t in steps:
        run += t
        if run >= budget:
            out.append(run)
            run = 0.0
    return [*out, run] if run else out


def core_pauses(held: list[HeldBlock]) -> None:
    """The in-process core's largest single step, and largest slice of steps as the service runs them
    (``SLICE_S``), during a resync of ``held`` and the purge after it: what the event loop cannot
    interrupt (a slice ends only after its step)."""
    core = Directory()
    core.register_node("bulk", Role.PREFILL)
    hashes, parents, tiers = split_blocks(held)
    gc.collect()
    resync = timed_steps(core.resync_node_steps("bulk", hashes, parents, tiers, 1.0))
    purge = timed_steps(core.drop_node_steps("bulk"))
    for what, steps in (("resync", resync), ("purge", purge)):
        runs = slices(steps)
        print(
            f"in-process core, {len(held):,}-block {what} ({sum(steps):.1f} s, {len(steps)} steps): largest "
            f"step {max(steps) * 1e3:.1f} ms, largest {SLICE_S * 1e3:g} ms slice {max(runs) * 1e3:.1f} ms, "
            f"slices over 5 ms: {sum(r > 0.005 for r in runs)} of {len(runs)}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=2000)
    ap.add_argument("--per-event", type=int, default=64)
    ap.add_argument("--batches", type=int, default=4000)
    ap.add_argument("--resolves", type=int, default=300)
    ap.add_argument("--routed", type=int, default=300)
    ap.add_argument("--cpu-seconds", type=float, default=2.0, help="per CPU measurement (0: skip)")
    ap.add_argument("--cpu-repeats", type=int, default=3)
    ap.add_argument("--cpu-prompt", type=int, default=8, help="blocks of the CPU measurement's prompt")
    ap.add_argument("--bulk-blocks", type=int, default=1_000_000, help="resync/purge size (0: skip)")
    ap.add_argument("--bulk-branches", type=int, default=500, help="branches counting on the purged engine")
    ap.add_argument("--no-link", action="store_true", help="no Route link (a directory without --link-port)")
    ap.add_argument(
        "--directory-tree",
        type=Path,
        default=None,
        help="run the directory from this checkout (e.g. an older commit's, for before/after runs)",
    )
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
