"""``python -m bench.defaults`` runs end to end: the harness behind issue 21's "good without tuning" cannot rot.

The bench-tier test runs the real command in a child process, briefly, on ``add`` alone: both
configurations (the untuned server on a repository without config.json, the tuned one through
config.json) answered every protocol and concurrency without errors, and the run's file has the
tables; never a speed. The unit tests pin what the harness computes from its rows and reads from the
server's log.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import defaults, servers
from bench.measure import Row

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_both_configurations_answer_and_the_run_is_written(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.defaults", "--models", "add", "--duration", "0.5", "--warmup", "0.2",
         "--concurrency", "1,4", "--repeat", "1", "--wait-quiet", "0", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=540, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [md] = tmp_path.glob("defaults-*.md")
    [data] = tmp_path.glob("defaults-*.csv")
    assert data.stem == md.stem
    rows = list(csv.DictReader(data.open()))
    assert {(r["model"], r["server"], r["protocol"], r["concurrency"]) for r in rows} == {
        ("add", config, p, c) for config in ("untuned", "tuned") for p in ("grpc", "rest-binary") for c in ("1", "4")}
    for r in rows:
        assert float(r["throughput"]) > 0 and int(r["count"]) > 0 and int(r["errors"]) == 0, r
    text = md.read_text()
    assert text.startswith("# Defaults without tuning, ")
    assert "| add | grpc | 4 |" in text and "| add | rest-binary | 1 |" in text
    assert "| add grpc c4 untuned / tuned |" in text and "| add rest-binary c1 untuned / tuned |" in text
    [chose] = [line for line in text.splitlines() if line.startswith("| add | PERFORMANCE_HINT=LATENCY ")]
    said = chose.split(" | ")[-1].removesuffix(" |")
    assert said == "-" or (said.startswith("`") and defaults.MARK in said), chose  # the server's line, or none
    assert "Per model:" in text and "untuned, tuned" in text


def _rows(model: str, config: str, protocol: str, c: int, *throughputs: float, cpu: float = 100.0) -> list[Row]:
    return [Row(model, config, protocol, c, throughput=t, p50_ms=1000 / t, p99_ms=2000 / t, count=int(t),
                server_cpu_pct=cpu) for t in throughputs]


def test_cells_are_medians_over_the_rounds_and_the_goal_is_untuned_over_tuned() -> None:
    rows = [*_rows("add", "untuned", "grpc", 4, 900, 1000, 1100), *_rows("add", "tuned", "grpc", 4, 1000, 1050),
            *_rows("add", "untuned", "grpc", 16, 900), *_rows("add", "tuned", "grpc", 16, 1000),
            Row("add", "untuned", "grpc", 16, errors=1, first_error="load generator failed")]  # a round that failed
    u = defaults.cell(rows, "add", "untuned", "grpc", 4)
    assert u is not None and (u.throughput, u.rounds, u.cpu_us) == (1000, 3, 1000)  # 1 s of CPU / 1000 req
    assert defaults.ratio(rows, "add", "grpc", 4) == pytest.approx(1000 / 1025)
    failed = defaults.cell(rows, "add", "untuned", "grpc", 16)
    assert failed is not None and (failed.rounds, failed.errors) == (1, 1)  # left out of the median, counted
    got = {t.case: t for t in defaults.targets(rows)}
    assert got["add grpc c4 untuned / tuned"].met is True  # 0.976
    assert got["add grpc c16 untuned / tuned"].met is False  # 0.90
    assert defaults.per_model(rows) == [["add", "0.90 (grpc c16)", "**not met**"]]
    body = {(r[0], r[1], r[2]): r for r in defaults.table(rows)}
    assert body[("add", "grpc", "4")][-3:] == ["0.98", "0", "3+2"]
    assert body[("add", "grpc", "16")][-3:] == ["0.90", "1", "1+1"]


def test_a_model_is_met_only_when_every_cell_was_measured() -> None:
    rows = [*_rows("resnetish", "untuned", "grpc", 4, 100), *_rows("resnetish", "tuned", "grpc", 4, 100),
            *_rows("resnetish", "tuned", "rest-binary", 4, 100)]  # untuned REST never answered
    assert defaults.per_model(rows) == [["resnetish", "1.00 (grpc c4)", "n/a"]]
    rows += _rows("resnetish", "untuned", "rest-binary", 4, 96)
    assert defaults.per_model(rows) == [["resnetish", "0.96 (rest-binary c4)", "met"]]


def test_the_servers_choice_is_read_from_its_log_lines_with_the_word_untuned(tmp_path: Path) -> None:
    log = [(f"2026-11-24 10:20:01,123 INFO ovserve.server.runtime.openvino: {tmp_path}/add/1/model.xml: untuned: "
            "PERFORMANCE_HINT LATENCY, INFERENCE_NUM_THREADS 1 (why)"),
           "2026-11-24 10:20:01,200 INFO ovserve.server.repository: add version 1 AVAILABLE"]
    assert defaults.untuned_lines(log, tmp_path) == [
        "add/1/model.xml: untuned: PERFORMANCE_HINT LATENCY, INFERENCE_NUM_THREADS 1 (why)"]
    said = {("add", "untuned"): defaults.untuned_lines(log, tmp_path), ("resnetish", "untuned"): []}
    setup = defaults.Setup(said=said)
    table = defaults.chosen(setup, ["add", "resnetish", "mobilenet_v2"])
    assert table[0] == ["add", "PERFORMANCE_HINT=LATENCY INFERENCE_NUM_THREADS=1",
                        "`add/1/model.xml: untuned: PERFORMANCE_HINT LATENCY, INFERENCE_NUM_THREADS 1 (why)`"]
    assert table[1][2] == "-" and table[2][2] == "-"  # nothing said; never served


def test_the_untuned_server_gets_the_repository_and_no_plugin_option(tmp_path: Path) -> None:
    untuned = servers.ovserve_command(tmp_path, [], repository=True)
    tuned = servers.ovserve_command(tmp_path / "config.json", [])
    assert untuned[untuned.index("--model-repository") + 1] == str(tmp_path)
    assert not {"--config", "--plugin-config", "--nireq"} & set(untuned)
    assert tuned[tuned.index("--config") + 1] == str(tmp_path / "config.json") and "--model-repository" not in tuned


def test_unknown_models_and_protocols_are_refused() -> None:
    with pytest.raises(SystemExit):
        defaults.parse_args(["--models", "add,nope"])
    with pytest.raises(SystemExit):
        defaults.parse_args(["--protocols", "grpc,soap"])
    args = defaults.parse_args(["--models", "add", "--concurrency", "1,16"])
    assert (args.models, args.protocols, args.concurrency, args.repeat) == (
        ["add"], ["grpc", "rest-binary"], [1, 16], 2)
