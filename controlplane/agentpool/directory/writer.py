"""The directory's store writes: encoded when the core changed, saved in that order, group-committed.

A write is queued right after its change was made and encoded (:meth:`StoreWriter.enqueue`); one
flusher saves everything queued by the time it gets to it in one store round trip (concurrent Places
cost one Redis ``MULTI``/``EXEC`` together). A caller that goes away does not cancel its write. After a
failed write every later snapshot diffed before it is rewritten whole (the store may lack the rows the
diff assumed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from agentpool.directory.metrics import DirectoryMetrics
from agentpool.directory.store import BranchStore, Pending, RowTracker, StoreUnavailableError, snapshot
from agentpool.kv import Changes, Directory

log = logging.getLogger(__name__)

Written = asyncio.Future[StoreUnavailableError | None]  # a queued write's outcome (None: saved)


class StoreWriter:
    def __init__(
        self,
        directory: Directory,
        store: BranchStore,
        metrics: DirectoryMetrics,
        on_failure: Callable[[StoreUnavailableError], None],
    ) -> None:
        self.dir = directory
        self.store = store
        self.metrics = metrics
        self.on_failure = on_failure
        self.lock = asyncio.Lock()  # held by each save and by a reload from the store
        self.rows = RowTracker()  # writes only the changed fields of known branch rows
        self._epoch = 0  # bumped by a failed write: snapshots diffed before it are rewritten whole
        self._queued: list[tuple[Pending, Written]] = []
        self._flusher: asyncio.Task[None] | None = None

    def encode(self, changes: Changes) -> Pending:
        """The store write of ``changes``, encoded now (the rows as the core holds them at this point)."""
        return Pending(changes, self.rows.snapshot(self.dir, changes), self._epoch)

    def enqueue(self, pending: Pending) -> Written:
        """Queue an encoded write: call it right after the change was made and encoded."""
        done: Written = asyncio.get_running_loop().create_future()
        self._queued.append((pending, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="directory-store-writer")
        return done

    async def stop(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)

    async def _flush(self) -> None:
        while self._queued:
            async with self.lock:
                batch, self._queued = self._queued, []
                await self._save(batch)

    async def _save(self, batch: list[tuple[Pending, Written]]) -> None:
        """One store round trip for ``batch``; each waiter learns the outcome."""
        snaps = [p.snap if p.epoch == self._epoch else snapshot(self.dir, p.changes) for p, _ in batch]
        error: StoreUnavailableError | None = None
        try:
            await self.store.save(*snaps)
            self.metrics.store_writes.labels("ok").inc()
        except StoreUnavailableError as e:
            error = e
            self.metrics.store_writes.labels("error").inc()
            self._epoch += 1
            self.rows.clear()
            log.error("directory store write failed: %s", e)
            self.on_failure(e)
        for _, done in batch:
            if not done.done():  # cancelled with its caller
                done.set_result(error)
