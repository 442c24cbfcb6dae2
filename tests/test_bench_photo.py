"""``python -m bench.photo`` runs end to end: the harness behind issue 21's photo-path numbers cannot rot.

The bench-tier test runs the real command in a child process, briefly, on the real MobileNetV2 (fetched
by ovserve's zoo): every row (gRPC BYTES, REST binary, the in-process pipeline) answered without errors,
and the run's file has the table and the targets; never a speed. The unit tests pin what the harness
computes from its rows.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import photo
from bench.measure import Row

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_path_answers_and_the_run_is_written(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.photo", "--duration", "0.6", "--warmup", "0.2", "--concurrency", "1,4",
         "--wait-quiet", "0", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=840, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if proc.returncode == 2 and "cannot be had" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [md] = tmp_path.glob("photo-*.md")
    [data] = tmp_path.glob("photo-*.csv")
    rows = list(csv.DictReader(data.open()))
    assert {(r["server"], r["protocol"], r["concurrency"]) for r in rows} == {
        (s, p, c) for (s, p) in photo.PATHS for c in ("1", "4")}
    for r in rows:
        assert float(r["throughput"]) > 0 and int(r["count"]) > 0 and int(r["errors"]) == 0, r
    text = md.read_text()
    assert "photo grpc c4 / in process c4" in text and "photo rest-binary c4 / in process c4" in text


def test_served_paths_are_compared_with_the_in_process_pipeline_at_the_same_concurrency() -> None:
    rows = [Row("mobilenet_v2", "ovserve", "grpc", 4, throughput=180.0, count=900, server_cpu_pct=150.0),
            Row("mobilenet_v2", "ovserve", "rest-binary", 4, throughput=140.0, count=700, server_cpu_pct=140.0),
            Row("mobilenet_v2", "raw", "photo", 4, throughput=200.0, count=1000, server_cpu_pct=120.0),
            Row("mobilenet_v2", "raw", "photo", 1, throughput=100.0, count=500, server_cpu_pct=60.0)]
    got = {t.case: t for t in photo.targets(rows)}
    assert got["photo grpc c4 / in process c4"].value == 0.9 and got["photo grpc c4 / in process c4"].met
    assert got["photo rest-binary c4 / in process c4"].value == 0.7
    assert got["photo rest-binary c4 / in process c4"].met is False
    body = {(r[0], r[1]): r for r in photo.table(rows)}
    assert body[(photo.PATHS[("ovserve", "grpc")], "4")][-1] == "0.90"
    assert body[(photo.PATHS[("ovserve", "grpc")], "4")][7] == "8333"  # 1.5 s of CPU per s / 180 images
    assert body[(photo.PATHS[("raw", "photo")], "1")][-1] == ""  # the pipeline is the baseline


def test_rounds_are_read_as_medians_and_targets_as_each_rounds_paired_ratio() -> None:
    def round_of(grpc: float, raw: float) -> list[Row]:
        return [Row("mobilenet_v2", "ovserve", "grpc", 4, throughput=grpc, count=10, server_cpu_pct=180.0),
                Row("mobilenet_v2", "ovserve", "rest-binary", 4, throughput=grpc, count=10, server_cpu_pct=180.0),
                Row("mobilenet_v2", "raw", "photo", 4, throughput=raw, count=10, server_cpu_pct=198.0)]

    # round 2 ran in a slow spell (both rows slow), round 4 on a slow server start: paired, three rounds read
    # 0.8 and one 0.57 (median 0.8); the medians of the cells, unpaired, would read 275 / 387.5 = 0.71
    rounds = [round_of(320, 400), round_of(240, 300), round_of(300, 375), round_of(250, 440)]
    rows = [r for one in rounds for r in one]
    cells = {(r.server, r.protocol, r.concurrency): r for r in photo.merged(rows)}
    assert cells[("ovserve", "grpc", 4)].throughput == 275 and cells[("raw", "photo", 4)].throughput == 387.5
    assert cells[("ovserve", "grpc", 4)].count == 40
    got = {t.case: t for t in photo.targets(rows, rounds)}
    target = got["photo grpc c4 / in process c4"]
    assert target.value == pytest.approx(0.8) and target.met
    assert "median of 4 rounds" in target.measured
    assert photo.targets(rows)[0].value == pytest.approx(275 / 387.5)  # without the rounds: the cells' medians
    body = {(r[0], r[1]): r for r in photo.table(rows)}
    assert body[(photo.PATHS[("ovserve", "grpc")], "4")][2] == "275"  # one line per cell, not one per round


def test_a_round_without_answers_is_left_out_of_the_medians_not_read_as_zero() -> None:
    rows = [Row("mobilenet_v2", "ovserve", "grpc", 4, throughput=t, count=n, errors=e, server_cpu_pct=180.0)
            for t, n, e in ((300.0, 10, 0), (0.0, 0, 5), (320.0, 10, 0))]
    [cell] = photo.merged(rows)
    assert cell.throughput == 310 and cell.errors == 5 and cell.count == 20
