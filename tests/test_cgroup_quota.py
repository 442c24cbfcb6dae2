"""A server started in a real cgroup with a CPU quota, as a Kubernetes container with ``limits.cpu`` is.

Needs the right to create a cgroup with the cpu controller (root, with cgroup
v1's cpu hierarchy or cgroup v2 with the cpu controller delegated); skips with
the reason otherwise.
"""
from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from . import models
from .servers import EXACT, ServerProcess

V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")


def _new_cgroup(quota_us: int, period_us: int) -> Path:
    name = f"ovserve-test-{uuid.uuid4().hex[:8]}"
    try:
        if (V1 / "cpu.cfs_quota_us").exists():
            folder = V1 / name
            folder.mkdir()
            (folder / "cpu.cfs_period_us").write_text(str(period_us))
            (folder / "cpu.cfs_quota_us").write_text(str(quota_us))
            return folder
        if "cpu" in (V2 / "cgroup.subtree_control").read_text().split():
            folder = V2 / name
            folder.mkdir()
            (folder / "cpu.max").write_text(f"{quota_us} {period_us}")
            return folder
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup with a CPU quota here: {exc}")
    pytest.skip("no cgroup cpu controller to write to (cgroup v1 cpu, or v2 with cpu in subtree_control)")


@pytest.fixture
def one_cpu_cgroup() -> Iterator[Path]:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU in sight: a quota of one CPU caps nothing")
    folder = _new_cgroup(100_000, 100_000)
    yield folder
    with contextlib.suppress(OSError):  # a process still inside (stopped: the kernel frees the group when it is gone)
        folder.rmdir()


def test_a_server_in_a_one_cpu_cgroup_runs_openvino_on_one_thread(tmp_path: Path, one_cpu_cgroup: Path) -> None:
    models.save(models.add_one(), tmp_path / "repo", "add")  # untuned, tiny: one thread whatever the quota
    models.save(models.conv_stack(layers=2, channels=16, size=28), tmp_path / "repo", "conv")  # 7 MFLOP
    procs = one_cpu_cgroup / "cgroup.procs"

    def enter() -> None:  # in the child, before exec: the whole server lives in the group
        procs.write_text(str(os.getpid()))

    server = ServerProcess(["--model-repository", str(tmp_path / "repo"), *EXACT], setup=enter)
    try:
        server.wait_ready()
        line = server.wait_log(r"cgroup CPU quota allows 1 of the \d+ CPUs in sight: INFERENCE_NUM_THREADS 1")
        assert "conv/1/model.xml" in line
        # the untuned rule counts the CPUs the quota allows: one, so no THROUGHPUT to split it
        assert "PERFORMANCE_HINT LATENCY (" in server.wait_log(r"conv/1/model\.xml: untuned: .* on one CPU: one stream")
        assert "INFERENCE_NUM_THREADS 1" in server.wait_log(r"add/1/model\.xml: untuned: ")
        assert str(server.proc.pid) in procs.read_text().split()
        x = np.arange(32, dtype=np.float32).reshape(2, 16)
        reply = requests.post(f"{server.url}/v2/models/add/infer", timeout=30, json={
            "inputs": [{"name": "x", "shape": [2, 16], "datatype": "FP32", "data": x.ravel().tolist()}]})
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == (x + 1).ravel().tolist()
    finally:
        assert server.stop() == 0, server.log
