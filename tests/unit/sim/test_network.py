"""Transfers share per-node links: concurrent fetches into one node each take longer than one alone."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agentpool.sim.network import Network, Transfers

NIC, HOST = 200e9, 50e9  # bytes/s


def run(net: Any, starts: list[tuple[float, int, int, float, bool]]) -> dict[int, float]:
    """Start transfers ``(at, src, dst, bytes, host)`` in time order; returns id -> end time."""
    ends: dict[int, float] = {}
    ids: list[int] = []
    pending = sorted(starts)
    now = 0.0
    while pending or len(net):
        t_next = net.next_end()
        if pending and pending[0][0] <= t_next:
            at, src, dst, nbytes, host = pending.pop(0)
            now = at
            ids.append(net.start(src, dst, nbytes, now, host=host))
            continue
        now = t_next
        for tid in net.finish_due(now):
            ends[tid] = now
    return ends


def test_one_fetch_alone_goes_at_the_host_link_rate() -> None:
    net = Network(NIC, HOST)
    ends = run(net, [(0.0, 0, 1, 5e9, True)])
    assert ends == {1: pytest.approx(0.1)}
    assert net.alone_s(5e9, host=True) == pytest.approx(0.1)


def test_two_concurrent_fetches_into_one_node_each_take_longer_than_one_alone() -> None:
    alone = run(Network(NIC, HOST), [(0.0, 0, 2, 5e9, True)])[1]
    ends = run(Network(NIC, HOST), [(0.0, 0, 2, 5e9, True), (0.0, 1, 2, 5e9, True)])
    assert ends[1] > alone and ends[2] > alone
    assert ends[1] == pytest.approx(2 * alone) and ends[2] == pytest.approx(2 * alone)


def test_fetches_between_separate_nodes_do_not_slow_each_other() -> None:
    ends = run(Network(NIC, HOST), [(0.0, 0, 1, 5e9, True), (0.0, 2, 3, 5e9, True)])
    assert ends == {1: pytest.approx(0.1), 2: pytest.approx(0.1)}


def test_a_later_transfer_slows_the_running_one_from_when_it_starts() -> None:
    # 5 GB alone: 0.1 s. A second one from 0.05 s on shares the destination's host link: the first
    # has 2.5 GB left at half rate (0.1 s more), the second finishes its last 2.5 GB alone.
    ends = run(Network(NIC, HOST), [(0.0, 0, 2, 5e9, True), (0.05, 1, 2, 5e9, True)])
    assert ends[1] == pytest.approx(0.15)
    assert ends[2] == pytest.approx(0.2)


def test_a_handover_shares_the_nic_with_fetches_but_not_the_host_link() -> None:
    nic_only = run(Network(NIC, HOST), [(0.0, 0, 1, 20e9, False)])[1]
    assert nic_only == pytest.approx(0.1)
    # the fetch is host-bound (50 GB/s) but takes half the destination NIC; the hand-over gets the rest
    ends = run(Network(NIC, HOST), [(0.0, 0, 1, 20e9, False), (0.0, 2, 1, 2.5e9, True)])
    assert ends[1] > nic_only


def test_transfers_call_back_after_their_latency_and_ignore_stale_wakeups() -> None:
    scheduled: list[tuple[float, object]] = []
    later: list[tuple[float, object]] = []
    done: list[tuple[int, float]] = []
    tr = Transfers(Network(NIC, HOST), lambda at, payload: scheduled.append((at, payload)))
    tid = tr.start(0, 1, 5e9, 0.0, 0.001, lambda t, at: done.append((t, at)), host=True)
    tr.start(2, 3, 1e9, 0.0, 0.0, lambda t, at: done.append((t, at)), host=True)
    stale, current = scheduled[0], scheduled[-1]
    tr.on_event(stale[1], stale[0], lambda at, fn: later.append((at, fn)))
    assert done == [] and later == []  # a superseded wake-up does nothing
    tr.on_event(current[1], current[0], lambda at, fn: later.append((at, fn)))
    assert done == [(2, pytest.approx(0.02))]
    at, payload = scheduled[-1]
    tr.on_event(payload, at, lambda at, fn: later.append((at, fn)))
    assert len(later) == 1 and later[0][0] == pytest.approx(0.1 + 0.001)
    assert tid == 1 and math.isinf(tr.net.next_end())


def test_bad_bandwidths_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        Network(0.0, HOST)
    with pytest.raises(ValueError):
        Network(NIC, HOST).start(0, 1, -1.0, 0.0, host=True)


class _ScalarNetwork:
    """The processor-sharing rules written out per transfer (the reference the vector form must
    match exactly): advance every transfer, re-rate every transfer at each start and end."""

    def __init__(self, nic: float, host: float) -> None:
        self.cap = {0: nic, 1: nic, 2: host}
        self.active: dict[int, list[Any]] = {}  # id -> [links, remaining, rate]
        self.load: dict[tuple[int, int], int] = {}
        self.at = 0.0
        self.next_id = 0

    def __len__(self) -> int:
        return len(self.active)

    def _progress(self, now: float) -> None:
        dt = now - self.at
        if dt > 0:
            for tr in self.active.values():
                tr[1] = max(0.0, tr[1] - tr[2] * dt)
        self.at = max(self.at, now)

    def _rerate(self) -> None:
        for tr in self.active.values():
            tr[2] = min(self.cap[k] / self.load[(n, k)] for n, k in tr[0])

    def start(self, src: int, dst: int, nbytes: float, now: float, *, host: bool) -> int:
        self._progress(now)
        links = ((src, 0), (dst, 1)) + (((src, 2), (dst, 2)) if host else ())
        self.next_id += 1
        self.active[self.next_id] = [links, float(nbytes), 0.0]
        for link in links:
            self.load[link] = self.load.get(link, 0) + 1
        self._rerate()
        return self.next_id

    def next_end(self) -> float:
        return min((self.at + tr[1] / tr[2] for tr in self.active.values() if tr[2] > 0), default=math.inf)

    def finish_due(self, now: float) -> list[int]:
        self._progress(now)
        done = [t for t, tr in self.active.items() if tr[1] <= 1e-3 + tr[2] * 1e-9]
        for t in done:
            for link in self.active.pop(t)[0]:
                self.load[link] -= 1
        if done:
            self._rerate()
        return done


@pytest.mark.parametrize("seed", range(6))
def test_the_vector_network_matches_the_scalar_rules_exactly(seed: int) -> None:
    import random

    rng = random.Random(seed)
    nodes = rng.choice([3, 8, 40])
    starts = [
        (
            rng.uniform(0.0, 2.0),
            rng.randrange(nodes),
            rng.randrange(nodes),
            rng.uniform(1e6, 2e10),
            rng.random() < 0.6,
        )
        for _ in range(300)
    ]
    fast = run(Network(NIC, HOST), starts)
    slow = run(_ScalarNetwork(NIC, HOST), starts)
    assert fast == slow  # identical floats, not approximately equal
    assert len(fast) == 300
