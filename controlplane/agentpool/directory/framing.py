"""Hand-written protobuf encodings of the hot path's messages (``Route`` operations and replies).

Protobuf's wire format lets a message be written as the concatenation of its fields, and a nested
message field as its tag, its length and the nested message's bytes; so an answer the service already
holds encoded (a Resolve answer, :class:`agentpool.directory.convert.ResolveEncoder`) is wrapped
without parsing it again, and a request's block hashes are packed with one ``struct.pack``. Every
encoding here parses with the generated classes (tests check it).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from agentpool.v1 import directory_pb2 as pb

# field numbers (proto/agentpool/v1/directory.proto)
_RESOLVE_HASHES, _RESOLVE_BRANCH = 1, 2  # ResolveRequest.block_hashes, .branch
_PLACE_BRANCH, _PLACE_NODE, _PLACE_HASHES = 1, 2, 3  # PlaceRequest.branch, .node, .block_hashes
_OP_RESOLVE, _OP_PLACE, _OP_QUIET = 2, 3, 4  # RouteOp
_REPLY_RESOLVE, _REPLY_PLACE, _REPLY_ERROR = 2, 3, 4  # RouteReply
_REPEATED = 1  # RouteBatch.ops, RouteReplies.replies
_ID = b"\x08"  # RouteOp.id / RouteReply.id: field 1, varint


_SMALL = [bytes((v,)) for v in range(0x80)]  # one-byte varints
_OMIT_PATHS = b"\x18\x01"  # ResolveRequest.omit_paths = true: field 3, varint 1
_QUIET = bytes(((_OP_QUIET << 3), 1))  # RouteOp.quiet = true


def varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(field: int, data: bytes) -> bytes:
    """A bytes, string or message field (wire type 2) of number ``field`` (< 16: one tag byte)."""
    return _SMALL[(field << 3) | 2] + varint(len(data)) + data


def _string(field: int, value: str) -> bytes:
    """A string field, left out when empty (as proto3 writes it); UnicodeEncodeError (a ValueError)
    for a string UTF-8 cannot hold, as the generated classes raise."""
    return length_delimited(field, value.encode()) if value else b""


def packed_hashes(field: int, hashes: Sequence[int]) -> bytes:
    """A packed ``repeated fixed64`` field: little-endian u64s written with one ``struct.pack``."""
    if not hashes:
        return b""
    try:
        data = struct.pack(f"<{len(hashes)}Q", *hashes)
    except struct.error as e:
        raise ValueError(f"block hashes must be unsigned 64-bit integers: {e}") from None
    return length_delimited(field, data)


def resolve_request(block_hashes: Sequence[int], branch: str, omit_paths: bool = False) -> bytes:
    """An encoded ``ResolveRequest``."""
    encoded = packed_hashes(_RESOLVE_HASHES, block_hashes) + _string(_RESOLVE_BRANCH, branch)
    return encoded + _OMIT_PATHS if omit_paths else encoded


def place_request(branch: str, node: str, block_hashes: Sequence[int]) -> bytes:
    """An encoded ``PlaceRequest``."""
    return (
        _string(_PLACE_BRANCH, branch)
        + _string(_PLACE_NODE, node)
        + packed_hashes(_PLACE_HASHES, block_hashes)
    )


def route_op(
    op_id: int, resolve: bytes | None = None, place: bytes | None = None, quiet: bool = False
) -> bytes:
    """One encoded ``RouteOp`` inside a ``RouteBatch`` (batches are the concatenation of these)."""
    if (resolve is None) == (place is None):
        raise ValueError("a route operation is a resolve or a place")
    body = _ID + varint(op_id)
    body += (
        length_delimited(_OP_RESOLVE, resolve)
        if resolve is not None
        else length_delimited(_OP_PLACE, place or b"")
    )
    if quiet:
        body += _QUIET
    return length_delimited(_REPEATED, body)


def resolve_reply(op_id: int, response: bytes) -> bytes:
    """One ``RouteReply`` carrying an encoded ``ResolveResponse``, inside a ``RouteReplies``."""
    return length_delimited(_REPEATED, _ID + varint(op_id) + length_delimited(_REPLY_RESOLVE, response))


def place_reply(op_id: int, response: pb.PlaceResponse) -> bytes:
    body = length_delimited(_REPLY_PLACE, response.SerializeToString())
    return length_delimited(_REPEATED, _ID + varint(op_id) + body)


def error_reply(op_id: int, code: int, reason: str) -> bytes:
    error = pb.RouteError(code=code, reason=reason).SerializeToString()
    return length_delimited(_REPEATED, _ID + varint(op_id) + length_delimited(_REPLY_ERROR, error))
