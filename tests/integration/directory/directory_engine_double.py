"""A test engine for the directory: keeps its own block list, publishes KV events with sequence numbers
and answers resync requests with its full list (what a real engine agent does)."""

from __future__ import annotations

from agentpool.directory.client import Ack, DirectoryClient, EventStream, NodePublisher
from agentpool.kv import HeldBlock, Role, Tier
from agentpool.kv.hashing import ROOT_HASH


class EngineDouble:
    def __init__(self, node: str, phase: Role) -> None:
        self.node = node
        self.phase = phase
        self.blocks: dict[int, HeldBlock] = {}
        self.resyncs = 0
        self._stream: EventStream | None = None
        self._pub: NodePublisher | None = None

    def connect(self, client: DirectoryClient) -> None:
        """Open a new event stream on ``client`` (after a directory restart: a new client)."""
        self._stream = client.open_events()
        self._pub = NodePublisher(self._stream, self.node, self.phase)

    async def close(self) -> None:
        if self._stream is not None:
            await self._stream.close()

    async def _handle(self, ack: Ack) -> Ack:
        if ack.resync_requested:
            assert self._pub is not None
            self.resyncs += 1
            ack = await self._pub.resync(list(self.blocks.values()))
            assert not ack.resync_requested, ack
        return ack

    async def resync(self) -> Ack:
        assert self._pub is not None
        self.resyncs += 1
        return await self._pub.resync(list(self.blocks.values()))

    async def store(
        self, chain: list[int], tier: Tier = Tier.GPU | Tier.HOST, parent: int = ROOT_HASH
    ) -> Ack:
        assert self._pub is not None
        prev = parent
        for h in chain:
            old = self.blocks.get(h)
            self.blocks[h] = HeldBlock(h, prev, tier | (old.tiers if old else Tier(0)))
            prev = h
        return await self._handle(await self._pub.stored(parent, chain, tier))

    async def evict(self, hashes: list[int], tier: Tier = Tier.GPU | Tier.HOST) -> Ack:
        assert self._pub is not None
        for h in hashes:
            old = self.blocks.get(h)
            if old is not None:
                left = old.tiers & ~tier
                if left:
                    self.blocks[h] = HeldBlock(h, old.parent_hash, left)
                else:
                    del self.blocks[h]
        return await self._handle(await self._pub.removed(hashes, tier))

    async def heartbeat(self) -> Ack:
        assert self._pub is not None
        return await self._handle(await self._pub.heartbeat())
