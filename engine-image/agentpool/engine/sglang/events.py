"""SGLang's ZMQ KV events, decoded and mirrored into the directory's vocabulary (pure: no sockets).

Wire format (SGLang ``ZmqEventPublisher``): each message has three frames, ``topic`` (UTF-8),
``seq`` (8 bytes, big-endian, +1 per message) and a msgpack payload ``[ts, events, dp_rank]``. An event
is a tagged msgpack map (``{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h|nil,
"token_ids": [...], "block_size": n, "lora_id": nil, "medium": "GPU"|"CPU_PINNED"|...}``, optional
fields left out when unset) or, from older releases, a tagged array in field order.

SGLang's block hashes are not ours: :class:`SglangKvMirror` recomputes our chained hashes from the
token ids each ``BlockStored`` carries (and the mapped parent), keeps the mapping, and emits our
``stored``/``removed`` events per tier (``GPU`` -> GPU, ``CPU_PINNED`` -> host) on a sink. A gap in
``seq`` means lost events: the caller resyncs the directory from the mirror's block list.

Role switch: SGLang's ``/pd_role_switch`` clears its prefix cache, host tier included, and publishes
``AllBlocksCleared``. The agent calls :meth:`SglangKvMirror.expect_switch_clear` before a switch: the
next ``AllBlocksCleared`` then removes the GPU tier only, and the node's host-tier blocks stay in the
mirror and in the directory (with ``keepHostKv`` the bytes stay in the agent's host pool, SGLang's L3
storage backend: ``hicache_backend.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from agentpool.engine.kvstate import KvEventSink
from agentpool.kv import ALL_TIERS, ROOT_HASH, HeldBlock, Tier, block_hashes

_MEDIUM = {None: Tier.GPU, "GPU": Tier.GPU, "CPU_PINNED": Tier.HOST, "CPU": Tier.HOST}
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
_REMOVED_FIELDS = ("block_hashes", "medium")


class FrameError(ValueError):
    """A ZMQ message that is not a KV event batch in SGLang's format."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class Batch:
    topic: str
    seq: int
    ts: float
    events: list[Event]
    dp_rank: int | None


def _fields(raw: Any, names: Sequence[str]) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    return dict(zip(names, raw[1:], strict=False))


def _ints(v: Any, what: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise FrameError(f"{what} must be a list of integers")
    return v


def _event(raw: Any) -> Event:
    if isinstance(raw, dict):
        kind = raw.get("type")
    elif isinstance(raw, list) and raw:
        kind = raw[0]
    else:
        raise FrameError(f"an event is a tagged map or array, got {type(raw).__name__}")
    if kind == "BlockStored":
        f = _fields(raw, _STORED_FIELDS)
        parent = f.get("parent_block_hash")
        size = f.get("block_size")
        if parent is not None and not isinstance(parent, int):
            raise FrameError("parent_block_hash must be an integer or nil")
        if not isinstance(size, int) or size <= 0:
            raise FrameError("block_size must be a positive integer")
        return BlockStored(
            _ints(f.get("block_hashes"), "block_hashes"),
            parent,
            _ints(f.get("token_ids"), "token_ids"),
            size,
            f.get("medium"),
        )
    if kind == "BlockRemoved":
        f = _fields(raw, _REMOVED_FIELDS)
        return BlockRemoved(_ints(f.get("block_hashes"), "block_hashes"), f.get("medium"))
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    raise FrameError(f"unknown event type {kind!r}")


def decode_frames(frames: Sequence[bytes]) -> Batch:
    """One ZMQ message (``topic``, ``seq``, payload) -> :class:`Batch`."""
    if len(frames) != 3:
        raise FrameError(f"a KV event message has 3 frames, got {len(frames)}")
    topic, seq, payload = frames
    if len(seq) != 8:
        raise FrameError(f"seq is 8 bytes, got {len(seq)}")
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as e:
        raise FrameError(f"payload is not msgpack: {e}") from None
    if not isinstance(body, list) or len(body) not in (2, 3) or not isinstance(body[1], list):
        raise FrameError("payload is not [ts, events, dp_rank]")
    ts, events = body[0], body[1]
    rank = body[2] if len(body) == 3 else None
    if not isinstance(ts, int | float):
        raise FrameError("ts must be a number")
    return Batch(
        topic.decode("utf-8", "replace"),
        int.from_bytes(seq, "big"),
        float(ts),
        [_event(e) for e in events],
        rank,
    )


class SglangKvMirror:
    """SGLang's blocks under our hashes, with their tiers; emits our KV events on ``sink``."""

    def __init__(self, page_size: int, sink: KvEventSink) -> None:
        self.page_size = page_size
        self.sink = sink
        self.ours: dict[int, int] = {}  # SGLang hash -> our hash
        self.tiers: dict[int, Tier] = {}  # our hash -> tiers held
        self.parent_of: dict[int, int] = {}  # our hash -> our parent
        self.last_seq: int | None = None
        self.gaps = 0
        self.unmapped_blocks = 0
        self.ignored_events = 0
        self.keep_host_on_clear = False
        self.kept_across_switch = 0

    def apply(self, batch: Batch) -> bool:
        """Apply one batch; True when events were lost before it (a gap in ``seq``): resync."""
        gap = self.last_seq is not None and batch.seq != self.last_seq + 1
        if gap:
            self.gaps += 1
        self.last_seq = batch.seq
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self._stored(ev)
            elif isinstance(ev, BlockRemoved):
                self._removed(ev)
            else:
                self._cleared()
        return gap

    def _stored(self, ev: BlockStored) -> None:
        tier = _MEDIUM.get(ev.medium)
        n = len(ev.block_hashes)
        if tier is None or ev.block_size != self.page_size or len(ev.token_ids) != n * ev.block_size:
            self.ignored_events += 1  # another medium (disk, remote), page size or a malformed event
            return
        if ev.parent_block_hash is None:
            parent = ROOT_HASH
        elif ev.parent_block_hash in self.ours:
            parent = self.ours[ev.parent_block_hash]
        else:
            self.unmapped_blocks += n  # the parent was never seen (events lost): the resync fixes it
            return
        ours = block_hashes(ev.token_ids, self.page_size, parent=parent)
        p = parent
        for theirs, h in zip(ev.block_hashes, ours, strict=True):
            self.ours[theirs] = h
            self.tiers[h] = self.tiers.get(h, Tier(0)) | tier
            self.parent_of.setdefault(h, p)
            p = h
        self.sink.stored(parent, ours, tier)

    def _removed(self, ev: BlockRemoved) -> None:
        tier = _MEDIUM.get(ev.medium)
        if tier is None:
            self.ignored_events += 1
            return
        gone: list[int] = []
        for theirs in ev.block_hashes:
            h = self.ours.get(theirs)
            if h is None or not self.tiers.get(h, Tier(0)) & tier:
                continue
            gone.append(h)
            left = self.tiers[h] & ~tier
            if left:
                self.tiers[h] = left
            else:
                del self.tiers[h], self.parent_of[h], self.ours[theirs]
        if gone:
            self.sink.removed(gone, tier)

    def expect_switch_clear(self, expect: bool = True) -> None:
        """A role switch is under way (``False``: over): its ``AllBlocksCleared`` keeps the host tier."""
        self.keep_host_on_clear = expect

    def _cleared(self) -> None:
        if self.keep_host_on_clear:
            self.keep_host_on_clear = False
            self._clear_gpu_tier()
            return
        if self.tiers:
            self.sink.removed(list(self.tiers), ALL_TIERS)
        self.ours.clear()
        self.tiers.clear()
        self.parent_of.clear()

    def _clear_gpu_tier(self) -> None:
        gpu = [h for h, t in self.tiers.items() if t & Tier.GPU]
        if gpu:
            self.sink.removed(gpu, Tier.GPU)
        for h in gpu:
            left = self.tiers[h] & ~Tier.GPU
            if left:
                self.tiers[h] = left
            else:
                del self.tiers[h]
        kept = set(self.tiers)
        self.kept_across_switch = len(kept)
        self.ours = {theirs: h for theirs, h in self.ours.items() if h in kept}
        self.parent_of = {h: p for h, p in self.parent_of.items() if h in kept}

    def held_blocks(self) -> list[HeldBlock]:
        """The mirror's blocks, parents before children (a directory resync)."""
        seen: set[int] = set()
        out: list[HeldBlock] = []
        for h in self.tiers:
            chain: list[int] = []
            x = h
            while x in self.tiers and x not in seen:
                seen.add(x)
                chain.append(x)
                x = self.parent_of[x]
            out.extend(HeldBlock(b, self.parent_of[b], self.tiers[b]) for b in reversed(chain))
        return out
