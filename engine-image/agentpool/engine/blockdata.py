"""Bytes of a KV block derived from its hash, so that a copy can be checked (the ``sim`` backend).

Word ``i`` (64-bit little endian) of block ``h`` is ``h XOR (i * 0x9E3779B97F4A7C15 mod 2**64)``: every
word depends on the hash and on its position, so a block read from the wrong slot, a shifted copy or
stale bytes all fail :func:`block_matches`. Pure: numpy only.
"""

from __future__ import annotations

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
    dest.view(np.uint64)[:] = _words(block_hash, dest.nbytes)


def block_matches(data: npt.NDArray[np.uint8], block_hash: int) -> bool:
    """Whether ``data`` holds exactly block ``block_hash``'s bytes."""
    return bool(np.array_equal(data.view(np.uint64), _words(block_hash, data.nbytes)))
