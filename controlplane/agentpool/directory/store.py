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
from dataclasses import dataclass
from typing import Protocol

from agentpool.kv import BranchState, Changes, Directory, PendingMove, Phase

Row = dict[bytes, bytes]


class StoreUnavailableError(Exception):
    """The store cannot be reached; nothing of the failed write is known to be applied."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Encoded rows of one mutation, taken synchronously right after the core changed."""

    branches: dict[str, Row]
    ended: frozenset[str]
    phases: dict[str, str | None]  # node -> phase value, None: node dropped


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


class BranchStore(Protocol):
    async def load(self) -> tuple[dict[str, Phase], list[BranchState]]:
        """Every persisted node phase and branch row."""
        ...

    async def save(self, snap: Snapshot) -> None:
        """Write the rows of ``snap`` (each branch row atomically). Raises StoreUnavailableError."""
        ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


class MemoryBranchStore:
    """In-process store with the Redis store's encoding (no TTL: the directory's sweep ends idle rows)."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.phases: dict[str, str] = {}
        self.writes = 0

    async def load(self) -> tuple[dict[str, Phase], list[BranchState]]:
        phases = {n: Phase(p) for n, p in self.phases.items()}
        return phases, [decode_branch(b, row) for b, row in self.rows.items()]

    async def save(self, snap: Snapshot) -> None:
        self.writes += 1
        for b in snap.ended:
            self.rows.pop(b, None)
        self.rows.update({b: dict(row) for b, row in snap.branches.items()})
        for node, phase in snap.phases.items():
            if phase is None:
                self.phases.pop(node, None)
            else:
                self.phases[node] = phase

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
