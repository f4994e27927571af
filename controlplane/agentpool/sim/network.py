"""A network of per-node links that concurrent transfers share (processor sharing), in virtual time.

Each node has a NIC (egress and ingress, ``nic_bytes_per_s`` each way) and a host-memory link
(``host_bytes_per_s``, App. D.6: about 52 GB/s effective for KV fetches). A fetch from a peer's
host pool uses the source's host link and NIC egress and the destination's NIC ingress and host
link; a P->D hand-over (GPU to GPU) uses the two NICs only. Every link is split equally among the
transfers on it, and a transfer moves at the smallest share among its links; rates are recomputed
whenever a transfer starts or ends, so two concurrent fetches into one node each take longer than
one alone. Fixed latencies are the caller's.

Pure: no clock; the simulator calls :meth:`start` and :meth:`finish_due` with its virtual ``now``
and schedules an event at :meth:`next_end`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

NIC_OUT, NIC_IN, HOST = 0, 1, 2
_EPS_BYTES = 1e-3


class Network:
    """The links and the transfers on them, as numpy columns: every event advances all transfers,
    and a start or an end re-rates them, so an event costs a few vector operations over the active
    transfers (thousands at hundreds of nodes) rather than a Python step per transfer. The arithmetic
    per transfer is the scalar one, element by element (same results as a loop)."""

    _WIDTH = 4  # links per transfer at most (a fetch: NIC out, NIC in, two host links)

    def __init__(self, nic_bytes_per_s: float, host_bytes_per_s: float) -> None:
        if nic_bytes_per_s <= 0 or host_bytes_per_s <= 0:
            raise ValueError("bandwidths must be positive")
        self._cap = {NIC_OUT: nic_bytes_per_s, NIC_IN: nic_bytes_per_s, HOST: host_bytes_per_s}
        self._kind_cap = np.array([nic_bytes_per_s, nic_bytes_per_s, host_bytes_per_s], dtype=np.float64)
        self._link_cap = np.zeros(0, dtype=np.float64)  # per link (node * 3 + kind): its capacity
        self._load = np.zeros(0, dtype=np.int64)  # per link: transfers on it
        # per slot: the transfer's links (padded with its first), bytes left, rate, id, in use
        self._links = np.zeros((0, self._WIDTH), dtype=np.int64)
        self._remaining = np.zeros(0, dtype=np.float64)
        self._rate = np.zeros(0, dtype=np.float64)
        self._tid = np.zeros(0, dtype=np.int64)
        self._width = np.zeros(0, dtype=np.int64)  # real links of the slot's transfer (2 or 4)
        self._used = np.zeros(0, dtype=np.bool_)
        self._free: list[int] = []
        self._slot_of: dict[int, int] = {}  # active transfer id -> slot
        self._at = 0.0
        self._next_id = 0
        self.bytes_moved = 0.0

    def __len__(self) -> int:
        return len(self._slot_of)

    def _grow_links(self, node: int) -> None:
        need = 3 * (node + 1)
        if need > len(self._load):
            size = max(need, 2 * len(self._load))
            self._load = np.concatenate((self._load, np.zeros(size - len(self._load), dtype=np.int64)))
            self._link_cap = np.resize(self._kind_cap, size).astype(np.float64)

    def _take_slot(self) -> int:
        if not self._free:
            old = len(self._used)
            size = max(16, 2 * old)
            self._links = np.concatenate((self._links, np.zeros((size - old, self._WIDTH), dtype=np.int64)))
            self._remaining = np.concatenate((self._remaining, np.zeros(size - old)))
            self._rate = np.concatenate((self._rate, np.zeros(size - old)))
            self._tid = np.concatenate((self._tid, np.zeros(size - old, dtype=np.int64)))
            self._width = np.concatenate((self._width, np.zeros(size - old, dtype=np.int64)))
            self._used = np.concatenate((self._used, np.zeros(size - old, dtype=np.bool_)))
            self._free.extend(range(size - 1, old - 1, -1))  # lowest slot first
        return self._free.pop()

    def start(self, src: int, dst: int, nbytes: float, now: float, *, host: bool) -> int:
        """Start moving ``nbytes`` from ``src`` to ``dst`` (through host memory when ``host``);
        returns the transfer's id."""
        if nbytes < 0:
            raise ValueError(f"bytes must be non-negative, got {nbytes}")
        self._progress(now)
        self._grow_links(max(src, dst))
        out, into = src * 3 + NIC_OUT, dst * 3 + NIC_IN
        links = (out, into, src * 3 + HOST, dst * 3 + HOST) if host else (out, into)
        self._next_id += 1
        tid = self._next_id
        slot = self._take_slot()
        self._links[slot] = links * 2 if len(links) == 2 else links  # padded: the same minimum
        self._width[slot] = len(links)
        self._remaining[slot] = float(nbytes)
        self._tid[slot] = tid
        self._used[slot] = True
        self._slot_of[tid] = slot
        for link in links:  # a link listed twice (a node fetching from itself) counts twice
            self._load[link] += 1
        self.bytes_moved += nbytes
        self._rerate()
        return tid

    def next_end(self) -> float:
        """When the next transfer's bytes are through (``inf``: none active)."""
        if not self._slot_of:
            return math.inf
        live = self._used & (self._rate > 0)
        if not live.any():
            return math.inf
        return float((self._at + self._remaining[live] / self._rate[live]).min())

    def finish_due(self, now: float) -> list[int]:
        """Advance to ``now``; returns the ids whose bytes are through, in the order they started."""
        self._progress(now)
        if not self._slot_of:
            return []
        # through, up to float rounding of the times (a nanosecond's worth of bytes)
        due = self._used & (self._remaining <= _EPS_BYTES + self._rate * 1e-9)
        if not due.any():
            return []
        slots = np.flatnonzero(due)
        done = sorted(int(t) for t in self._tid[slots])
        for tid in done:
            slot = self._slot_of.pop(tid)
            for link in self._links[slot, : self._width[slot]].tolist():
                self._load[link] -= 1
            self._used[slot] = False
            self._remaining[slot] = 0.0
            self._rate[slot] = 0.0
            self._free.append(slot)
        self._rerate()
        return done

    def alone_s(self, nbytes: float, *, host: bool) -> float:
        """How long ``nbytes`` take on an idle network."""
        rate = min(self._cap[NIC_OUT], self._cap[HOST]) if host else self._cap[NIC_OUT]
        return nbytes / rate

    def _progress(self, now: float) -> None:
        dt = now - self._at
        if dt > 0 and self._slot_of:
            # remaining - rate * dt, floored at 0 (idle slots have rate 0 and stay at 0)
            np.maximum(self._remaining - self._rate * dt, 0.0, out=self._remaining)
        self._at = max(self._at, now)

    def _rerate(self) -> None:
        if not self._slot_of:
            return
        slots = np.flatnonzero(self._used)
        links = self._links[slots]
        self._rate[slots] = (self._link_cap[links] / self._load[links]).min(axis=1)


Done = Callable[[int, float], None]  # done(transfer id, at)


class Transfers:
    """The simulator's side of a :class:`Network`: one pending wake-up event and a callback per
    transfer, called at the end of its bytes plus its latency."""

    def __init__(self, net: Network, schedule: Callable[[float, object], None]) -> None:
        self.net = net
        self._schedule = schedule  # schedule(at, payload): the payload comes back to on_event
        self._version = 0
        self._done: dict[int, tuple[float, Done]] = {}

    def start(
        self, src: int, dst: int, nbytes: float, now: float, latency_s: float, done: Done, *, host: bool
    ) -> int:
        tid = self.net.start(src, dst, nbytes, now, host=host)
        self._done[tid] = (latency_s, done)
        self._rewake(now)
        return tid

    def on_event(
        self, payload: object, now: float, later: Callable[[float, Callable[[float], None]], None]
    ) -> None:
        """Handle a wake-up scheduled by this object (stale ones are ignored); ``later(at, fn)``
        schedules ``fn(at)``."""
        if payload != self._version:
            return
        for tid in self.net.finish_due(now):
            latency, done = self._done.pop(tid)
            if latency > 0:
                later(now + latency, functools.partial(done, tid))
            else:
                done(tid, now)
        self._rewake(now)

    def _rewake(self, now: float) -> None:
        self._version += 1
        t = self.net.next_end()
        if t < math.inf:
            self._schedule(max(t, now), self._version)
