"""Router CPU per request against sglang-router, and router replicas (issue 16, section 5).

``python -m bench.bench_router_cpu [--seconds S] [--repeats N] [--engines N]
[--skip-replicas | --only-replicas] [--router-cpu-limit CORES] [--history H] [--pace R]``

1. CPU per request of each router process (user + system from /proc, the process and its
   descendants) for the agentpool router (on its default loop, uvloop, and with ``--loop asyncio``;
   and with the directory, in-memory store, and a branch header per load worker, where the
   directory's CPU is added: over gRPC, and over its Route link) and sglang-router 0.3.2
   (``pip install sglang-router==0.3.2``; round_robin and cache_aware) on the same instant engines,
   interleaved, ``--repeats`` times, at concurrency 1 and 64, with the agentpool/sglang ratio of each
   repeat. The prompt is one 300-word message; with ``--history H`` each load worker is an agent
   resending its ``H`` earlier messages (300 words each) plus a new one every request. With
   ``--pace R`` also at concurrency 1 paced at ``R`` requests per second (row ``1@R/s``): closed-loop,
   a router that answers more slowly gets fewer requests a second, and on a loaded machine each
   request then finds colder caches and costs more CPU, so the c=1 row compares routers at
   different rates; the paced row compares them at one.
2. Replicas: one agentpool router against two sharing the same engines (the load generator spreads
   requests over the replicas), interleaved, ``--repeats`` times at concurrency 64: requests per second
   and CPU per request summed over the replicas. (The instant engines send no load reports, so this
   measures the shell's scaling, not report fan-out.) With ``--router-cpu-limit CORES`` each router
   runs in a cgroup of its own limited to that many cores, as a pod's CPU limit would limit it
   (:mod:`bench.cpu_limit`; root): the routers are then the bottleneck, and the share of periods
   their quota cut short says so.

3. ``--front-door``: only a bare front door answering a fixed JSON body, aiohttp's server against the
   router's lean one (:mod:`agentpool.router.http_server`), both on uvloop, interleaved; CPU per
   request at concurrency 1 and 64.

Results: ``bench/results/router_cpu.md``. On a 2-core machine the load generator, the engines and the
routers share the cores, so replicas cannot scale past the cores the others leave.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.bench_router import (
    free_port,
    load,
    start_agentpool,
    start_engines,
    start_sglang,
    stop_all,
    wait_http,
)
from bench.cpu_limit import CpuLimitError, CpuLimits


def start_directory(
    procs: list[subprocess.Popen[bytes]], tmp: Path
) -> tuple[subprocess.Popen[bytes], str, str]:
    """``python -m agentpool.directory`` with an in-memory store, a token and its Route link;
    (process, gRPC HOST:PORT, link HOST:PORT)."""
    token = tmp / "directory-token"
    token.write_text("bench-directory-token-0123456789")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentpool.directory", "--host", "127.0.0.1", "--port", "0",
         "--redis-url", "", "--auth-token-file", str(token), "--link-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    procs.append(proc)
    assert proc.stdout is not None
    address = None
    for raw in proc.stdout:
        line = raw.decode()
        if line.startswith("directory listening on "):
            address = line.split()[-1]
        elif line.startswith("directory link listening on ") and address is not None:
            return proc, address, line.split()[-1]
    raise RuntimeError("the directory exited before it listened")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid``'s threads and its live descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def router_cpu(
    seconds: float,
    engines: int,
    repeats: int,
    concurrencies: Sequence[int],
    history: int = 0,
    pace: float = 0.0,
) -> None:
    """CPU per request of each router process, interleaved, ``repeats`` times; ratios per repeat.
    With ``pace`` also at concurrency 1 paced at that many requests per second (row ``1@R/s``)."""
    loads = [(str(c), c, 0.0) for c in concurrencies] + ([(f"1@{pace:g}/s", 1, pace)] if pace else [])
    print(
        f"\n## Router CPU per request ({engines} instant engines, {seconds:.0f}s per measurement, "
        f"{repeats} interleaved repeats, concurrency {[label for label, _, _ in loads]})"
    )
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-router-cpu-"))
    try:
        engine_urls = start_engines(engines, procs)
        targets: list[tuple[str, list[str]]] = []
        pids: dict[str, int] = {}
        for loop in ("uvloop", "asyncio"):
            name = "agentpool-evolving" + ("" if loop == "uvloop" else "-asyncio")
            port = start_agentpool("evolving", engine_urls, procs, tmp, loop)
            targets.append((name, [f"http://127.0.0.1:{port}/v1/chat/completions"]))
            pids[name] = procs[-1].pid
        # with the directory (in-memory store) and a branch header per load worker: gRPC, Route link
        directory, address, link = start_directory(procs, tmp)
        with_directory = {
            "agentpool-evolving-grpc-branch": address,
            "agentpool-link-branch": f"link://{link}",
        }
        for name, target in with_directory.items():
            token = ["--directory", target, "--directory-token-file", str(tmp / "directory-token")]
            port = start_agentpool("evolving", engine_urls, procs, tmp, extra=token, name=name[-12:])
            targets.append((name, [f"http://127.0.0.1:{port}/v1/chat/completions"]))
            pids[name] = procs[-1].pid
        note = start_sglang(engine_urls, procs, targets, tmp, pids)
        if note:
            print(note)
        per_req: dict[tuple[str, str], list[float]] = {}
        for rep in range(repeats):
            for label, concurrency, rate in loads:
                for name, urls in targets:
                    branches = name in with_directory
                    asyncio.run(load(urls, concurrency, 0.5, name, branches, history, rate))  # warm-up
                    before, dir_before = cpu_seconds(pids[name]), cpu_seconds(directory.pid)
                    r = asyncio.run(load(urls, concurrency, seconds, name, branches, history, rate))
                    used = cpu_seconds(pids[name]) - before
                    dir_used = cpu_seconds(directory.pid) - dir_before if branches else 0.0
                    if branches:
                        print(
                            f"    (router {used / max(1, r.requests) * 1e6:.0f} us + directory "
                            f"{dir_used / max(1, r.requests) * 1e6:.0f} us)"
                        )
                    used += dir_used
                    us = used / max(1, r.requests) * 1e6
                    per_req.setdefault((name, label), []).append(us)
                    print(
                        f"  repeat {rep + 1} c={label:<3} {name:<26} {us:8.0f} us CPU/request "
                        f"({r.requests} requests, {r.rps:.0f} req/s, errors {r.errors})",
                        flush=True,
                    )
        print("\nmedian CPU per request (us) and ratio to sglang-router, per repeat:")
        for label, _, _ in loads:
            for name, _ in targets:
                vals = per_req[(name, label)]
                line = f"  c={label:<3} {name:<26} {statistics.median(vals):8.0f} us"
                for other in ("sglang-round_robin", "sglang-cache_aware"):
                    if name.startswith("agentpool") and (other, label) in per_req:
                        ratios = [a / b for a, b in zip(vals, per_req[(other, label)], strict=True)]
                        line += f"  vs {other}: " + ", ".join(f"{x:.2f}x" for x in ratios)
                print(line)
    finally:
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def replicas(
    seconds: float,
    engines: int,
    repeats: int,
    concurrency: int = 64,
    cpu_limit: float | None = None,
    directory: bool = False,
) -> None:
    """One router against two on the same engines, interleaved; req/s and summed CPU per request.
    ``cpu_limit``: each router in a cgroup of its own with that many cores (a pod's CPU limit), and
    the share of CFS periods its quota cut short (the limit binds: the routers are the bottleneck).
    ``directory``: the routers share one directory (its Route link, not limited) and every load
    worker sends a branch header, as replicas of one pool do."""
    limit = "" if cpu_limit is None else f", each router limited to {cpu_limit:g} core"
    limit += ", one shared directory (Route link) and branch headers" if directory else ""
    print(
        f"\n## Router replicas: 1 vs 2 ({engines} instant engines, c={concurrency}, {repeats} repeats{limit})"
    )
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-router-replicas-"))
    limits = None if cpu_limit is None else CpuLimits(cpu_limit)
    try:
        engine_urls = start_engines(engines, procs)
        extra: list[str] = []
        directory_pid: int | None = None
        if directory:
            proc, _, link = start_directory(procs, tmp)
            directory_pid = proc.pid
            extra = ["--directory", f"link://{link}", "--directory-token-file", str(tmp / "directory-token")]
        routers: list[tuple[str, int]] = []
        for i in range(2):
            port = start_agentpool("evolving", engine_urls, procs, tmp, extra=extra, name=f"-replica{i}")
            routers.append((f"http://127.0.0.1:{port}/v1/chat/completions", procs[-1].pid))
            if limits is not None:
                limits.limit(procs[-1].pid)
        setups = {"1 router": routers[:1], "2 routers": routers}
        rps: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        for rep in range(repeats):
            for name, group in setups.items():
                urls = [u for u, _ in group]
                asyncio.run(load(urls, concurrency, 0.5, name, directory))  # warm-up
                before = sum(cpu_seconds(pid) for _, pid in group)
                dir_before = cpu_seconds(directory_pid) if directory_pid else 0.0
                throttled_before = [limits.throttling(pid) for _, pid in group] if limits else []
                r = asyncio.run(load(urls, concurrency, seconds, name, directory))
                used = sum(cpu_seconds(pid) for _, pid in group) - before
                if directory_pid:
                    dir_us = (cpu_seconds(directory_pid) - dir_before) / max(1, r.requests) * 1e6
                    print(f"    (directory {dir_us:.0f} us CPU/request, not in the routers' figure)")
                rps.setdefault(name, []).append(r.rps)
                cpu.setdefault(name, []).append(used / max(1, r.requests) * 1e6)
                throttled = ""
                if limits is not None:
                    shares = [
                        limits.throttling(pid).since(b).share
                        for (_, pid), b in zip(group, throttled_before, strict=True)
                    ]
                    throttled = ", throttled in " + " / ".join(f"{x:.0%}" for x in shares) + " of periods"
                print(
                    f"  repeat {rep + 1} {name:<10} {r.rps:8.0f} req/s  {cpu[name][-1]:6.0f} us CPU/request "
                    f"(errors {r.errors}{throttled})",
                    flush=True,
                )
        ratios = [b / a for a, b in zip(rps["1 router"], rps["2 routers"], strict=True)]
        print(
            f"  median: 1 router {statistics.median(rps['1 router']):.0f} req/s, "
            f"2 routers {statistics.median(rps['2 routers']):.0f} req/s; "
            "2/1 per repeat: " + ", ".join(f"{x:.2f}x" for x in ratios)
        )
    finally:
        stop_all(procs)
        if limits is not None:
            limits.close()
        shutil.rmtree(tmp, ignore_errors=True)


FRONT_DOOR_SCRIPT = r"""
import asyncio, sys, uvloop
kind, port = sys.argv[1], int(sys.argv[2])
BODY = b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"content":"ok"}}]}'
async def main():
    if kind == "aiohttp":
        from aiohttp import web
        async def chat(r):
            await r.read()
            return web.Response(body=BODY, content_type="application/json")
        async def ready(r):
            return web.Response(text="ok")
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/ready", ready)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    else:
        from agentpool.router.http_server import HttpServer, Response, Routes
        async def chat(r):
            return Response(200, BODY)
        async def ready(r):
            return Response(200, b"ok")
        routes = Routes()
        routes.add("POST", "/v1/chat/completions", chat)
        routes.add("GET", "/ready", ready)
        await HttpServer(routes, lambda: 1 << 20, lambda: 30.0).start("127.0.0.1", port)
    await asyncio.Event().wait()
uvloop.run(main())
"""


def front_door(seconds: float, repeats: int) -> None:
    """CPU per request of aiohttp's server and the lean one answering a fixed body, interleaved."""
    print(f"\n## Front door alone: aiohttp vs the lean server ({seconds:.0f}s, {repeats} repeats)")
    procs: list[subprocess.Popen[bytes]] = []
    servers: dict[str, tuple[int, int]] = {}
    try:
        for kind in ("aiohttp", "lean"):
            port = free_port()
            proc = subprocess.Popen([sys.executable, "-c", FRONT_DOOR_SCRIPT, kind, str(port)])
            procs.append(proc)
            wait_http(f"http://127.0.0.1:{port}/ready", 30, proc)
            servers[kind] = (proc.pid, port)
        per_req: dict[tuple[str, int], list[float]] = {}
        for rep in range(repeats):
            for concurrency in (1, 64):
                for kind, (pid, port) in servers.items():
                    urls = [f"http://127.0.0.1:{port}/v1/chat/completions"]
                    asyncio.run(load(urls, concurrency, 0.3, kind))  # warm-up
                    before = cpu_seconds(pid)
                    r = asyncio.run(load(urls, concurrency, seconds, kind))
                    us = (cpu_seconds(pid) - before) / max(1, r.requests) * 1e6
                    per_req.setdefault((kind, concurrency), []).append(us)
                    print(
                        f"  repeat {rep + 1} c={concurrency:<3} {kind:<8} {us:6.0f} us CPU/request",
                        flush=True,
                    )
        for concurrency in (1, 64):
            old, new = per_req[("aiohttp", concurrency)], per_req[("lean", concurrency)]
            ratios = ", ".join(f"{b / a:.2f}x" for a, b in zip(old, new, strict=True))
            medians = f"aiohttp {statistics.median(old):.0f} us, lean {statistics.median(new):.0f} us"
            print(f"  c={concurrency}: {medians} (median); lean/aiohttp per repeat: {ratios}")
    finally:
        stop_all(procs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_router_cpu")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--skip-replicas", action="store_true")
    parser.add_argument("--only-replicas", action="store_true", help="only the replicas comparison")
    parser.add_argument(
        "--replicas-directory",
        action="store_true",
        help="replicas: the routers share one directory (Route link) and the load sends branch headers",
    )
    parser.add_argument(
        "--router-cpu-limit",
        type=float,
        default=None,
        help="replicas: limit each router to this many cores (a pod's CPU limit, via a cgroup; root)",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="agent prompts: this many earlier 300-word messages per load worker, then a new one",
    )
    parser.add_argument("--front-door", action="store_true", help="only the bare front-door comparison")
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="also measure concurrency 1 paced at this many requests per second (every router at one "
        "rate: closed-loop c=1 CPU per request grows as a router's rate falls on a loaded machine)",
    )
    args = parser.parse_args(argv)
    print(f"router CPU benchmark on {os.cpu_count()} CPUs (shared machine: figures are noisy)")
    if args.front_door:
        front_door(args.seconds, args.repeats)
        return
    if not args.only_replicas:
        router_cpu(args.seconds, args.engines, args.repeats, (1, 64), args.history, args.pace)
    if not args.skip_replicas:
        try:
            replicas(
                args.seconds,
                args.engines,
                args.repeats,
                cpu_limit=args.router_cpu_limit,
                directory=args.replicas_directory,
            )
        except CpuLimitError as e:
            parser.exit(2, f"python -m bench.bench_router_cpu: {e}\n")


if __name__ == "__main__":
    main()
