"""The benchmark's smoke mode runs end to end: it cannot rot.

Runs ``python -m bench --smoke`` (a second or two per case, concurrency 1,
no peer) in a child process and checks that it prints its table and that
every ovserve case answered with nonzero throughput and no errors. Speed is
never asserted: this machine's numbers belong in docs/performance.md.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_smoke(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=540,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "infer/s" in proc.stdout and "Targets (issue 4)" in proc.stdout, proc.stdout[-3000:]
    assert (tmp_path / "latest.md").read_text().count("| ovserve |") == 6
    [csv_path] = tmp_path.glob("*.csv")
    rows = list(csv.DictReader(csv_path.open()))
    ours = [r for r in rows if r["server"] == "ovserve"]
    cases = {(r["model"], r["protocol"]) for r in ours}
    assert cases == {(m, p) for m in ("add", "resnetish") for p in ("grpc", "rest-json", "rest-binary")}
    for r in ours:
        assert float(r["throughput"]) > 0 and int(r["count"]) > 0, r
        assert int(r["errors"]) == 0, r
    assert {r["protocol"] for r in rows if r["server"] == "raw"} == {"sync", "async"}
    # the native gRPC engine (pygrpc-native, in the test extra) gets gRPC rows of its own
    native = [r for r in rows if r["server"] == "ovserve-native"]
    assert {(r["model"], r["protocol"]) for r in native} == {("add", "grpc"), ("resnetish", "grpc")}
    for r in native:
        assert float(r["throughput"]) > 0 and int(r["errors"]) == 0, r
    assert "[native]" in proc.stdout and "[grpcio]" in proc.stdout, proc.stdout[-3000:]
