"""``WatchCounts``: each open stream's queue of count changes for one node (engines order host-memory
eviction by them)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

from agentpool.directory.metrics import DirectoryMetrics
from agentpool.kv import CountChanges, Directory
from agentpool.v1 import directory_pb2 as pb


class _Watcher:
    def __init__(self, size: int) -> None:
        self.queue: asyncio.Queue[dict[int, int]] = asyncio.Queue(size)
        self.overflow = False
        self.wake = asyncio.Event()


class CountWatchers:
    """The open count streams, by node."""

    def __init__(self, directory: Directory, metrics: DirectoryMetrics) -> None:
        self.dir = directory
        self.metrics = metrics
        self._by_node: dict[str, set[_Watcher]] = {}

    def publish(self, counts: CountChanges) -> None:
        """Send the changed blocks' counts as the core holds them now (the current value is never stale,
        whatever order the writes finish in)."""
        for node, blocks in counts.items():
            watchers = self._by_node.get(node)
            if not blocks or not watchers or not self.dir.has_node(node):
                continue
            current = {b: self.dir.counts.count(node, b) for b in blocks}
            for w in watchers:
                try:
                    w.queue.put_nowait(current)
                except asyncio.QueueFull:
                    w.overflow = True
                w.wake.set()

    def resnapshot(self) -> None:
        """Every stream sends a fresh snapshot (the counts were reloaded)."""
        for watchers in self._by_node.values():
            for w in watchers:
                w.overflow = True
                w.wake.set()

    async def stream(self, node: str, queue_size: int, part: int) -> AsyncIterator[pb.CountUpdate]:
        """A snapshot of ``node``'s counts (in parts of ``part``), then their changes; a new snapshot
        after more than ``queue_size`` changes piled up unsent."""
        w = _Watcher(queue_size)
        self._by_node.setdefault(node, set()).add(w)
        self.metrics.watchers.inc()
        try:
            for update in count_snapshot(self.dir, node, part):
                yield update
            while True:
                await w.wake.wait()
                w.wake.clear()
                if w.overflow:
                    w.overflow = False
                    while not w.queue.empty():
                        w.queue.get_nowait()
                    for update in count_snapshot(self.dir, node, part):
                        yield update
                    continue
                merged: dict[int, int] = {}
                while not w.queue.empty():
                    merged.update(w.queue.get_nowait())
                if merged:
                    yield pb.CountUpdate(
                        node=node,
                        snapshot=False,
                        counts=[pb.BlockCount(block_hash=h, count=c) for h, c in merged.items()],
                    )
        finally:
            self._by_node[node].discard(w)
            self.metrics.watchers.dec()


def count_snapshot(directory: Directory, node: str, part: int) -> Iterator[pb.CountUpdate]:
    """The node's positive counts as of now, in parts of ``part`` blocks: the first marked ``snapshot``
    (replace), the others not (add). Each part is built when the stream asks for it, so a million
    counted blocks do not hold the loop; changes meanwhile are queued and follow."""
    view = directory.counts.counts_view(node)
    blocks, counts = list(view), list(view.values())  # plain ints: nothing for the GC to walk
    for i in range(0, max(len(blocks), 1), part):
        pairs = zip(blocks[i : i + part], counts[i : i + part], strict=True)
        yield pb.CountUpdate(
            node=node, snapshot=i == 0, counts=[pb.BlockCount(block_hash=h, count=c) for h, c in pairs]
        )
