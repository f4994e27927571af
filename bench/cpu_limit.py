"""CPU limits for benchmark processes, as a Kubernetes pod's CPU limit: each limited process in a cgroup
of its own with a CFS quota (``cores`` CPUs' worth of time per period).

On a 2-core machine the load generator, the engines and the routers share the cores, so a second router
replica has no core to run on and the replica benchmark cannot show scaling. With every router limited
to a fraction of a core, as its pod would be in a cluster, the routers are the bottleneck and the rest
has the cores it needs: one router against two then measures what replicas add. Needs write access
to the cgroup ``cpu`` controller (root on Linux; cgroup v1's ``cpu`` hierarchy or v2 with ``cpu``
enabled); :class:`CpuLimitError` says so otherwise.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

PERIOD_US = 100_000
V1_CPU = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")


class CpuLimitError(RuntimeError):
    """No writable cgroup cpu controller here."""


@dataclass
class Throttling:
    """A cgroup's CFS counters: periods with runnable work, and those the quota cut short."""

    periods: int
    throttled: int

    def since(self, before: Throttling) -> Throttling:
        return Throttling(self.periods - before.periods, self.throttled - before.throttled)

    @property
    def share(self) -> float:
        return self.throttled / self.periods if self.periods else 0.0


@dataclass
class CpuLimits:
    """Cgroups made under the cpu controller, each with a quota of ``cores`` CPUs; removed on close."""

    cores: float
    groups: dict[int, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.cores <= (os.cpu_count() or 1):
            raise CpuLimitError(f"a CPU limit must be within (0, {os.cpu_count()}] cores, got {self.cores}")
        self._v1 = (V1_CPU / "cpu.cfs_quota_us").exists()
        if not self._v1 and "cpu" not in _read(V2_ROOT / "cgroup.subtree_control").split():
            raise CpuLimitError(
                "CPU limits need the cgroup cpu controller (cgroup v1's /sys/fs/cgroup/cpu, or v2 with "
                "cpu in /sys/fs/cgroup/cgroup.subtree_control)"
            )

    def limit(self, pid: int) -> None:
        """Move ``pid`` into a new cgroup of its own with the quota."""
        group = (V1_CPU if self._v1 else V2_ROOT) / f"agentpool-bench-{os.getpid()}-{pid}"
        quota = max(1000, round(self.cores * PERIOD_US))
        try:
            group.mkdir()
            if self._v1:
                (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (group / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            (group / "cgroup.procs").write_text(str(pid))
        except OSError as e:
            raise CpuLimitError(f"cannot limit process {pid} in {group}: {e.strerror or e}") from None
        self.groups[pid] = group

    def throttling(self, pid: int) -> Throttling:
        stat = dict(line.split() for line in _read(self.groups[pid] / "cpu.stat").splitlines() if line)
        return Throttling(int(stat.get("nr_periods", 0)), int(stat.get("nr_throttled", 0)))

    def close(self) -> None:
        """Remove the cgroups (processes still in one go back to the root group first)."""
        root = V1_CPU if self._v1 else V2_ROOT
        for group in self.groups.values():
            with contextlib.suppress(OSError):
                for pid in _read(group / "cgroup.procs").split():
                    (root / "cgroup.procs").write_text(pid)
                group.rmdir()
        self.groups.clear()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
