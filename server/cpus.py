"""How many CPUs this process may really use: its affinity mask, capped by a cgroup CPU quota.

OpenVINO sizes its CPU thread pools from the CPUs it can see (the affinity
mask), not from the CPU time it is allowed. A Kubernetes container with
``limits.cpu: 2`` on a 64-core node gets a CFS quota of 2 CPUs but sees 64
CPUs, so the LATENCY hint starts a thread per core; the quota is spent within
a fraction of each scheduling period, the whole group is throttled until the
next one, and an inference that straddles it waits tens of milliseconds.
ovserve therefore gives OpenVINO ``INFERENCE_NUM_THREADS`` = the quota
(rounded down) when the quota is below the visible CPUs and the model's
``plugin_config`` does not choose its threads itself (measured:
docs/performance.md "A cgroup CPU quota caps OpenVINO's threads").

Both cgroup versions are read: v2's ``cpu.max`` ("max 100000" or
"200000 100000") and v1's ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, at the
process's own cgroup and each ancestor (the tightest wins). Inside a
container the controller's mount point is the container's own cgroup while
``/proc/self/cgroup`` may still name the host's path, so the mount point
itself is read too.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
#: the names a v1 cpu controller is mounted under
V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


@dataclass(frozen=True, slots=True)
class CpuBudget:
    visible: int  # CPUs in the affinity mask
    quota: float | None  # CPUs' worth of time per period the cgroups allow; None: unlimited

    @property
    def usable(self) -> int:
        """The threads worth running at once: the visible CPUs, or fewer if the quota says so."""
        if self.quota is None:
            return self.visible
        return max(1, min(self.visible, math.floor(self.quota)))

    @property
    def capped(self) -> bool:
        return self.usable < self.visible


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ancestors(base: Path, rel: str) -> list[Path]:
    """``base/rel`` and each folder above it, up to ``base`` itself."""
    out = []
    path = base.joinpath(*[p for p in rel.split("/") if p and p != ".."])
    while True:
        out.append(path)
        if path == base:
            return out
        path = path.parent


def _tightest(values: list[float]) -> float | None:
    return min(values) if values else None


#: (quota, period) of a cgroup without a CPU limit, as the files below read when absent
NO_LIMIT = ("-1", "0")


def _v2_limit(folder: Path) -> tuple[str, str]:
    """cgroup v2: ``cpu.max`` is "QUOTA PERIOD", or "max PERIOD" without a limit."""
    parts = (_read(folder / "cpu.max") or "").split()
    return (parts[0], parts[1]) if len(parts) == 2 else NO_LIMIT


def _v1_limit(folder: Path) -> tuple[str, str]:
    """cgroup v1: ``cpu.cfs_quota_us`` (-1 without a limit) and ``cpu.cfs_period_us``."""
    return _read(folder / "cpu.cfs_quota_us") or NO_LIMIT[0], _read(folder / "cpu.cfs_period_us") or NO_LIMIT[1]


def _quota(base: Path, rel: str, limit: Callable[[Path], tuple[str, str]]) -> float | None:
    """The tightest quota, in CPUs, of the cgroup ``rel`` under ``base`` and its ancestors."""
    found = []
    for folder in _ancestors(base, rel):
        try:
            quota, period = (int(v) for v in limit(folder))
        except ValueError:  # "max", or garbage
            continue
        if quota > 0 and period > 0:
            found.append(quota / period)
    return _tightest(found)


def cgroup_cpu_quota(root: Path, proc_cgroup: Path) -> float | None:
    """The CPU time this process's cgroups allow, in CPUs (1.5 = 150 ms per 100 ms); None if unlimited."""
    found = []
    for line in (_read(proc_cgroup) or "").splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hier == "0" and controllers == "":
            # cgroup v2: the unified hierarchy at the root, or under unified/ beside v1 (hybrid)
            base = root if (root / "cgroup.controllers").exists() else root / "unified"
            quota = _quota(base, rel, _v2_limit)
        elif "cpu" in controllers.split(","):
            mount = next((root / name for name in V1_CPU_MOUNTS if (root / name).is_dir()), None)
            quota = _quota(mount, rel, _v1_limit) if mount is not None else None
        else:
            continue
        if quota is not None:
            found.append(quota)
    return _tightest(found)


def cpu_budget() -> CpuBudget:
    """The CPUs this process may run on and the CPU time it may use there."""
    return CpuBudget(len(os.sched_getaffinity(0)), cgroup_cpu_quota(CGROUP_ROOT, PROC_SELF_CGROUP))


CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The instruction-set flags of the first processor in ``/proc/cpuinfo`` (empty where it cannot be read)."""
    for line in (_read(cpuinfo) or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()
