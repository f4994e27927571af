"""An engine's KV publisher in a process of its own (the engine agent's DirectoryLink): resyncs a chain
of blocks, then heartbeats. ``python publisher_process.py ADDRESS TOKEN NODE BLOCKS``; prints
``published`` once the directory acknowledged the resync. The liveness test kills it with SIGKILL."""

from __future__ import annotations

import asyncio
import sys

from agentpool.directory.client import DirectoryClient
from agentpool.engine.directory_link import DirectoryLink
from agentpool.kv import ROOT_HASH, HeldBlock, Role, Tier


async def main(address: str, token: str, node: str, n: int) -> None:
    hashes = [(i + 1) * 0x9E3779B97F4A7C15 % 2**64 or 1 for i in range(n)]
    held = [
        HeldBlock(h, hashes[i - 1] if i else ROOT_HASH, Tier.GPU | Tier.HOST) for i, h in enumerate(hashes)
    ]
    async with DirectoryClient(address, token=token) as client:
        link = DirectoryLink(node, client, lambda: Role.PREFILL, lambda: held, lambda c, s: None)
        task = asyncio.create_task(link.run())
        for _ in range(3000):  # the first resync acknowledged (30 s at most)
            if link.resyncs:
                break
            await asyncio.sleep(0.01)
        print("published" if link.resyncs else "never published", flush=True)
        await task


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
