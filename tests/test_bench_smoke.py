"""The benchmark's smoke mode runs end to end: it cannot rot; and a run is written where it belongs.

Runs ``python -m bench --smoke`` (a second or two per case, concurrency 1,
no peer) in a child process and checks that it prints its table and that
every ovserve case answered with nonzero throughput and no errors. Speed is
never asserted: runs are recorded in bench/results/ and cited by
docs/performance.md. The writing path is checked on its own too: one file per
run in the results directory, never anything in docs/, and nothing at all for
a smoke run unless ``--out`` asks.
"""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bench import report
from bench.__main__ import RESULTS, default_engine, parse_args
from bench.measure import Row

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_smoke(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=540,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
     check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "infer/s" in proc.stdout and "Targets (issue 4)" in proc.stdout, proc.stdout[-3000:]
    latest = (tmp_path / "latest.md").read_text()
    assert latest.count("| ovserve |") == 6
    [run_md] = [p for p in tmp_path.glob("*.md") if p.name != "latest.md"]
    assert run_md.read_text() == latest and "- command: `python -m bench --smoke --out" in latest
    [csv_path] = tmp_path.glob("*.csv")
    assert csv_path.stem == run_md.stem
    rows = list(csv.DictReader(csv_path.open()))
    ours = [r for r in rows if r["server"] == "ovserve"]
    cases = {(r["model"], r["protocol"]) for r in ours}
    assert cases == {(m, p) for m in ("add", "resnetish") for p in ("grpc", "rest-json", "rest-binary")}
    for r in ours:
        assert float(r["throughput"]) > 0 and int(r["count"]) > 0, r
        assert int(r["errors"]) == 0, r
    assert {r["protocol"] for r in rows if r["server"] == "raw"} == {"sync", "async"}
    # the ovserve rows are the default engine's (what `--grpc-engine auto` serves, as the server logged it); every
    # other engine (pygrpc-native is in the test extra) gets gRPC rows of its own, ovserve-<engine>, and its
    # targets tagged [<engine>]
    default = default_engine()
    assert f"ovserve {default} (auto)" in latest, latest
    for engine in {"grpcio", "loop", "native"} - {default}:
        theirs = [r for r in rows if r["server"] == f"ovserve-{engine}"]
        assert {(r["model"], r["protocol"]) for r in theirs} == {("add", "grpc"), ("resnetish", "grpc")}, engine
        for r in theirs:
            assert float(r["throughput"]) > 0 and int(r["errors"]) == 0, r
        assert f"ovserve-{engine} {engine} (--grpc-engine {engine})" in latest, latest
        assert f"[{engine}]" in proc.stdout, proc.stdout[-3000:]
    assert f"[{default}]" not in proc.stdout, proc.stdout[-3000:]


def _run(started: datetime) -> report.Run:
    rows = [Row("add", "raw", "async", 4, throughput=1000.0, p50_ms=0.1, p99_ms=0.2, count=5000),
            Row("add", "ovserve", "grpc", 4, throughput=500.0, p50_ms=1.0, p99_ms=2.0, count=2500, client_cpu_pct=10.0)]
    return report.Run(rows, {"ovserve": 110.0}, ["add"], "python -m bench --models add", started,
                      {"ovserve": "0.1.0"}, 5.0, hints="add LATENCY")


def test_a_run_is_one_file_in_the_results_directory_and_latest_md(tmp_path: Path) -> None:
    started = datetime(2026, 11, 24, 2, 50, 19, tzinfo=timezone.utc)
    written = report.write_outputs(_run(started), tmp_path)
    assert [p.name for p in written] == ["20261124-0250.md", "latest.md", "20261124-0250.csv"]
    text = (tmp_path / "20261124-0250.md").read_text()
    assert text.startswith("# ovserve benchmark, 2026-11-24 02:50 UTC\n")
    assert "- command: `python -m bench --models add`" in text and "| add | ovserve | grpc | 4 | 500 |" in text
    assert "Targets (issue 4):" in text and (tmp_path / "latest.md").read_text() == text
    # a second run in the same minute gets its own file, not the first one's
    later = report.write_outputs(_run(started.replace(second=48)), tmp_path)
    assert [p.name for p in later] == ["20261124-025048.md", "latest.md", "20261124-025048.csv"]
    assert (tmp_path / "20261124-0250.md").read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "20261124-0250.csv", "20261124-0250.md", "20261124-025048.csv", "20261124-025048.md", "latest.md"]


def test_runs_go_to_bench_results_and_a_smoke_run_nowhere_unless_asked(tmp_path: Path) -> None:
    assert parse_args([]).out == RESULTS == Path(__file__).resolve().parent.parent / "bench" / "results"
    assert parse_args(["--smoke"]).out is None
    assert parse_args(["--smoke", "--out", str(tmp_path)]).out == tmp_path
    for gone in ("--docs", "--no-docs"):  # the bench no longer writes into docs/
        with pytest.raises(SystemExit):
            parse_args([gone] + (["docs/performance.md"] if gone == "--docs" else []))


def test_the_performance_document_stays_a_document() -> None:
    """docs/performance.md holds how numbers are made, the decisions, one current table and what is not met
    (issue 39, item 6): under 700 lines, and no dated run under a heading of its own (runs live in
    bench/results/, which it links to)."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "performance.md").read_text()
    lines = doc.splitlines()
    assert len(lines) < 700, f"{len(lines)} lines: move dated runs to bench/results/ and link them"
    dated = [line for line in lines if line.startswith("#") and re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, dated
    assert "bench/results/" in doc
