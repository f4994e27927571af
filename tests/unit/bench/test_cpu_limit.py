"""bench.cpu_limit: a process limited to a fraction of a core gets no more, and the counters say so."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.bench_router_cpu import cpu_seconds
from bench.cpu_limit import CpuLimitError, CpuLimits, Throttling


def test_throttling_counts_since_a_reading() -> None:
    later = Throttling(periods=50, throttled=30).since(Throttling(periods=10, throttled=10))
    assert later == Throttling(40, 20) and later.share == 0.5
    assert Throttling(0, 0).share == 0.0


@pytest.mark.parametrize("cores", [0.0, -1.0, 1e6])
def test_a_limit_outside_the_machine_is_refused(cores: float) -> None:
    with pytest.raises(CpuLimitError, match="within"):
        CpuLimits(cores)


def test_a_busy_process_limited_to_a_tenth_of_a_core_gets_about_that() -> None:
    try:
        limits = CpuLimits(0.1)
    except CpuLimitError as e:
        pytest.skip(f"no cgroup cpu controller to write here: {e}")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        try:
            limits.limit(busy.pid)
        except CpuLimitError as e:
            pytest.skip(f"cgroups cannot be made here: {e}")
        before, throttled_before = cpu_seconds(busy.pid), limits.throttling(busy.pid)
        time.sleep(1.5)
        used = cpu_seconds(busy.pid) - before
        throttled = limits.throttling(busy.pid).since(throttled_before)
        assert used < 0.3, used  # unlimited it would take about 1.5 s
        assert throttled.periods > 0 and throttled.share > 0.5, throttled
        groups = list(limits.groups.values())
        assert len(groups) == 1 and groups[0].exists()
    finally:
        busy.kill()
        busy.wait()
        limits.close()
    assert not groups[0].exists()  # removed
