"""A host pool exporter in its own process for NIXL tests: ``pool_peer.py BLOCKS BLOCK_BYTES [--garbage]``.

Stores the chain of BLOCKS blocks of a fixed token sequence (bytes derived from the hashes), serves the
lease API on 127.0.0.1:0 and prints ``{"url": ..., "hashes": [...]}`` on one line. ``--garbage``
overwrites every stored block with zeros after indexing it (a peer that answers wrong bytes).
``POST /test/replace {"hash": h, "with": g}`` evicts block ``h`` and stores block ``g`` in the slot it
freed (an eviction and an overwrite racing a reader); it answers both slots. Its HTTP routes and lease
channel need the engine token in ``$POOL_PEER_TOKEN``, as an engine's do.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from aiohttp import web

from agentpool.engine.auth import EngineAuth, auth_middleware
from agentpool.engine.hostpool import HostPool
from agentpool.engine.http_errors import error_middleware
from agentpool.engine.kv_peers import KvExporter
from agentpool.engine.nixl_transport import NixlTransport
from agentpool.kv import ROOT_HASH, block_hashes

PAGE = 4


def chain(blocks: int) -> list[int]:
    return block_hashes(list(range(1000, 1000 + blocks * PAGE)), PAGE)


async def main() -> None:
    blocks, block_bytes = int(sys.argv[1]), int(sys.argv[2])
    pool = HostPool(blocks + 8, block_bytes)
    hashes = chain(blocks)
    pool.store_generated(ROOT_HASH, hashes, 0.0)
    if "--garbage" in sys.argv:
        pool.buffer[:] = 0
    transport = NixlTransport("peer", pool.buffer, block_bytes, table=pool.table)
    await transport.start()
    auth = EngineAuth.token(os.environ["POOL_PEER_TOKEN"])
    app = web.Application(middlewares=[error_middleware, auth_middleware(auth, lambda: None)])
    exporter = KvExporter(pool, transport, auth)
    await exporter.serve_channel("127.0.0.1")
    exporter.add_routes(app)

    async def replace(request: web.Request) -> web.Response:
        body = await request.json()
        old = pool.slot_of[int(body["hash"])]
        assert pool.remove([int(body["hash"])])
        pool.store_generated(ROOT_HASH, [int(body["with"])], 1.0)
        return web.json_response({"old": old, "new": pool.slot_of[int(body["with"])]})

    app.router.add_post("/test/replace", replace)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(json.dumps({"url": f"http://127.0.0.1:{port}", "hashes": hashes}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
