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
from dataclasses import dataclass

NIC_OUT, NIC_IN, HOST = 0, 1, 2
_EPS_BYTES = 1e-3


@dataclass(slots=True)
class _Transfer:
    links: tuple[tuple[int, int], ...]
    remaining: float
    rate: float = 0.0


class Network:
    def __init__(self, nic_bytes_per_s: float, host_bytes_per_s: float) -> None:
        if nic_bytes_per_s <= 0 or host_bytes_per_s <= 0:
            raise ValueError("bandwidths must be positive")
        self._cap = {NIC_OUT: nic_bytes_per_s, NIC_IN: nic_bytes_per_s, HOST: host_bytes_per_s}
        self._active: dict[int, _Transfer] = {}
        self._load: dict[tuple[int, int], int] = {}
        self._at = 0.0
        self._next_id = 0
        self.bytes_moved = 0.0

    def __len__(self) -> int:
        return len(self._active)

    def start(self, src: int, dst: int, nbytes: float, now: float, *, host: bool) -> int:
        """Start moving ``nbytes`` from ``src`` to ``dst`` (through host memory when ``host``);
        returns the transfer's id."""
        if nbytes < 0:
            raise ValueError(f"bytes must be non-negative, got {nbytes}")
        self._progress(now)
        links: tuple[tuple[int, int], ...] = ((src, NIC_OUT), (dst, NIC_IN))
        if host:
            links += ((src, HOST), (dst, HOST))
        self._next_id += 1
        tid = self._next_id
        self._active[tid] = _Transfer(links, float(nbytes))
        for link in links:
            self._load[link] = self._load.get(link, 0) + 1
        self.bytes_moved += nbytes
        self._rerate()
        return tid

    def next_end(self) -> float:
        """When the next transfer's bytes are through (``inf``: none active)."""
        t = math.inf
        for tr in self._active.values():
            if tr.rate > 0:
                t = min(t, self._at + tr.remaining / tr.rate)
        return t

    def finish_due(self, now: float) -> list[int]:
        """Advance to ``now``; returns the ids whose bytes are through."""
        self._progress(now)
        # through, up to float rounding of the times (a nanosecond's worth of bytes)
        done = [tid for tid, tr in self._active.items() if tr.remaining <= _EPS_BYTES + tr.rate * 1e-9]
        for tid in done:
            for link in self._active.pop(tid).links:
                self._load[link] -= 1
        if done:
            self._rerate()
        return done

    def alone_s(self, nbytes: float, *, host: bool) -> float:
        """How long ``nbytes`` take on an idle network."""
        rate = min(self._cap[NIC_OUT], self._cap[HOST]) if host else self._cap[NIC_OUT]
        return nbytes / rate

    def _progress(self, now: float) -> None:
        dt = now - self._at
        if dt > 0:
            for tr in self._active.values():
                tr.remaining = max(0.0, tr.remaining - tr.rate * dt)
        self._at = max(self._at, now)

    def _rerate(self) -> None:
        cap, load = self._cap, self._load
        for tr in self._active.values():
            tr.rate = min(cap[kind] / load[(node, kind)] for node, kind in tr.links)


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
