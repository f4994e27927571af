"""A big resync batch parsed without its block lists (``resync_wire``) gives what the generated parser
gives, for every shape; the lists are views of the received bytes. So do a request's block hashes read
from its packed bytes."""

from __future__ import annotations

import random

import pytest
from google.protobuf.message import DecodeError

from agentpool.directory import framing
from agentpool.directory.client import resync_batch, stored_event
from agentpool.directory.convert import InvalidRequestError, held_blocks, request_blocks, resync_size
from agentpool.directory.resync_wire import SPLIT_MIN_BYTES, PackedResync, packed_u64, parse_batch
from agentpool.kv import ROOT_HASH, HeldBlock, Role, Tier
from agentpool.v1 import directory_pb2 as pb

N = 20_000  # blocks: 340 kB, above SPLIT_MIN_BYTES


def blocks(n: int, seed: int = 0) -> list[HeldBlock]:
    rng = random.Random(seed)
    hs = [rng.getrandbits(64) | 1 for _ in range(n)]
    tiers = (Tier.GPU, Tier.HOST, Tier.GPU | Tier.HOST)
    return [HeldBlock(h, hs[i - 1] if i else ROOT_HASH, tiers[i % 3]) for i, h in enumerate(hs)]


def same(raw: bytes) -> PackedResync | None:
    """``parse_batch(raw)`` agrees with the generated parser; returns its packed part."""
    whole = pb.KvEventBatch.FromString(raw)
    batch, packed = parse_batch(raw)
    resync = batch.resync if packed is None else packed
    if packed is not None:
        assert batch.resync.ByteSize() == 0 and batch.HasField("resync")
    rest = pb.KvEventBatch()
    rest.CopyFrom(whole)
    rest.ClearField("resync")
    mine = pb.KvEventBatch()
    mine.CopyFrom(batch)
    mine.ClearField("resync")
    assert mine == rest and batch.HasField("resync") == whole.HasField("resync")
    if whole.HasField("resync"):
        assert resync_size(resync) == resync_size(whole.resync)
        assert outcome(resync) == outcome(whole.resync)
    return packed


def outcome(resync: pb.Resync | PackedResync) -> object:
    try:
        return held_blocks(resync, 10**7)
    except InvalidRequestError as e:
        return str(e)


def test_a_big_packed_resync_is_split_and_reads_the_same() -> None:
    batch = resync_batch("engine-1", 7, Role.DECODE, blocks(N))
    raw = batch.SerializeToString()
    assert len(raw) >= SPLIT_MIN_BYTES
    packed = same(raw)
    assert packed is not None and packed.block_hashes.obj is raw  # a view, no copy
    assert list(packed.block_hashes[:3]) == [b.block_hash for b in blocks(3)]


def test_fields_around_the_resync_are_kept_in_any_order() -> None:
    batch = resync_batch("engine-1", 7, Role.PREFILL, blocks(N))
    batch.heartbeat = True
    batch.events.append(stored_event(0, [5, 6], Tier.GPU))
    raw = batch.SerializeToString()
    head = pb.KvEventBatch(node="engine-1", seq=9).SerializeToString()
    assert same(raw) is not None
    assert same(raw + head) is not None  # later fields win, as the generated parser says
    assert same(head + raw) is not None


def test_other_shapes_are_parsed_whole() -> None:
    held = blocks(N)
    per_block = pb.KvEventBatch(
        node="e",
        seq=1,
        phase=pb.PHASE_PREFILL,
        resync=pb.Resync(
            blocks=[
                pb.HeldBlock(block_hash=b.block_hash, parent_hash=b.parent_hash, tiers=pb.TIER_GPU_AND_HOST)
                for b in held
            ]
        ),
    ).SerializeToString()
    assert same(per_block) is None
    packed = resync_batch("e", 1, Role.PREFILL, held).SerializeToString()
    more = pb.KvEventBatch(resync=pb.Resync(block_hashes=[1], parent_hashes=[0], tiers=b"\x03"))
    assert same(packed + more.SerializeToString()) is None  # two resync fields: merged, as protobuf does
    unknown = pb.KvEventBatch(resync=pb.Resync(tiers=b"\x03")).SerializeToString()[:-1] + b"\x03\x28\x01"
    assert same(packed + unknown) is None  # a field Resync does not have
    small = resync_batch("e", 1, Role.PREFILL, held[:10]).SerializeToString()
    assert same(small) is None  # under SPLIT_MIN_BYTES
    assert same(pb.KvEventBatch(node="e", heartbeat=True).SerializeToString() * 5000) is None


def test_lists_of_different_lengths_are_refused_as_before() -> None:
    held = blocks(N)
    batch = resync_batch("e", 1, Role.PREFILL, held)
    batch.resync.tiers = batch.resync.tiers[:-1]
    raw = batch.SerializeToString()
    _, packed = parse_batch(raw)
    assert packed is not None
    for resync in (packed, pb.KvEventBatch.FromString(raw).resync):
        with pytest.raises(InvalidRequestError, match="20000 block hashes, 20000 parent hashes and 19999"):
            held_blocks(resync, 10**7)


@pytest.mark.parametrize("cut", [1, 5, 4096])
def test_a_truncated_or_malformed_message_fails_as_the_generated_parser_does(cut: int) -> None:
    raw = resync_batch("e", 1, Role.PREFILL, blocks(N)).SerializeToString()[:-cut]
    with pytest.raises(DecodeError):
        pb.KvEventBatch.FromString(raw)
    with pytest.raises(DecodeError):
        parse_batch(raw)


def test_request_blocks_read_from_the_packed_bytes_equal_the_parsed_field() -> None:
    """A Resolve's or Place's hashes read from its packed bytes (``packed_u64``) are the generated
    parser's; other shapes fall back to it (None), and the checks stay."""
    rng = random.Random(3)
    hs = [rng.getrandbits(64) | 1 for _ in range(2000)]
    hs[5] = 2**64 - 1
    resolve = pb.ResolveRequest.FromString(framing.resolve_request(hs, "agent-1", True))
    place = pb.PlaceRequest.FromString(framing.place_request("agent-1", "n1", hs))
    for request in (resolve, place):
        raw = request.SerializeToString()
        assert packed_u64(raw, request.BLOCK_HASHES_FIELD_NUMBER) == hs
        assert request_blocks(request, 4096) == hs
        with pytest.raises(InvalidRequestError, match="more than the limit"):
            request_blocks(request, 1999)
    assert request_blocks(pb.ResolveRequest(block_hashes=hs[:3]), 4096) == hs[:3]  # short: parsed field
    with pytest.raises(InvalidRequestError, match="root hash"):
        request_blocks(pb.ResolveRequest(block_hashes=[*hs[:99], 0]), 4096)
    unpacked = b"".join(bytes((0x09,)) + h.to_bytes(8, "little") for h in hs[:100])
    assert packed_u64(unpacked, 1) is None  # unpacked (wire type 1): not this shape
    assert pb.ResolveRequest.FromString(unpacked).block_hashes == hs[:100]
    split = framing.packed_hashes(1, hs[:70]) + framing.packed_hashes(1, hs[70:140])
    assert packed_u64(split, 1) is None  # two runs
    assert packed_u64(framing.packed_hashes(1, hs[:70])[:-3], 1) is None  # truncated
    assert packed_u64(pb.ResolveRequest(branch="b").SerializeToString(), 1) is None  # absent
