"""What ``bench_engine`` starts and talks to: the host-pool peer of its fetch parts (a process
holding a NIXL-registered pool, ``python -m bench.bench_engine --serve-pool``), engines started from
their CLI and a bare aiohttp server streaming the same NDJSON events; with what its parts share (the
engine token, the page size, a chain of block hashes, percentiles, a process's CPU seconds)."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from agentpool.engine.auth import EngineAuth, auth_middleware
from agentpool.engine.hostpool import HostPool
from agentpool.engine.http_errors import error_middleware
from agentpool.engine.kv_peers import KvExporter
from agentpool.engine.nixl_transport import PROGRESS_DELAY_US, NixlTransport
from agentpool.kv import ROOT_HASH, block_hashes

ROOT = Path(__file__).resolve().parent.parent
PAGE = 16
TOKEN = "bench-engine-token-0123456789abcdef"
AUTH = EngineAuth.token(TOKEN)  # engines require it, as deployed
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def chain(n: int) -> list[int]:
    return block_hashes(list(range(n * PAGE)), PAGE)


def pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


# -- the host-pool peer (1.) -------------------------------------------------------------------------
async def serve_pool(blocks: int, block_bytes: int, delay_us: int) -> None:
    """The peer: a pool holding ``blocks`` blocks of one chain, its lease API on 127.0.0.1:0."""
    pool = HostPool(blocks, block_bytes)
    pool.store_generated(ROOT_HASH, chain(blocks), 0.0)
    transport = NixlTransport(
        "bench-peer", pool.buffer, block_bytes, progress_delay_us=delay_us, table=pool.table
    )
    await transport.start()
    app = web.Application(middlewares=[error_middleware, auth_middleware(AUTH, lambda: None)])
    exporter = KvExporter(pool, transport, AUTH)
    await exporter.serve_channel("127.0.0.1")
    exporter.add_routes(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(json.dumps({"url": f"http://127.0.0.1:{port}"}), flush=True)
    await asyncio.Event().wait()


async def start_peer(
    blocks: int, block_bytes: int, delay_us: int = PROGRESS_DELAY_US
) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.bench_engine",
        "--serve-pool", str(blocks), str(block_bytes), str(delay_us),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    while True:
        line = (await proc.stdout.readline()).decode()
        if not line:
            raise RuntimeError("the pool peer exited")
        if line.startswith("{"):
            return proc, json.loads(line)["url"]


# -- engines from the CLI ----------------------------------------------------------------------------
async def start_engine(tmp: Path, cfg: dict[str, Any]) -> tuple[asyncio.subprocess.Process, str]:
    path = tmp / f"{cfg['nodeId']}.json"
    token_file = tmp / "engine-token"
    token_file.write_text(TOKEN)
    path.write_text(json.dumps({**cfg, "tokenFile": str(token_file)}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentpool.engine", "--config", str(path), "--log-level", "WARNING",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    while True:
        line = (await proc.stdout.readline()).decode()
        if not line:
            raise RuntimeError("the engine exited")
        if line.startswith("engine listening on "):
            _keep(asyncio.create_task(_drain(proc)))
            return proc, line.split()[-1]


_TASKS: set[asyncio.Task[None]] = set()


def _keep(task: asyncio.Task[None]) -> None:
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


async def _drain(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdout is not None
    while await proc.stdout.read(65536):
        pass


async def generate(
    http: aiohttp.ClientSession, url: str, rid: str, tokens: list[int], phase: str, out: int
) -> str:
    body = {
        "request_id": rid, "dispatch_seq": 0, "phase": phase, "endpoint": "completion",
        "body": {"max_tokens": out}, "prompt_token_ids": tokens,
    }  # fmt: skip
    async with http.post(url + "/agentpool/v1/generate", json=body, headers=HEADERS) as r:
        last = ""
        async for line in r.content:
            if line.strip():
                last = json.loads(line)["type"]
        return last


async def state(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/agentpool/v1/state") as r:
        out: dict[str, Any] = await r.json()
        return out


async def wait_switches(http: aiohttp.ClientSession, url: str, n: int) -> None:
    for _ in range(6000):
        if len((await state(http, url))["switches"]) >= n:
            return
        await asyncio.sleep(0.01)
    raise RuntimeError(f"switch {n} did not happen within a minute")


# -- CPU seconds and the bare server (3.) ------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bare_server(tmp: Path) -> tuple[asyncio.subprocess.Process, str]:
    code = (
        "import asyncio, json\n"
        "from aiohttp import web\n"
        "async def gen(request):\n"
        "    g = json.loads(await request.read())\n"
        "    r = web.StreamResponse(headers={'content-type': 'application/x-ndjson'})\n"
        "    await r.prepare(request)\n"
        "    n = g['body']['max_tokens']\n"
        '    await r.write(b\'{"type":"started"}\\n\')\n'
        "    for i in range(n):\n"
        "        await r.write(json.dumps({'type': 'token', 'text': f't{i} '}).encode() + b'\\n')\n"
        '    await r.write(b\'{"type":"done"}\\n\')\n'
        "    return r\n"
        "async def main():\n"
        "    app = web.Application(); app.router.add_post('/agentpool/v1/generate', gen)\n"
        "    runner = web.AppRunner(app, access_log=None); await runner.setup()\n"
        "    site = web.TCPSite(runner, '127.0.0.1', 0); await site.start()\n"
        "    port = site._server.sockets[0].getsockname()[1]\n"
        "    print('engine listening on http://127.0.0.1:%d' % port, flush=True)\n"
        "    await asyncio.Event().wait()\n"
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    assert proc.stdout is not None
    line = (await proc.stdout.readline()).decode()
    _keep(asyncio.create_task(_drain(proc)))
    return proc, line.split()[-1]
