"""Transfers share per-node links: concurrent fetches into one node each take longer than one alone."""

from __future__ import annotations

import math

import pytest

from agentpool.sim.network import Network, Transfers

NIC, HOST = 200e9, 50e9  # bytes/s


def run(net: Network, starts: list[tuple[float, int, int, float, bool]]) -> dict[int, float]:
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
