"""Frames of the local L3 store channel (agent <-> SGLang's storage backend): a 4-byte big-endian
length, then a JSON object. Requests carry ``op``; answers carry ``ok`` and, when false, ``error``.

Ops (the agent's side is ``l3_store.py``, the client ``l3_client.py``):

- ``hello`` ``{page_bytes}`` -> ``{shm, size, block_bytes}``: SGLang's page must be the pool's block size
- ``exists`` ``{keys}`` -> ``{n}``: how many leading keys are held
- ``pin`` ``{keys}`` -> ``{slots}``: each key's slot or null; held ones stay pinned until ``unpin`` ``{keys}``
- ``reserve`` ``{keys}`` -> ``{slots}``: a slot for each key not held (null: held already); then
  ``commit`` ``{keys, slots}`` or ``release`` ``{slots}``
- ``clear`` -> ``{kept}``: true while the agent is switching roles (the bytes stay), else the keys are dropped

Pins and reservations a connection holds are released when it closes.
"""

from __future__ import annotations

import json
import struct
from typing import Any

MAX_FRAME = 4 << 20
_LEN = struct.Struct(">I")
HEADER = _LEN.size


class WireError(ValueError):
    """A frame that is not a length-prefixed JSON object within the size limit."""


def encode(msg: dict[str, Any]) -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise WireError(f"frame of {len(body)} bytes over the {MAX_FRAME} limit")
    return _LEN.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    (n,) = _LEN.unpack(header)
    if n > MAX_FRAME:
        raise WireError(f"frame of {n} bytes over the {MAX_FRAME} limit")
    return int(n)


def decode(body: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"frame is not JSON: {e}") from None
    if not isinstance(msg, dict):
        raise WireError("frame is not a JSON object")
    return msg
