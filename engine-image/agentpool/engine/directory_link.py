"""The engine's link to the KV directory: KV events with sequence numbers, resyncs, counts, phase.

One ``PublishEvents`` stream per connection. After (re)connecting the link first sends a resync (the
node's full block list and phase), then the events queued since, in batches with consecutive
sequence numbers; an ack with ``resync_requested`` (a gap, a directory restart, an event the index
refused) triggers a new resync. While disconnected nothing is queued: the resync after the reconnect
carries the state. A heartbeat keeps the node alive when there is nothing to send.

``WatchCounts`` streams the branch counts of this node's blocks into the host pool (the eviction
order); the watch is reopened after any error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import grpc

from agentpool.directory.client import (
    DirectoryClient,
    DirectoryRpcError,
    NodePublisher,
    removed_event,
    stored_event,
)
from agentpool.kv import HeldBlock, Role, Tier
from agentpool.v1 import directory_pb2 as pb

log = logging.getLogger(__name__)

MAX_EVENTS_PER_BATCH = 1024
MAX_BLOCKS_PER_EVENT = 4096
MAX_PENDING_EVENTS = 1 << 16
_AUTH_RETRY_S = 30.0  # beyond this the link drops its queue and resyncs instead


class DirectoryLink:
    def __init__(
        self,
        node: str,
        client: DirectoryClient,
        phase: Callable[[], Role],
        held: Callable[[], list[HeldBlock]],
        on_counts: Callable[[dict[int, int], bool], None],
        *,
        heartbeat_s: float = 0.5,
        reconnect_s: float = 0.5,
    ) -> None:
        self.node = node
        self.client = client
        self.phase = phase
        self.held = held
        self.on_counts = on_counts
        self.heartbeat_s = heartbeat_s
        self.reconnect_s = reconnect_s
        self.connected = False
        self.resyncs = 0
        self.batches = 0
        self.errors = 0
        self._pending: list[pb.KvEvent] = []
        self._wake = asyncio.Event()
        self._need_resync = True
        self.refused: str | None = None  # why the directory refused the node's token

    # -- the sink (called synchronously by the ledger) -----------------------------------------
    def stored(self, parent: int, hashes: Sequence[int], tier: Tier) -> None:
        for i in range(0, len(hashes), MAX_BLOCKS_PER_EVENT):
            p = parent if i == 0 else hashes[i - 1]
            self._add(stored_event(p, hashes[i : i + MAX_BLOCKS_PER_EVENT], tier))

    def removed(self, hashes: Sequence[int], tier: Tier) -> None:
        for i in range(0, len(hashes), MAX_BLOCKS_PER_EVENT):
            self._add(removed_event(hashes[i : i + MAX_BLOCKS_PER_EVENT], tier))

    def _add(self, event: pb.KvEvent) -> None:
        if not self.connected or self._need_resync:
            return  # the resync carries it
        if len(self._pending) >= MAX_PENDING_EVENTS:
            self._pending.clear()
            self._need_resync = True
        else:
            self._pending.append(event)
        self._wake.set()

    def request_resync(self) -> None:
        self._need_resync = True
        self._wake.set()

    # -- loops ----------------------------------------------------------------------------------
    async def run(self) -> None:
        await asyncio.gather(self._publish_loop(), self._counts_loop())

    async def _publish_loop(self) -> None:
        while True:
            stream = self.client.open_events()
            publisher = NodePublisher(stream, self.node, self.phase())
            try:
                self._need_resync = True
                self.connected = True
                await self._serve(publisher)
            except DirectoryRpcError as e:
                self.errors += 1
                if e.code == grpc.StatusCode.UNAUTHENTICATED:
                    # a wrong token does not get better by retrying fast (the directory's contract)
                    self.refused = e.reason or "unauthenticated"
                    log.error(
                        "the directory refused %s's token: %s; retrying in %.0f s",
                        self.node,
                        e,
                        _AUTH_RETRY_S,
                    )
                    await asyncio.sleep(_AUTH_RETRY_S)
                else:
                    log.warning("directory link of %s: %s; reconnecting", self.node, e)
            finally:
                self.connected = False
                self._pending.clear()
            await asyncio.sleep(self.reconnect_s)

    async def _serve(self, publisher: NodePublisher) -> None:
        while True:
            if self._need_resync:
                self._need_resync = False
                self._pending.clear()
                publisher.phase = self.phase()
                ack = await publisher.resync(self.held())
                self.resyncs += 1
                self.refused = None
                if ack.resync_requested:
                    raise DirectoryRpcError(
                        grpc.StatusCode.FAILED_PRECONDITION, f"resync refused: {ack.reason}"
                    )
                continue
            if self._pending:
                batch = self._pending[:MAX_EVENTS_PER_BATCH]
                del self._pending[:MAX_EVENTS_PER_BATCH]
                ack = await publisher.events(batch)
                self.batches += 1
            else:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.heartbeat_s)
                    continue
                except TimeoutError:
                    ack = await publisher.heartbeat()
            if ack.resync_requested:
                log.info("directory asks %s to resync: %s", self.node, ack.reason)
                self._need_resync = True

    async def _counts_loop(self) -> None:
        while True:
            try:
                async for update in self.client.watch_counts(self.node):
                    self.on_counts(update.counts, update.snapshot)
            except DirectoryRpcError as e:
                log.debug("count watch of %s: %s", self.node, e)
            await asyncio.sleep(self.reconnect_s)

    async def switch_phase(self, phase: Role) -> None:
        """Tell the directory the node serves ``phase`` now (D->P resets its counts)."""
        try:
            await self.client.switch_phase(self.node, phase)
        except DirectoryRpcError as e:
            self.errors += 1
            log.warning("directory SwitchPhase(%s, %s): %s; a resync carries the phase", self.node, phase, e)
            self.request_resync()
