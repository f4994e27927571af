"""ZMQ messages in SGLang's KV-event wire format, built byte for byte with msgpack (for the bridge tests).

``[topic, seq as 8 big-endian bytes, msgpack([ts, events, dp_rank])]``; events are msgpack maps with
``type`` first and then the fields in declaration order, optional fields omitted when unset (what
msgspec's ``tag=True, omit_defaults=True`` structs encode). ``array_form`` builds the older tagged arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from agentpool.kv import Tier


def stored(
    hashes: list[int], parent: int | None, tokens: list[int], block_size: int, medium: str | None = None
) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": None,
    }
    if medium is not None:
        ev["medium"] = medium
    return ev


def removed(hashes: list[int], medium: str | None = None) -> dict[str, Any]:
    ev: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": hashes}
    if medium is not None:
        ev["medium"] = medium
    return ev


def cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def array_form(ev: dict[str, Any]) -> list[Any]:
    fields = {
        "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
        "BlockRemoved": ("block_hashes", "medium"),
        "AllBlocksCleared": (),
    }[ev["type"]]
    return [ev["type"], *(ev.get(f) for f in fields)]


def message(
    seq: int, events: list[Any], topic: str = "kv", ts: float = 1.5, dp_rank: int | None = 0
) -> list[bytes]:
    payload = msgpack.packb([ts, events, dp_rank], use_bin_type=True)
    return [topic.encode(), seq.to_bytes(8, "big"), payload]


class Recorder:
    """Records what an ``SglangKvMirror`` tells the directory (its publisher seam)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, list[int], Tier]] = []

    def stored(self, parent: int, hashes: Sequence[int], tier: Tier) -> None:
        self.events.append(("stored", list(hashes), tier))

    def removed(self, hashes: Sequence[int], tier: Tier) -> None:
        self.events.append(("removed", list(hashes), tier))
