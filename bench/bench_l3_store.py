"""The sglang backend's L3 store (``keepHostKv``): page copies through the agent's shared-memory pool.

    python -m bench.bench_l3_store [--page-kib 2048] [--pages 128] [--repeats 5]

What SGLang's storage backend does per batch (``l3_client.py``): ``write`` (reserve slots over the
Unix socket, copy the pages into the shared-memory pool, commit) and ``read`` (pin, copy out, unpin),
against a plain copy of the same bytes between two private buffers in the same run (``raw``),
interleaved, ``--repeats`` times. Two pools: one whose pages were never touched (every write faults
its tmpfs pages in: the first write of each slot after the agent starts) and one faulted in before
(every later write). GB/s, median and the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from agentpool.engine.hostpool import HostPool
from agentpool.engine.sglang.l3_client import L3Client
from agentpool.engine.sglang.l3_index import L3Index
from agentpool.engine.sglang.l3_store import SHM_NAME, L3StoreServer, prepare_run_dir


async def run(pool: HostPool, d: Path, n: int, repeats: int) -> dict[str, list[float]]:
    page_bytes = pool.block_bytes
    server = L3StoreServer(L3Index(pool), d)
    await server.start()
    client = await asyncio.to_thread(L3Client, server.path, page_bytes)
    rng = np.random.default_rng(0)
    pages: list[npt.NDArray[np.uint8]] = [rng.integers(0, 256, page_bytes, dtype=np.uint8) for _ in range(n)]
    dst: list[npt.NDArray[np.uint8]] = [np.ones(page_bytes, dtype=np.uint8) for _ in range(n)]
    out: dict[str, list[float]] = {"raw": [], "write": [], "read": []}
    total = n * page_bytes
    try:
        for rep in range(repeats):
            t = time.perf_counter()
            for i in range(n):
                dst[i][:] = pages[i]
            out["raw"].append(total / (time.perf_counter() - t) / 1e9)
            keys = [f"{rep:08x}{i:056x}" for i in range(n)]  # fresh slots every repeat
            t = time.perf_counter()
            await asyncio.to_thread(client.write, keys, pages)
            out["write"].append(total / (time.perf_counter() - t) / 1e9)
            t = time.perf_counter()
            got = await asyncio.to_thread(client.read, keys, dst)
            out["read"].append(total / (time.perf_counter() - t) / 1e9)
            assert all(got) and all(np.array_equal(a, b) for a, b in zip(pages, dst, strict=True))
    finally:
        client.close()
        await server.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--page-kib", type=int, default=2048)
    p.add_argument("--pages", type=int, default=128, help="pages per batch (SGLang's STORAGE_BATCH_SIZE)")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    page_bytes = a.page_kib << 10
    print(f"pages of {a.page_kib} KiB, {a.pages} per batch, {a.repeats} repeats; GB/s")
    for prefault in (False, True):
        base = Path(
            tempfile.mkdtemp(prefix="bench-l3-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
        )
        d = prepare_run_dir(base, "bench")
        pool = HostPool(a.repeats * a.pages, page_bytes, shm_path=d / SHM_NAME)
        if prefault:
            pool.buffer[:] = 1
        try:
            res = asyncio.run(run(pool, d, a.pages, a.repeats))
        finally:
            pool.close()
            d.rmdir()
            base.rmdir()
        label = "faulted in before" if prefault else "never touched"
        for k, v in res.items():
            runs = ", ".join(f"{x:.2f}" for x in v)
            print(f"  pool {label:18} {k:5}  median {statistics.median(v):6.2f}  ({runs})")


if __name__ == "__main__":
    main()
