"""Persistence seam for the directory's agent state (branch table, counted blocks, node phases).

The prefix index is not persisted: engines resync it. Branch counts ``R[b, n]`` are stored in
decomposed form, as each branch's counted sets ``C[beta, n]`` in its own row, and rebuilt as
``R[b, n] = |{beta : b in C[beta, n]}|`` on load (the same recount the property tests check).

Two implementations: :class:`MemoryBranchStore` (tests, simulator, a directory without Redis) and
:class:`agentpool.directory.redis_store.RedisBranchStore` (the service).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agentpool.errors import UnavailableError
from agentpool.kv import BranchState, Changes, Directory, PendingMove, Role

Row = dict[bytes, bytes]


class StoreUnavailableError(UnavailableError):
    """The store cannot be reached; nothing of the failed write is known to be applied (temporary)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Encoded rows of one mutation, taken synchronously right after the core changed.

    ``branches`` rows replace the stored row whole; ``patches`` (branch -> (fields to set, fields to
    delete)) change only those fields of a row the store already holds (:class:`RowTracker`).
    """

    branches: dict[str, Row]
    ended: frozenset[str]
    phases: dict[str, str | None]  # node -> phase value, None: node dropped
    patches: dict[str, tuple[Row, tuple[bytes, ...]]] = field(default_factory=dict)


def encode_hashes(hashes: tuple[int, ...] | frozenset[int]) -> bytes:
    return struct.pack(f"<{len(hashes)}Q", *hashes)


def decode_hashes(data: bytes) -> tuple[int, ...]:
    if len(data) % 8:
        raise ValueError("hash list length is not a multiple of 8 bytes")
    return struct.unpack(f"<{len(data) // 8}Q", data)


def encode_branch(state: BranchState) -> Row:
    """One hash row: ``v`` version, ``p`` path, ``s`` last seen, ``c:<node>`` counted, ``m:<node>`` move."""
    row: Row = {
        b"v": str(state.version).encode(),
        b"p": encode_hashes(state.path),
        b"s": repr(state.last_seen).encode(),
    }
    for node, blocks in state.counted.items():
        row[b"c:" + node.encode()] = encode_hashes(blocks)
    for node, move in state.pending.items():
        row[b"m:" + node.encode()] = f"{move.version}:{move.blocks}".encode()
    return row


def is_complete(row: Mapping[bytes, bytes]) -> bool:
    """A row has its version and path (a patch can only land on a row that expired in between)."""
    return b"v" in row and b"p" in row and b"s" in row


def decode_branch(branch_id: str, row: Mapping[bytes, bytes]) -> BranchState:
    state = BranchState(
        branch_id,
        version=int(row[b"v"]),
        path=decode_hashes(row[b"p"]),
        last_seen=float(row[b"s"]),
    )
    for key, value in row.items():
        if key.startswith(b"c:"):
            state.counted[key[2:].decode()] = frozenset(decode_hashes(value))
        elif key.startswith(b"m:"):
            version, blocks = value.decode().split(":")
            state.pending[key[2:].decode()] = PendingMove(int(version), int(blocks))
    return state


def snapshot(directory: Directory, changes: Changes) -> Snapshot:
    """Encode what ``changes`` touched, as the directory holds it now."""
    branches = {}
    for b in changes.branches - changes.ended:
        state = directory.branches.find(b)
        if state is not None:
            branches[b] = encode_branch(state)
    phases = directory.phases()
    return Snapshot(
        branches=branches,
        ended=frozenset(changes.ended),
        phases={n: (phases[n].value if n in phases else None) for n in changes.nodes},
    )


@dataclass(slots=True)
class _Written:
    """The objects of a branch row as last encoded (paths and counted sets are immutable, so an
    unchanged field is the very same object)."""

    path: tuple[int, ...]
    counted: dict[str, frozenset[int]]
    pending: dict[str, PendingMove]


class RowTracker:
    """Encodes only the fields of a branch row that changed since the row was last encoded.

    ``v`` and ``s`` are always written (a few bytes); ``p`` only when the path object changed, ``c:<node>``
    only when that counted set changed, deleted sets and moves are deleted. A branch the tracker does
    not know (new, or after :meth:`clear`) is written whole. Diffs are against the last *snapshot*, not
    the last confirmed write: valid because writes go to the store in snapshot order, and the service
    clears the tracker (and rewrites queued snapshots whole) after a failed write.
    """

    def __init__(self) -> None:
        self._rows: dict[str, _Written] = {}

    def clear(self) -> None:
        self._rows.clear()

    def loaded(self, states: list[BranchState]) -> None:
        """The rows of ``states`` are what the store holds (just loaded)."""
        self._rows = {s.branch_id: _remember(s) for s in states}

    def snapshot(self, directory: Directory, changes: Changes) -> Snapshot:
        full = snapshot(directory, changes)
        patches: dict[str, tuple[Row, tuple[bytes, ...]]] = {}
        for b in full.ended:
            self._rows.pop(b, None)
        for b in list(full.branches):
            state = directory.branches.get(b)
            old = self._rows.get(b)
            self._rows[b] = _remember(state)
            if old is None:
                continue
            row = full.branches.pop(b)
            put: Row = {b"v": row[b"v"], b"s": row[b"s"]}
            if state.path is not old.path:
                put[b"p"] = row[b"p"]
            for node, blocks in state.counted.items():
                if old.counted.get(node) is not blocks:
                    put[b"c:" + node.encode()] = row[b"c:" + node.encode()]
            for node, move in state.pending.items():
                if old.pending.get(node) != move:
                    put[b"m:" + node.encode()] = row[b"m:" + node.encode()]
            drop = [b"c:" + n.encode() for n in old.counted if n not in state.counted]
            drop += [b"m:" + n.encode() for n in old.pending if n not in state.pending]
            patches[b] = (put, tuple(drop))
        return Snapshot(full.branches, full.ended, full.phases, patches)


def _remember(state: BranchState) -> _Written:
    return _Written(state.path, dict(state.counted), dict(state.pending))


class BranchStore(Protocol):
    async def load(self) -> tuple[dict[str, Role], list[BranchState]]:
        """Every persisted node phase and branch row."""
        ...

    async def save(self, *snaps: Snapshot) -> None:
        """Write the rows of ``snaps``, in order, in one round trip (each branch row atomically).
        Raises StoreUnavailableError."""
        ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Pending:
    """A store write encoded when its changes were made, not yet persisted."""

    changes: Changes
    snap: Snapshot
    epoch: int  # the service's write epoch then (a failed write since: the rows are rewritten whole)


class MemoryBranchStore:
    """In-process store with the Redis store's encoding (no TTL: the directory's sweep ends idle rows)."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.phases: dict[str, str] = {}
        self.writes = 0

    async def load(self) -> tuple[dict[str, Role], list[BranchState]]:
        phases = {n: Role(p) for n, p in self.phases.items()}
        return phases, [decode_branch(b, row) for b, row in self.rows.items() if is_complete(row)]

    async def save(self, *snaps: Snapshot) -> None:
        self.writes += 1
        for snap in snaps:
            for b in snap.ended:
                self.rows.pop(b, None)
            self.rows.update({b: dict(row) for b, row in snap.branches.items()})
            for b, (put, drop) in snap.patches.items():
                row = self.rows.setdefault(b, {})
                row.update(put)
                for f in drop:
                    row.pop(f, None)
            for node, phase in snap.phases.items():
                if phase is None:
                    self.phases.pop(node, None)
                else:
                    self.phases[node] = phase

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
