"""``python -m bench.client_cost`` runs end to end with a few calls, so that it cannot rot.

Every client whose package is installed runs (each in its own process, against a real ovserve server the
bench starts) and answers right (the bench checks x + 1 itself and fails otherwise); the table is printed
and written. Speed is never asserted: the figures are docs/performance.md's ("Client CPU per call").
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.client_cost import CLIENTS

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(600)
def test_client_cost_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.client_cost", "--calls", "20", "--warmup", "5",
                           "--rounds", "2", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=540, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    installed = [c for c, (_, package, _) in CLIENTS.items() if importlib.util.find_spec(package) is not None]
    assert "ovserve-grpc" in installed and "ovserve-rest" in installed
    [written] = tmp_path.glob("client-cost-*.md")
    text = written.read_text()
    for client in CLIENTS:
        row = re.search(rf"^\| {re.escape(client)} \| (grpc|rest) \| (\d+) \| (\d+) \|", text, re.M)
        if client in installed:
            assert row, f"no row for {client}:\n{text}"
            assert int(row[2]) > 0 and int(row[3]) > 0, row[0]
            assert re.search(rf"^{re.escape(client)} +(grpc|rest) +\d+", proc.stdout, re.M), proc.stdout
        else:
            assert row is None and f"{client}: left out" in proc.stdout
    assert "- load: " in text and "medians of 2 rounds" in text
