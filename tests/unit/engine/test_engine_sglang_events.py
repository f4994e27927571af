"""SGLang KV events (frames byte for byte as SGLang's msgspec structs encode them) -> our directory events."""

from __future__ import annotations

from collections.abc import Sequence

import msgpack
import pytest
from sglang_frames import array_form, cleared, message, removed, stored

from agentpool.engine.sglang.events import FrameError, SglangKvMirror, decode_frames
from agentpool.kv import ALL_TIERS, ROOT_HASH, Tier, block_hashes


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int | None, list[int], Tier]] = []

    def stored(self, parent: int, hashes: Sequence[int], tier: Tier) -> None:
        self.events.append(("stored", parent, list(hashes), tier))

    def removed(self, hashes: Sequence[int], tier: Tier) -> None:
        self.events.append(("removed", None, list(hashes), tier))


TOK = list(range(1, 13))  # three pages of 4


def test_the_exact_bytes_of_a_batch() -> None:
    frames = message(7, [cleared()], topic="kv", ts=1.5, dp_rank=0)
    assert frames[1] == b"\x00\x00\x00\x00\x00\x00\x00\x07"
    # fixarray(3) [float64 1.5, fixarray(1) [fixmap(1) {"type": "AllBlocksCleared"}], 0]
    assert (
        frames[2]
        == bytes.fromhex("93cb3ff8000000000000" + "9181a474797065b0") + b"AllBlocksCleared" + b"\x00"
    )
    batch = decode_frames(frames)
    assert (batch.topic, batch.seq, batch.ts, batch.dp_rank) == ("kv", 7, 1.5, 0)


def test_stored_blocks_get_our_hashes_from_their_token_ids() -> None:
    rec = Recorder()
    m = SglangKvMirror(4, rec)
    ours = block_hashes(TOK, 4)
    gap = m.apply(decode_frames(message(0, [stored([-11, 22], None, TOK[:8], 4, "GPU")])))
    assert not gap
    m.apply(decode_frames(message(1, [stored([33], 22, TOK[8:], 4)])))  # no medium: GPU; parent mapped
    m.apply(decode_frames(message(2, [stored([-11, 22, 33], None, TOK, 4, "CPU_PINNED")])))
    assert rec.events == [
        ("stored", ROOT_HASH, ours[:2], Tier.GPU),
        ("stored", ours[1], ours[2:], Tier.GPU),
        ("stored", ROOT_HASH, ours, Tier.HOST),
    ]
    assert [(b.block_hash, b.parent_hash, b.tiers) for b in m.held_blocks()] == [
        (ours[0], ROOT_HASH, Tier.GPU | Tier.HOST),
        (ours[1], ours[0], Tier.GPU | Tier.HOST),
        (ours[2], ours[1], Tier.GPU | Tier.HOST),
    ]
    rec.events.clear()
    m.apply(decode_frames(message(3, [removed([33, 22], "GPU"), removed([33], "CPU_PINNED")])))
    assert rec.events == [
        ("removed", None, [ours[2], ours[1]], Tier.GPU),
        ("removed", None, [ours[2]], Tier.HOST),
    ]
    assert ours[2] not in m.tiers and m.tiers[ours[1]] == Tier.HOST
    rec.events.clear()
    m.apply(decode_frames(message(4, [cleared()])))
    assert rec.events == [("removed", None, [ours[0], ours[1]], ALL_TIERS)]
    assert not m.tiers and not m.ours


def test_a_gap_in_seq_is_reported_and_unknown_parents_are_counted() -> None:
    m = SglangKvMirror(4, Recorder())
    assert not m.apply(decode_frames(message(10, [])))
    assert m.apply(decode_frames(message(12, [stored([5], 99, TOK[:4], 4)])))  # seq 11 was lost
    assert m.gaps == 1 and m.unmapped_blocks == 1 and not m.tiers
    assert not m.apply(decode_frames(message(13, [])))
    assert m.apply(decode_frames(message(0, [])))  # the publisher restarted


def test_older_tagged_array_events_and_other_media() -> None:
    rec = Recorder()
    m = SglangKvMirror(4, rec)
    m.apply(decode_frames(message(0, [array_form(stored([1], None, TOK[:4], 4, "CPU_PINNED"))])))
    m.apply(
        decode_frames(message(1, [stored([2], None, TOK[4:8], 4, "DISK"), stored([3], None, TOK[:8], 8)]))
    )
    assert rec.events == [("stored", ROOT_HASH, block_hashes(TOK[:4], 4), Tier.HOST)]
    assert m.ignored_events == 2  # disk tier; another page size


@pytest.mark.parametrize(
    "frames",
    [
        [b"kv", b"\x00" * 8],
        [b"kv", b"\x00" * 4, msgpack.packb([1.0, [], 0])],
        [b"kv", b"\x00" * 8, b"\xc1"],
        [b"kv", b"\x00" * 8, msgpack.packb({"ts": 1})],
        [b"kv", b"\x00" * 8, msgpack.packb([1.0, [{"type": "Nope"}], 0])],
        [b"kv", b"\x00" * 8, msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": ["x"]}], 0])],
        [b"kv", b"\x00" * 8, msgpack.packb(["soon", [], 0])],
    ],
)
def test_malformed_messages_are_frame_errors(frames: list[bytes]) -> None:
    with pytest.raises(FrameError):
        decode_frames(frames)
