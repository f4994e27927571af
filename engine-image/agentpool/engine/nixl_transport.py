"""Real block transfers between host pools with NIXL (UCX backend, DRAM).

Each engine registers its pool buffer with one NIXL agent and publishes :class:`PoolInfo` (agent
name, metadata, buffer address, block size). A reader adds the peer's metadata once and READs
``(local slot, remote slot)`` pairs; contiguous runs on both sides become one descriptor.

NIXL calls are blocking C calls: every one of them runs on one dedicated thread (the agent is used
from that thread only), and the event loop awaits it. A transfer that does not finish within its
deadline is released and raised as :class:`FetchError`, as is a peer that disconnected.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import secrets
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from agentpool.engine.errors import FetchError

log = logging.getLogger(__name__)
_SPIN_S = 0.05  # a transfer polled without sleeping for this long (most finish well within it)


@dataclass(frozen=True, slots=True)
class PoolInfo:
    """What a peer needs to READ from a pool: the NIXL agent and where the slots are."""

    agent: str
    metadata: bytes
    base: int
    block_bytes: int
    slots: int

    def to_json(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "metadata": base64.b64encode(self.metadata).decode(),
            "base": self.base,
            "block_bytes": self.block_bytes,
            "slots": self.slots,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PoolInfo:
        try:
            return cls(
                str(d["agent"]),
                base64.b64decode(d["metadata"], validate=True),
                int(d["base"]),
                int(d["block_bytes"]),
                int(d["slots"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise FetchError(f"bad pool info from peer: {e}") from None


def descriptor_runs(
    pairs: Sequence[tuple[int, int]], local_base: int, remote_base: int, block_bytes: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """Nx3 ``(address, length, device)`` arrays for the local and remote side; runs of slots
    contiguous on both sides merge into one descriptor."""
    local: list[tuple[int, int, int]] = []
    remote: list[tuple[int, int, int]] = []
    run_l = run_r = -2
    run_n = 0
    for ls, rs in pairs:
        if run_n and ls == run_l + run_n and rs == run_r + run_n:
            run_n += 1
            continue
        if run_n:
            local.append((local_base + run_l * block_bytes, run_n * block_bytes, 0))
            remote.append((remote_base + run_r * block_bytes, run_n * block_bytes, 0))
        run_l, run_r, run_n = ls, rs, 1
    if run_n:
        local.append((local_base + run_l * block_bytes, run_n * block_bytes, 0))
        remote.append((remote_base + run_r * block_bytes, run_n * block_bytes, 0))
    return np.array(local, dtype=np.uint64).reshape(-1, 3), np.array(remote, dtype=np.uint64).reshape(-1, 3)


class NixlTransport:
    """One NIXL agent over one registered host buffer; reads from peers' buffers."""

    def __init__(self, name_prefix: str, buffer: npt.NDArray[np.uint8], block_bytes: int) -> None:
        self.name = f"{name_prefix}-{os.getpid()}-{secrets.token_hex(3)}"
        self.buffer = buffer
        self.block_bytes = block_bytes
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nixl")
        self._agent: Any = None
        self._metadata = b""
        self._remotes: dict[str, str] = {}  # peer agent name -> name NIXL gave it
        self._errors: tuple[type[BaseException], ...] = (RuntimeError,)  # NIXL's binding errors

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._start)

    def _start(self) -> None:
        from nixl._api import nixl_agent, nixl_agent_config, nixlBind  # the optional dependency

        found = [v for k, v in vars(nixlBind).items() if k.endswith("Error") and isinstance(v, type)]
        self._errors = (*found, RuntimeError)

        agent = nixl_agent(self.name, nixl_agent_config(backends=["UCX"]))
        if "UCX" not in agent.backends:
            raise RuntimeError("NIXL has no UCX backend: cannot serve the host KV pool")
        buf = self.buffer
        agent.register_memory([(int(buf.ctypes.data), int(buf.nbytes), 0, "")], "DRAM")
        self._agent = agent
        self._metadata = agent.get_agent_metadata()

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def info(self) -> PoolInfo:
        if self._agent is None:
            raise RuntimeError("the NIXL transport is not started")
        slots = self.buffer.nbytes // self.block_bytes
        return PoolInfo(self.name, self._metadata, int(self.buffer.ctypes.data), self.block_bytes, slots)

    # -- reads ----------------------------------------------------------------------------------
    async def read(self, peer: PoolInfo, pairs: Sequence[tuple[int, int]], timeout_s: float) -> int:
        """READ ``(local slot, remote slot)`` pairs from ``peer``; returns the bytes moved."""
        if peer.block_bytes != self.block_bytes:
            raise FetchError(f"peer block size {peer.block_bytes} != local {self.block_bytes}")
        if any(not 0 <= rs < peer.slots for _, rs in pairs):
            raise FetchError("peer named a slot outside its pool")
        if not pairs:
            return 0
        local, remote = descriptor_runs(pairs, int(self.buffer.ctypes.data), peer.base, self.block_bytes)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._read, peer, local, remote, timeout_s)

    def _remote(self, peer: PoolInfo) -> str:
        name = self._remotes.get(peer.agent)
        if name is None:
            name = self._agent.add_remote_agent(peer.metadata)
            if isinstance(name, bytes):
                name = name.decode()
            self._remotes[peer.agent] = name
        return name

    def _forget(self, peer: PoolInfo) -> None:
        name = self._remotes.pop(peer.agent, None)
        if name is not None:
            try:
                self._agent.remove_remote_agent(name)
            except self._errors as e:  # the peer is gone anyway
                log.debug("remove_remote_agent(%s): %s", name, e)

    def _read(
        self, peer: PoolInfo, local: npt.NDArray[np.uint64], remote: npt.NDArray[np.uint64], timeout_s: float
    ) -> int:
        agent = self._agent
        deadline = time.monotonic() + timeout_s
        handle = None
        try:
            remote_name = self._remote(peer)
            handle = agent.initialize_xfer(
                "READ", agent.get_xfer_descs(local, "DRAM"), agent.get_xfer_descs(remote, "DRAM"), remote_name
            )
            state = agent.transfer(handle)
            spin_until = time.monotonic() + _SPIN_S
            while state == "PROC":
                now = time.monotonic()
                if now > deadline:
                    raise FetchError(f"NIXL read from {peer.agent} timed out after {timeout_s:.3g} s")
                # poll, yielding the CPU (sched_yield) for the first _SPIN_S, then sleeping 0.5 ms
                time.sleep(0 if now < spin_until else 0.0005)
                state = agent.check_xfer_state(handle)
            if state != "DONE":
                raise FetchError(f"NIXL read from {peer.agent} failed: {state}")
        except FetchError:
            self._forget(peer)
            raise
        except self._errors as e:  # NIXL's binding errors (no common base but Exception)
            self._forget(peer)
            raise FetchError(f"NIXL read from {peer.agent} failed: {type(e).__name__}: {e}") from None
        finally:
            if handle is not None:
                try:
                    agent.release_xfer_handle(handle)
                except self._errors as e:  # a handle of a dead peer may refuse release
                    log.debug("release_xfer_handle: %s", e)
        return int(local[:, 1].sum())
