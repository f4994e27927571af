"""CPU per routed request of ``bench_directory`` (``--cpu-seconds``): workers route as the router
does (a Resolve with a branch, then a Place) with unary calls, on the Route stream or on the Route
link, interleaved, at concurrency 1 and 64; the CPU of this process and of the directory process
divided by the requests routed."""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from pathlib import Path

from agentpool.directory.client import DirectoryClient
from agentpool.directory.link_client import LinkClient
from agentpool.directory.session import DirectorySession

# how the CPU measurement routes: unary calls, or the Route stream with a Place delay (s), over gRPC
# or over the Route link
MODES: list[tuple[str, float | None]] = [
    ("unary", None),
    ("Route stream", 0.005),
    ("Route, Places at once", 0.0),
    ("Route link", 0.005),
]


def process_cpu(pid: int | None) -> float:
    """User + system CPU seconds of ``pid`` (None: this process)."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def routed_load(
    client: DirectoryClient,
    session: DirectorySession | None,
    path: list[int],
    nodes: list[str],
    c: int,
    s: float,
) -> int:
    """``c`` workers route requests for ``s`` seconds as the router does (a Resolve with the worker's
    branch, then a Place on a node): unary calls (``session`` None) or on the Route stream, where the
    Place is not waited for. Returns the requests routed."""
    done = 0
    stop = time.perf_counter() + s

    async def worker(w: int) -> None:
        nonlocal done
        branch = f"cpu-{w}"
        while time.perf_counter() < stop:
            node = nodes[done % len(nodes)]
            if session is None:
                await client.resolve(path, branch, omit_paths=True)
                await client.place(branch, node, path)
            else:
                await session.resolve(path, branch)
                session.place(branch, node, path)
            done += 1

    await asyncio.gather(*(worker(w) for w in range(c)))
    return done


async def cpu_per_request(
    client: DirectoryClient,
    link: LinkClient | None,
    directory_pid: int,
    prompt: list[int],
    nodes: list[str],
    a: argparse.Namespace,
) -> None:
    """CPU per routed request of the caller (this process) and of the directory, unary calls against
    the Route stream, interleaved, ``a.cpu_repeats`` times at concurrency 1 and 64."""
    path = prompt[: a.cpu_prompt]
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    modes = [m for m in MODES if link is not None or m[0] != "Route link"]
    for _ in range(a.cpu_repeats):
        for c in (1, 64):
            for how, delay in modes:
                via = link if how == "Route link" and link is not None else client
                session = DirectorySession(via, place_delay_s=delay) if delay is not None else None
                await routed_load(client, session, path, nodes, c, 0.3)  # warm-up
                mine, theirs = process_cpu(None), process_cpu(directory_pid)
                n = await routed_load(client, session, path, nodes, c, a.cpu_seconds)
                if session is not None:
                    await session.close()  # its last Places are answered: their CPU is counted
                caller = (process_cpu(None) - mine) / n * 1e6
                directory = (process_cpu(directory_pid) - theirs) / n * 1e6
                results.setdefault((how, c), []).append((caller, directory))
    print(
        f"CPU per routed request (Resolve with a branch + Place, {a.cpu_prompt}-block prompt; caller + "
        f"directory process; {a.cpu_repeats} interleaved repeats of {a.cpu_seconds:g} s):"
    )
    for c in (1, 64):
        for how, _ in modes:
            runs = results[(how, c)]
            totals = [x + y for x, y in runs]
            line = ", ".join(f"{x:.0f}+{y:.0f}" for x, y in runs)
            print(
                f"  c={c:<3} {how:<12}: median {statistics.median(totals):6.0f} us (caller+directory: {line})"
            )
        for how, _ in modes[1:]:
            pairs = zip(results[("unary", c)], results[(how, c)], strict=True)
            ratios = [(s1 + s2) / (u1 + u2) for (u1, u2), (s1, s2) in pairs]
            print(f"  c={c:<3} {how} / unary: " + ", ".join(f"{r:.2f}x" for r in ratios))
        if link is not None:
            pairs = zip(results[("Route stream", c)], results[("Route link", c)], strict=True)
            print(
                f"  c={c:<3} Route link / Route stream (caller, directory, both): "
                + ", ".join(
                    f"{l1 / g1:.2f}x {l2 / g2:.2f}x {(l1 + l2) / (g1 + g2):.2f}x"
                    for (g1, g2), (l1, l2) in pairs
                )
            )
