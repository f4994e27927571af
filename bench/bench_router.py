"""Router benchmark: policy decision latency, and router overhead against sglang-router.

``python -m bench.bench_router [--skip-overhead | --skip-decision] [--seconds S] [--asyncio]``

1. Decision latency per policy (in-process, pure): ``prefill_candidates`` + ``policy.choose`` on
   8, 64 and 512 prefill nodes with random queues, reports and cached prefixes. Prints p50/p99 in
   microseconds. Target: p99 <= 1 ms at 64 nodes.
2. Router overhead per request on loopback against instant engines (each answers at once with
   one token): the same engines are hit directly (baseline), through the agentpool router
   (``python -m agentpool.router``, evolving and round-robin policies, in-process directory,
   builtin tokenizer, a 300-word chat prompt) and
   through ``sglang-router`` (PyPI, Rust, ``round_robin`` and ``cache_aware``) in the same run.
   The router runs on its default loop (uvloop); with ``--asyncio`` also with ``--loop asyncio``
   (rows ``...-asyncio``).
   Prints requests/s and latency at concurrency 1 and 32, the latency each router adds over the
   direct baseline, and the agentpool/sglang ratios. Engines, routers and the load generator are
   separate processes.
CPU per request against sglang-router, and router replicas: :mod:`bench.bench_router_cpu`; the router's
request path in one process, for instruction counts: :mod:`bench.bench_router_inprocess`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import agentpool.local.pool as local_pool
from agentpool.models import DecodeModel, NodeModel, PrefillModel, Work
from agentpool.router.policy import (
    CachedPrefix,
    NodeState,
    PolicyContext,
    QueuedPrefill,
    RequestView,
    Role,
    create_policy,
    policy_names,
    prefill_candidates,
)

MODEL = NodeModel(
    prefill=PrefillModel(c0=0.01, c1=5e-5, c2=1e-10, c3=1e-7), decode=DecodeModel(d0=0.01, d1=0.005, d2=1e-4)
)
ROOT = Path(__file__).resolve().parent.parent

# ---- 1. decision latency --------------------------------------------------------------------


def random_nodes(n: int, rng: random.Random) -> list[NodeState]:
    nodes = []
    for i in range(n):
        queue = QueuedPrefill.of(
            [Work(t_uc=rng.uniform(100, 8000), t_c=rng.uniform(0, 60_000)) for _ in range(4)]
        )
        nodes.append(
            NodeState(
                node_id=f"node-{i:04d}",
                role=Role.PREFILL,
                model=MODEL,
                remaining_batch_s=rng.uniform(0, 0.3),
                queue=queue,
                unreported=QueuedPrefill.of([Work(t_uc=rng.uniform(100, 4000))]),
                running_decode=rng.randrange(0, 64),
                kv_room_tokens=rng.randrange(0, 2_000_000),
                kv_used_tokens=rng.randrange(0, 2_000_000),
                report_age_s=rng.uniform(0, 6),
            )
        )
    return nodes


def random_request(nodes: Sequence[NodeState], rng: random.Random, k: int) -> RequestView:
    prompt = rng.randrange(2_000, 120_000)
    holders = rng.sample([n.node_id for n in nodes], min(len(nodes), 8))
    local = {}
    for h in holders:
        total = rng.randrange(0, prompt)
        local[h] = CachedPrefix(gpu=rng.randrange(0, total + 1), total=total)
    return RequestView(
        request_id=f"r{k}",
        prompt_tokens=prompt,
        turn=rng.randrange(1, 40),
        new_turn_tokens=rng.randrange(0, 2000),
        local_prefix=local,
        cluster_prefix=max((p.total for p in local.values()), default=0),
        expected_output_tokens=256,
    )


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def decision_latency(sizes: Sequence[int]) -> None:
    """p50/p99 of the CPU time per decision (the machine is shared, so wall time includes time the
    process spends descheduled); the wall-time p99 is printed alongside for comparison."""
    print("\n## Decision latency per policy (prefill_candidates + choose), microseconds")
    print("   CPU time of the deciding thread; [wall p99] includes preemption by other processes")
    print(f"{'policy':<14}" + "".join(f"{f'{n} nodes p50':>16}{'p99':>8}{'[wall p99]':>12}" for n in sizes))
    ctx = PolicyContext()
    worst_64 = 0.0
    for name in policy_names():
        row = f"{name:<14}"
        for n in sizes:
            rng = random.Random(n)
            nodes = random_nodes(n, rng)
            requests = [random_request(nodes, rng, k) for k in range(200)]
            policy = create_policy(name)
            iterations = max(300, 100_000 // n)
            cpu, wall = [], []
            for k in range(iterations):
                req = requests[k % len(requests)]
                w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                policy.choose(req, prefill_candidates(nodes, ctx), ctx)
                cpu.append((time.thread_time_ns() - c0) / 1e3)
                wall.append((time.perf_counter_ns() - w0) / 1e3)
            p50, p99 = pct(cpu, 0.5), pct(cpu, 0.99)
            if n == 64:
                worst_64 = max(worst_64, p99)
            row += f"{p50:>16.1f}{p99:>8.1f}{pct(wall, 0.99):>12.1f}"
        print(row, flush=True)
    verdict = "meets" if worst_64 <= 1000 else "MISSES"
    print(f"worst CPU-time p99 at 64 nodes: {worst_64:.1f} us ({verdict} the 1 ms target)")


# ---- 2. router overhead ---------------------------------------------------------------------

ENGINE_SCRIPT = r"""
import asyncio, json, logging, sys
from aiohttp import web

logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # sglang-router probes workers with HTTP/2 first

CHAT = {"id": "x", "object": "chat.completion", "created": 0, "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
EVENTS = b''.join(json.dumps(e).encode() + b"\n" for e in (
    {"type": "started"}, {"type": "token", "text": "ok"},
    {"type": "done", "finish_reason": "stop", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}))

async def chat(request):
    await request.read()
    return web.json_response(CHAT)

async def generate(request):
    await request.read()
    return web.Response(body=EVENTS, content_type="application/x-ndjson")

async def ok(request):
    return web.json_response({"status": "ok", "model_path": "bench", "tokenizer_path": "bench",
                              "is_generation": True, "data": [{"id": "bench", "object": "model"}]})

async def main(ports):
    runners = []
    for port in ports:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/agentpool/v1/generate", generate)
        for path in ("/health", "/health_generate", "/get_server_info", "/get_model_info", "/server_info",
                     "/model_info", "/v1/models"):
            app.router.add_get(path, ok)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main([int(p) for p in sys.argv[1:]]))
"""


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port outside the ephemeral range, never handed out twice by this run."""
    return local_pool.free_port("127.0.0.1", _HANDED_OUT)


@dataclass
class Result:
    target: str
    concurrency: int
    requests: int
    seconds: float
    latencies_ms: list[float]
    errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies_ms)

    @property
    def p99(self) -> float:
        return pct(self.latencies_ms, 0.99)


def agent_turn(worker: int, turn: int, history: int) -> bytes:
    """An agent's request: its ``history`` earlier messages (300 words each, the worker's own, the
    same every turn), then a new 50-word user message unique to the turn."""
    messages = [
        {"role": "user" if m % 2 == 0 else "assistant", "content": f"w{worker}m{m} " + "word " * 299}
        for m in range(history)
    ]
    messages.append({"role": "user", "content": f"turn {worker}.{turn} " + "next " * 49})
    return json.dumps({"model": "bench", "messages": messages, "max_tokens": 1}).encode()


async def load(
    urls: Sequence[str],
    concurrency: int,
    seconds: float,
    target: str,
    branches: bool = False,
    history: int = 0,
    pace: float = 0.0,
) -> Result:
    """Closed-loop load; with ``branches`` each worker sends ``x-agentpool-branch: bench-<worker>``.
    The prompt: one 300-word message, or with ``history`` an agent's turn (:func:`agent_turn`).
    ``pace`` (requests per second in all, 0: none): each worker starts a request at most every
    ``concurrency / pace`` seconds (waiting when it is early), so routers are compared at one rate."""
    import aiohttp

    body = json.dumps(
        {"model": "bench", "messages": [{"role": "user", "content": "word " * 300}], "max_tokens": 1}
    ).encode()
    headers = {"content-type": "application/json"}
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds
    counter = 0

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def worker(i: int) -> None:
            nonlocal errors, counter
            mine = {**headers, "x-agentpool-branch": f"bench-{i}"} if branches else headers
            gap = concurrency / pace if pace > 0 else 0.0
            next_at = time.perf_counter()
            while time.perf_counter() < stop_at:
                if gap:
                    await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                    next_at = max(next_at + gap, time.perf_counter() - gap)  # no burst after a stall
                    if time.perf_counter() >= stop_at:
                        break
                url = urls[counter % len(urls)]
                counter += 1
                data = agent_turn(i, counter, history) if history else body
                t0 = time.perf_counter()
                async with http.post(url, data=data, headers=mine) as resp:
                    await resp.read()
                    if resp.status != 200:
                        errors += 1
                        continue
                latencies.append((time.perf_counter() - t0) * 1e3)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return Result(target, concurrency, len(latencies), elapsed, latencies, errors)


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s}s")


def warm_chat(url: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    """sglang-router activates workers asynchronously: wait until a chat request goes through."""
    import urllib.error
    import urllib.request

    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        req = urllib.request.Request(url, data=body.encode(), headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise RuntimeError(f"{url} never served a chat request within {timeout_s}s")


def start_engines(engines: int, procs: list[subprocess.Popen[bytes]]) -> list[str]:
    """``engines`` instant engines (one process, appended to ``procs``); their URLs."""
    ports = [free_port() for _ in range(engines)]
    eng = subprocess.Popen([sys.executable, "-c", ENGINE_SCRIPT, *map(str, ports)], stdout=subprocess.PIPE)
    procs.append(eng)
    assert eng.stdout is not None
    eng.stdout.readline()
    return [f"http://127.0.0.1:{p}" for p in ports]


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate ``procs`` (last started first), killing those that do not exit within 5 s."""
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


def router_overhead(seconds: float, engines: int, loops: Sequence[str] = ("uvloop",)) -> None:
    print(f"\n## Router overhead on loopback, {engines} instant engines, {seconds:.0f}s per measurement")
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-router-"))
    try:
        engine_urls = start_engines(engines, procs)

        targets: list[tuple[str, list[str]]] = [("direct", [u + "/v1/chat/completions" for u in engine_urls])]
        for loop in loops:
            suffix = "" if loop == "uvloop" else f"-{loop}"
            for policy in ("evolving", "round-robin"):
                port = start_agentpool(policy, engine_urls, procs, tmp, loop)
                targets.append(
                    (f"agentpool-{policy}{suffix}", [f"http://127.0.0.1:{port}/v1/chat/completions"])
                )
        sglang_note = start_sglang(engine_urls, procs, targets, tmp)
        results: dict[tuple[str, int], Result] = {}
        for concurrency in (1, 32):
            for name, urls in targets:
                asyncio.run(load(urls, concurrency, 1.0, name))  # warm-up
                r = asyncio.run(load(urls, concurrency, seconds, name))
                results[(name, concurrency)] = r
                print(
                    f"{name:<22} c={concurrency:<3} {r.rps:>8.0f} req/s  p50 {r.p50:6.2f} ms"
                    f"  p99 {r.p99:6.2f} ms  errors {r.errors}",
                    flush=True,
                )
        print_ratios(results, [name for name, _ in targets])
        if sglang_note:
            print(sglang_note)
    finally:
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def start_agentpool(
    policy: str,
    engine_urls: list[str],
    procs: list[subprocess.Popen[bytes]],
    tmp: Path,
    loop: str = "uvloop",
    extra: Sequence[str] = (),
    name: str = "",
) -> int:
    """``python -m agentpool.router`` with ``policy`` over the engines on ``loop``; its port once ready."""
    port = free_port()
    config = {
        "model": "bench",
        "policy": policy,
        "nodes": [{"id": f"e{i}", "url": u, "role": "both"} for i, u in enumerate(engine_urls)],
    }
    path = tmp / f"router-{policy}{name}.json"
    path.write_text(json.dumps(config))
    # the bench engines post no load reports and check no engine token
    args = ["--config", str(path), "--host", "127.0.0.1", "--port", str(port)]
    args += ["--insecure-allow-unauthenticated-reports", "--insecure-engines-without-token"]
    args += ["--loop", loop]
    args += extra
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentpool.router", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs.append(proc)
    wait_http(f"http://127.0.0.1:{port}/ready", 30, proc)
    return port


def start_sglang(
    engine_urls: list[str],
    procs: list[subprocess.Popen[bytes]],
    targets: list[tuple[str, list[str]]],
    tmp: Path,
    pids: dict[str, int] | None = None,
) -> str:
    if importlib.util.find_spec("sglang_router") is None:
        return "sglang-router: not installed (pip install sglang-router==0.3.2); comparison skipped"
    for policy in ("round_robin", "cache_aware"):
        port = free_port()
        log = (tmp / f"sglang-{policy}.log").open("wb")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang_router.launch_router",
                "--worker-urls",
                *engine_urls,
                "--policy",
                policy,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--prometheus-port",
                str(free_port()),
                "--log-level",
                "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        try:
            warm_chat(f"http://127.0.0.1:{port}/v1/chat/completions", 60, proc)
        except RuntimeError as e:
            return f"sglang-router ({policy}) could not serve: {e}; see {tmp}"
        targets.append((f"sglang-{policy}", [f"http://127.0.0.1:{port}/v1/chat/completions"]))
        if pids is not None:
            pids[f"sglang-{policy}"] = proc.pid
    return ""


def print_ratios(results: dict[tuple[str, int], Result], names: list[str]) -> None:
    print("\nadded latency over direct (p50, ms) and throughput relative to direct:")
    for concurrency in (1, 32):
        base = results[("direct", concurrency)]
        for name in names[1:]:
            r = results[(name, concurrency)]
            print(
                f"  c={concurrency:<3} {name:<22} +{r.p50 - base.p50:6.2f} ms   "
                f"{r.rps / base.rps:5.2f}x direct req/s"
            )
    ours = [n for n in names if n.startswith("agentpool-evolving")]
    for other in [n for n in names if n.startswith("sglang")]:
        for mine in ours:
            for concurrency in (1, 32):
                ap, sg, base = (results[(n, concurrency)] for n in (mine, other, "direct"))
                added_ap, added_sg = ap.p50 - base.p50, sg.p50 - base.p50
                ratio = f"{added_ap / added_sg:5.2f}" if added_sg > 0 else "n/a (sglang adds none measurable)"
                print(
                    f"  c={concurrency:<3} {mine} vs {other}: req/s ratio {ap.rps / sg.rps:5.2f}, "
                    f"added-latency ratio {ratio}"
                )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_router")
    parser.add_argument("--skip-overhead", action="store_true", help="only the in-process decision latency")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per overhead measurement")
    parser.add_argument("--skip-decision", action="store_true", help="only the router overhead")
    parser.add_argument("--engines", type=int, default=4)

    parser.add_argument(
        "--asyncio",
        action="store_true",
        help="also run the agentpool router with --loop asyncio (the default is uvloop)",
    )
    args = parser.parse_args(argv)
    print(f"router benchmark on {os.cpu_count()} CPUs (shared machine: figures are noisy)")
    if not args.skip_decision:
        decision_latency((8, 64, 512))
    if not args.skip_overhead:
        loops = ("uvloop", "asyncio") if args.asyncio else ("uvloop",)
        router_overhead(args.seconds, args.engines, loops)


if __name__ == "__main__":
    main()
