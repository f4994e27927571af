"""The SGLang side of the L3 store: a blocking client of the agent's ``l3_store.py`` server that
copies pages between SGLang's buffers and the agent's host pool (a shared-memory file it maps).

No torch and no SGLang here: pages are uint8 numpy arrays (``hicache_backend.py`` turns SGLang's
tensors into such views). Thread-safe: SGLang's backup and prefetch threads share one connection.
A failed channel raises :class:`L3Error`; SGLang's controller counts a failed page as a miss.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agentpool.engine.sglang.l3_wire import HEADER, WireError, decode, encode, frame_length
from agentpool.engine.shm import ShmBuffer

Page = npt.NDArray[np.uint8]


def key_suffix(cfg: Any) -> str:
    """What SGLang's storage keys get appended per rank (``cfg``: SGLang's ``HiCacheStorageConfig``):
    each TP rank's shard apart; MLA's one copy shared by the ranks, as SGLang's file backend keys them."""
    suffix = "@mla" if cfg.is_mla_model else f"@tp{cfg.tp_rank}of{cfg.tp_size}"
    if cfg.pp_size > 1:
        suffix += f"@pp{cfg.pp_rank}of{cfg.pp_size}"
    if getattr(cfg, "attn_cp_size", 1) > 1:
        suffix += f"@cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}"
    return suffix


class L3Error(RuntimeError):
    """The agent's L3 store refused a request or cannot be reached."""


class L3Client:
    def __init__(self, socket_path: Path, page_bytes: int, timeout_s: float = 10.0) -> None:
        self._lock = threading.Lock()
        self._broken = ""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(str(socket_path))
        except OSError as e:
            self._sock.close()
            raise L3Error(f"the agent's L3 store at {socket_path} cannot be reached: {e}") from None
        try:
            hello = self._call({"op": "hello", "page_bytes": page_bytes})
        except L3Error:
            self._sock.close()
            raise
        self.block_bytes = int(hello["block_bytes"])
        self._shm = ShmBuffer(Path(hello["shm"]), int(hello["size"]), create=False)
        self.buffer = self._shm.array

    def close(self) -> None:
        self._sock.close()

    def _call(self, msg: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self._broken:
                raise L3Error(f"L3 store channel closed after an earlier failure: {self._broken}")
            try:
                self._sock.sendall(encode(msg))
                body = self._recv(frame_length(self._recv(HEADER)))
            except (OSError, L3Error, WireError) as e:
                # a frame may be half sent or read: the channel cannot be trusted any more (the agent
                # stops SGLang when it stops, so there is no agent to reconnect to)
                self._broken = str(e) or type(e).__name__
                self._sock.close()
                raise L3Error(f"L3 store channel: {e}") from None
        answer = decode(body)
        if not answer.get("ok"):
            raise L3Error(f"L3 store refused {msg.get('op')}: {answer.get('error')}")
        return answer

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise L3Error("the agent closed the L3 store channel")
            buf += chunk
        return bytes(buf)

    def _slot(self, s: int) -> Page:
        return self.buffer[s * self.block_bytes : (s + 1) * self.block_bytes]

    def _check(self, pages: Sequence[Page]) -> None:
        for p in pages:
            if p.nbytes != self.block_bytes:
                raise L3Error(f"a page of {p.nbytes} bytes; the pool's blocks are {self.block_bytes}")

    # -- what SGLang's storage backend needs ---------------------------------------------------
    def exists(self, keys: Sequence[str]) -> int:
        """How many leading keys the pool holds."""
        return int(self._call({"op": "exists", "keys": list(keys)})["n"]) if keys else 0

    def read(self, keys: Sequence[str], dst: Sequence[Page]) -> list[bool]:
        """Copy each held key's page into ``dst`` (uint8, the block size); False for keys not held."""
        self._check(dst)
        if not keys:
            return []
        slots = self._call({"op": "pin", "keys": list(keys)})["slots"]
        try:
            for s, d in zip(slots, dst, strict=True):
                if s is not None:
                    d[:] = self._slot(s)
        finally:
            held = [k for k, s in zip(keys, slots, strict=True) if s is not None]
            if held:
                self._call({"op": "unpin", "keys": held})
        return [s is not None for s in slots]

    def write(self, keys: Sequence[str], src: Sequence[Page]) -> list[bool]:
        """Store each page under its key (a key held already is left as it is: True)."""
        self._check(src)
        if not keys:
            return []
        slots = self._call({"op": "reserve", "keys": list(keys)})["slots"]
        todo = [(k, s, p) for k, s, p in zip(keys, slots, src, strict=True) if s is not None]
        if todo:
            try:
                for _, s, p in todo:
                    self._slot(s)[:] = p
            except BaseException:
                self._call({"op": "release", "slots": [s for _, s, _ in todo]})
                raise
            self._call({"op": "commit", "keys": [k for k, _, _ in todo], "slots": [s for _, s, _ in todo]})
        return [True] * len(keys)

    def clear(self) -> bool:
        """SGLang's ``clear()``; True when the agent kept the pages (a role switch)."""
        return bool(self._call({"op": "clear"})["kept"])
