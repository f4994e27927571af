"""Engine event streams: per-node sequence numbers, resync requests and liveness.

Applies validated batches to the core and returns the ack plus what changed; the service persists the
changes. A batch from a node without a known sequence (new, or unknown since a directory restart),
with a gap, or that contradicts the index gets ``resync_requested``; the node's batches are then
ignored until its resync, which replaces its placement and sets its sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agentpool.directory.convert import (
    InvalidRequestError,
    QuotaExceededError,
    block_list,
    held_blocks_steps,
    node_name,
    phase_from_pb,
    resync_size,
    stored_chain,
    tier_from_pb,
)
from agentpool.directory.metrics import DirectoryMetrics
from agentpool.directory.resync_wire import PackedResync
from agentpool.directory.steps import run_steps
from agentpool.kv import Changes, Directory, InvalidEventError, Tier
from agentpool.v1 import directory_pb2 as pb

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20  # gRPC max message size of the server and the client
# A resync entry on the wire: HeldBlock{fixed64, fixed64, Tier} = 9 + 9 + 2 bytes, plus its field tag and
# length byte in the Resync message (repeated messages are not packed).
RESYNC_BYTES_PER_BLOCK = 22
RESYNC_OVERHEAD_BYTES = 1024  # node name (<= 253 bytes), seq, phase, tags and lengths, with room
DEFAULT_MAX_BLOCKS_PER_NODE = 1 << 22  # 4,194,304 blocks (about 0.75 GiB of index for one engine)
DEFAULT_MAX_BRANCHES = 1 << 20
DEFAULT_MAX_NODES = 1024  # registered nodes (each is a bit in every block's holder masks)


def resync_block_limit(max_message_bytes: int) -> int:
    """The most blocks a resync may carry so that any resync within the limit fits in one gRPC message
    of ``max_message_bytes``; a larger (but still receivable) one gets INVALID_ARGUMENT with a reason."""
    return max(0, (max_message_bytes - RESYNC_OVERHEAD_BYTES) // RESYNC_BYTES_PER_BLOCK)


@dataclass(frozen=True)
class ServiceLimits:
    max_blocks_per_request: int = 1 << 16
    max_events_per_batch: int = 4096
    max_resync_blocks: int = resync_block_limit(DEFAULT_MAX_MESSAGE_BYTES)  # 3,050,356 blocks
    max_eviction_limit: int = 1 << 20
    watch_queue: int = 1024
    max_blocks_per_node: int = DEFAULT_MAX_BLOCKS_PER_NODE  # what one engine may keep in the index
    max_branches: int = DEFAULT_MAX_BRANCHES  # live branches (the routers' state) in all
    max_nodes: int = DEFAULT_MAX_NODES
    snapshot_part: int = 4096  # counts per message of a WatchCounts snapshot


@dataclass(frozen=True, slots=True)
class _Event:
    stored: bool
    parent: int
    hashes: list[int]
    tier: Tier


class EventIngest:
    def __init__(
        self,
        directory: Directory,
        limits: ServiceLimits,
        metrics: DirectoryMetrics,
        wall: Callable[[], float],
        mono: Callable[[], float],
    ) -> None:
        self.dir = directory
        self.limits = limits
        self.metrics = metrics
        self.wall = wall
        self.mono = mono
        self._stored_events = metrics.events.labels("stored")
        self._removed_events = metrics.events.labels("removed")
        self._seq: dict[str, int | None] = {}  # node -> last applied seq; None: waiting for a resync
        self._last_heard: dict[str, float] = {}
        self._busy: set[str] = set()  # nodes whose resync is being applied (alive meanwhile)

    # -- liveness ----------------------------------------------------------------------------
    def expect(self, nodes: Iterable[str]) -> None:
        """Start the silence clock of ``nodes`` (restored or registered without an engine stream yet)."""
        now = self.mono()
        for n in nodes:
            self._last_heard.setdefault(n, now)

    def keep_only(self, nodes: Iterable[str]) -> None:
        keep = set(nodes)
        for n in [n for n in self._last_heard if n not in keep]:
            self.forget(n)

    def forget(self, node: str) -> None:
        self._seq.pop(node, None)
        self._last_heard.pop(node, None)

    def silent_since(self, cutoff: float) -> list[str]:
        return sorted(n for n, t in self._last_heard.items() if t < cutoff and n not in self._busy)

    # -- batches -----------------------------------------------------------------------------
    def apply(self, batch: pb.KvEventBatch) -> tuple[pb.PublishAck, Changes]:
        """An event or heartbeat batch (a resync goes to :meth:`resync`)."""
        node = node_name(batch.node)
        events = self._parse(batch)
        last = self._seq.get(node)
        if last is None or not self.dir.has_node(node):
            return self._ask_resync(node, f"node {node} is unknown to the directory: resync", "unknown")
        self._last_heard[node] = self.mono()
        if batch.heartbeat:
            return pb.PublishAck(node=node, seq=last), Changes()
        if batch.seq != last + 1:
            return self._ask_resync(node, f"sequence gap: expected {last + 1}, got {batch.seq}", "gap")
        self._check_cap(node, events)
        changes = Changes()
        now = self.wall()
        for ev in events:
            try:
                if ev.stored:
                    changes.merge(self.dir.apply_stored(node, ev.parent, ev.hashes, ev.tier, now))
                else:
                    changes.merge(self.dir.apply_removed(node, ev.hashes, ev.tier))
            except InvalidEventError as e:
                ack, _ = self._ask_resync(node, f"inconsistent event: {e}", "inconsistent")
                return ack, changes
            (self._stored_events if ev.stored else self._removed_events).inc()
            self.metrics.blocks.inc(len(ev.hashes))
        self._seq[node] = batch.seq
        return pb.PublishAck(node=node, seq=batch.seq), changes

    async def resync(
        self, batch: pb.KvEventBatch, packed: PackedResync | None = None
    ) -> tuple[pb.PublishAck, Changes]:
        """A resync batch, checked and applied in steps that leave the event loop to other RPCs between
        time slices (a million blocks take seconds; Resolves go on meanwhile). ``packed``: its block
        lists, when the batch was parsed without them (:func:`resync_wire.parse_batch`)."""
        node = node_name(batch.node)
        phase = phase_from_pb(batch.phase)
        resync = batch.resync if packed is None else packed
        size, cap = resync_size(resync), self.limits.max_blocks_per_node
        if size > cap:
            raise QuotaExceededError(
                f"resync of {node} lists {size} blocks, more than the cap of {cap} per node"
            )
        self._busy.add(node)
        try:
            blocks = await run_steps(held_blocks_steps(resync, self.limits.max_resync_blocks))
            changes = Changes()
            if not self.dir.has_node(node):
                check_node_cap(self.dir, self.limits.max_nodes)
            if not self.dir.has_node(node) or self.dir.phase(node) is not phase:
                changes.merge(self.dir.register_node(node, phase))
            try:
                now = self.wall()
                steps = self.dir.resync_node_steps(node, blocks.hashes, blocks.parents, blocks.tiers, now)
                changes.merge(await run_steps(steps))
            except InvalidEventError as e:
                raise InvalidRequestError(f"resync of {node}: {e}") from None
        finally:
            self._busy.discard(node)
            self._last_heard[node] = self.mono()
        self._seq[node] = batch.seq
        self.metrics.resyncs.inc()
        return pb.PublishAck(node=node, seq=batch.seq), changes

    def _ask_resync(self, node: str, reason: str, label: str) -> tuple[pb.PublishAck, Changes]:
        self._seq[node] = None
        self.metrics.resyncs_requested.labels(label).inc()
        return pb.PublishAck(node=node, seq=0, resync_requested=True, reason=reason), Changes()

    def _check_cap(self, node: str, events: list[_Event]) -> None:
        """Refuse a batch that would index more than ``max_blocks_per_node`` blocks of ``node``."""
        cap = self.limits.max_blocks_per_node
        index = self.dir.index
        held = index.node_block_count(node) if index.has_node(node) else 0
        stored = sum(len(ev.hashes) for ev in events if ev.stored)
        if held + stored <= cap:
            return
        hashes = {h for ev in events if ev.stored for h in ev.hashes}
        new = len(hashes) - index.count_held(node, hashes) if index.has_node(node) else len(hashes)
        if held + new > cap:
            raise QuotaExceededError(
                f"node {node} would hold {held + new} blocks, more than the cap of {cap} per node: "
                "evict (and publish the removals) first"
            )

    def _parse(self, batch: pb.KvEventBatch) -> list[_Event]:
        if len(batch.events) > self.limits.max_events_per_batch:
            raise InvalidRequestError(
                f"batch has {len(batch.events)} events, more than {self.limits.max_events_per_batch}"
            )
        limit = self.limits.max_blocks_per_request
        out = []
        for ev in batch.events:
            kind = ev.WhichOneof("kind")
            if kind == "stored":
                s = ev.stored
                chain = stored_chain(s.parent_hash, s.block_hashes, limit)
                out.append(_Event(True, s.parent_hash, chain, tier_from_pb(s.tier)))
            elif kind == "removed":
                r = ev.removed
                out.append(_Event(False, 0, block_list(r.block_hashes, limit), tier_from_pb(r.tier)))
            else:
                raise InvalidRequestError("event has neither stored nor removed")
        return out


def check_node_cap(directory: Directory, cap: int) -> None:
    """Refuse to register one more node past ``cap``."""
    if len(directory.phases()) >= cap:
        raise QuotaExceededError(
            f"the directory holds {cap} nodes, its cap: drop nodes (or raise --max-nodes)"
        )
