"""Bytes of a KV block derived from its hash, so that a copy can be checked (the ``sim`` backend).

Word ``i`` (64-bit little endian) of block ``h`` is ``h XOR (i * 0x9E3779B97F4A7C15 mod 2**64)``: every
word depends on the hash and on its position, so a block read from the wrong slot, a shifted copy or
stale bytes all fail :func:`block_matches`. Pure: numpy only.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_WORD = 8


def check_block_bytes(block_bytes: int) -> None:
    if block_bytes <= 0 or block_bytes % _WORD:
        raise ValueError(f"block_bytes must be a positive multiple of {_WORD}, got {block_bytes}")


def _words(block_hash: int, block_bytes: int) -> npt.NDArray[np.uint64]:
    idx = np.arange(block_bytes // _WORD, dtype=np.uint64)
    with np.errstate(over="ignore"):
        out: npt.NDArray[np.uint64] = np.bitwise_xor(idx * _GOLDEN, np.uint64(block_hash))
    return out


def block_bytes_for(block_hash: int, block_bytes: int) -> npt.NDArray[np.uint8]:
    """The ``block_bytes`` bytes of block ``block_hash``."""
    check_block_bytes(block_bytes)
    return _words(block_hash, block_bytes).view(np.uint8)


def fill_block(dest: npt.NDArray[np.uint8], block_hash: int) -> None:
    """Write block ``block_hash``'s bytes into ``dest`` (one slot of a pool)."""
    np.bitwise_xor(_base(dest.nbytes, 1), np.uint64(block_hash), out=dest.view(np.uint64))


@lru_cache(maxsize=16)
def _base(block_bytes: int, stride: int) -> npt.NDArray[np.uint64]:
    """Every ``stride``-th word of block 0 (block ``h`` is this XOR ``h``), read-only."""
    out = _words(0, block_bytes)[::stride].copy()
    out.flags.writeable = False
    return out


def block_matches(data: npt.NDArray[np.uint8], block_hash: int, stride: int = 1) -> bool:
    """Whether ``data`` holds block ``block_hash``'s bytes: every word, or every ``stride``-th one
    (a wrong slot, a shifted copy, stale or zeroed bytes fail any stride)."""
    if stride < 1:
        raise ValueError("stride must be positive")
    words = data.view(np.uint64)[::stride]
    return bool(np.array_equal(np.bitwise_xor(words, np.uint64(block_hash)), _base(data.nbytes, stride)))


def first_mismatch(
    buffer: npt.NDArray[np.uint8], block_bytes: int, slots: list[int], hashes: list[int], stride: int = 1
) -> int | None:
    """Index into ``slots``/``hashes`` of the first slot of ``buffer`` (a pool of ``block_bytes``
    slots) not holding its block's bytes (every ``stride``-th word checked), or None: one numpy pass
    over the sampled words of all the blocks instead of a call per block."""
    if not slots:
        return None
    if stride < 1:
        raise ValueError("stride must be positive")
    words = buffer.view(np.uint64).reshape(-1, block_bytes // _WORD)[:, ::stride]
    sampled = words[slots]  # a copy: XOR it in place
    sampled ^= np.array(hashes, dtype=np.uint64)[:, None]
    bad = (sampled != _base(block_bytes, stride)).any(axis=1)
    return int(bad.argmax()) if bad.any() else None
