"""The CPU budget read from cgroup files, on file trees laid out as the kernel and Kubernetes lay them out."""
from __future__ import annotations

from pathlib import Path

import pytest

from ovserve.server.cpus import CpuBudget, cgroup_cpu_quota

POD = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope"


def _write(root: Path, rel: str, files: dict[str, str]) -> None:
    folder = root.joinpath(*[p for p in rel.split("/") if p])
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text + "\n")


def _proc(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proc-self-cgroup"
    path.write_text(text)
    return path


def _v2(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    _write(root, "/", {"cgroup.controllers": "cpuset cpu io memory pids"})
    return root


def test_v2_container_limit_seen_from_the_host_path(tmp_path: Path) -> None:
    root = _v2(tmp_path)
    _write(root, POD, {"cpu.max": "200000 100000"})
    _write(root, POD.rsplit("/", 1)[0], {"cpu.max": "max 100000"})
    assert cgroup_cpu_quota(root, _proc(tmp_path, f"0::{POD}\n")) == 2.0


def test_v2_inside_a_container_namespace_reads_the_mount_itself(tmp_path: Path) -> None:
    """With a cgroup namespace /proc/self/cgroup says "0::/" and the mount is the container's cgroup."""
    root = _v2(tmp_path)
    _write(root, "/", {"cpu.max": "150000 100000"})
    assert cgroup_cpu_quota(root, _proc(tmp_path, "0::/\n")) == 1.5


def test_v2_the_tightest_ancestor_wins(tmp_path: Path) -> None:
    root = _v2(tmp_path)
    _write(root, POD, {"cpu.max": "400000 100000"})
    _write(root, POD.rsplit("/", 1)[0], {"cpu.max": "50000 100000"})  # the pod: half a CPU
    assert cgroup_cpu_quota(root, _proc(tmp_path, f"0::{POD}\n")) == 0.5


@pytest.mark.parametrize("text", ["max 100000", "", "garbage", "0 100000", "100000 0"])
def test_v2_no_limit_or_unreadable(tmp_path: Path, text: str) -> None:
    root = _v2(tmp_path)
    _write(root, "/app", {"cpu.max": text})
    assert cgroup_cpu_quota(root, _proc(tmp_path, "0::/app\n")) is None


def test_v1_cpu_controller_with_a_quota(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root, "cpu,cpuacct/docker/abc", {"cpu.cfs_quota_us": "300000", "cpu.cfs_period_us": "100000"})
    proc = _proc(tmp_path, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/docker/abc\n")
    assert cgroup_cpu_quota(root, proc) == 3.0


def test_v1_container_whose_mount_is_its_own_cgroup(tmp_path: Path) -> None:
    """Without a cgroup namespace the file names the host's path, which the container cannot see."""
    root = tmp_path / "cgroup"
    _write(root, "cpu", {"cpu.cfs_quota_us": "100000", "cpu.cfs_period_us": "100000"})
    assert cgroup_cpu_quota(root, _proc(tmp_path, "3:cpu:/kubepods/pod1/abc\n")) == 1.0


def test_v1_unlimited_and_hybrid_v2_without_cpu(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root, "cpu", {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"})
    _write(root, "unified", {"cgroup.procs": ""})
    assert cgroup_cpu_quota(root, _proc(tmp_path, "1:cpu:/\n2:cpuacct:/\n0::/\n")) is None


def test_no_cgroups_at_all(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path / "missing", tmp_path / "missing-proc") is None


@pytest.mark.parametrize(("visible", "quota", "usable", "capped"), [
    (64, 2.0, 2, True),  # limits.cpu: 2 on a 64-core node
    (64, 2.5, 2, True),  # rounded down: one thread more than the quota runs gets the group throttled
    (8, 0.5, 1, True),  # below one CPU: still one thread
    (2, 4.0, 2, False),  # a quota above the CPUs in sight changes nothing
    (2, None, 2, False),
])
def test_usable_cpus(visible: int, quota: float | None, usable: int, capped: bool) -> None:
    budget = CpuBudget(visible, quota)
    assert (budget.usable, budget.capped) == (usable, capped)
