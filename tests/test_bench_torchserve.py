"""``python -m bench.torchserve`` runs end to end: the harness behind issue 17's TorchServe numbers cannot rot.

The bench-tier tests run the real command in a child process, briefly: ovserve's two rows (TorchServe's
Predictions and KServe V2 gRPC with the same JPEG, on the real MobileNetV2) always; the real TorchServe
row only where its virtualenv (bench/.ts-venv) and Java are there, since installing TorchServe, torch
and a JDK is no job for CI. They check that every row answered, without errors, that the run's file was
written, and that TorchServe and ovserve gave the same top 5; never a speed. The unit tests pin what
the harness computes and writes from its inputs.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bench import loadgen, ts_peer
from bench import torchserve as tsbench
from bench.measure import Row
from ovserve.client.proto import ts_inference as pb  # the client's private pool: no clash with test-time stubs

ROOT = Path(__file__).resolve().parent.parent
TOP5 = {"Egyptian cat": 0.687, "tiger cat": 0.178, "tabby": 0.116, "plastic bag": 0.0103, "lynx": 0.0054}


def _bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, str]], str]:
    """Run the command into ``tmp_path``; its process, the CSV's rows and the run's markdown."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.torchserve", "--duration", "1", "--warmup", "0.3", "--wait-quiet", "0",
         "--out", str(tmp_path), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=840, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [md] = tmp_path.glob("torchserve-*.md")
    [data] = tmp_path.glob("torchserve-*.csv")
    assert data.stem == md.stem
    return proc, list(csv.DictReader(data.open())), md.read_text()


def _answered(rows: list[dict[str, str]], server: str, kind: str, concurrency: set[int]) -> None:
    mine = [r for r in rows if (r["server"], r["protocol"]) == (server, kind)]
    assert {int(r["concurrency"]) for r in mine} == concurrency, rows
    for r in mine:
        assert float(r["throughput"]) > 0 and int(r["count"]) > 0 and int(r["errors"]) == 0, r


@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ovserve_rows_run_and_the_run_is_written(tmp_path: Path) -> None:
    proc, rows, text = _bench(tmp_path, "--no-torchserve", "--concurrency", "1,4")
    _answered(rows, "ovserve", "ts-grpc", {1, 4})
    _answered(rows, "ovserve", "grpc", {1, 4})
    assert not [r for r in rows if r["server"] == "torchserve"]
    assert "Targets (issues 17 and 34):" in proc.stdout and "ovserve's answer: " in proc.stdout, proc.stdout[-3000:]
    # issue 34: the same photo through a custom handler, in worker processes and in threads
    _answered(rows, "ovserve-process", "ts-grpc", {1, 4})
    _answered(rows, "ovserve-thread", "ts-grpc", {1, 4})
    assert "ovserve-process's custom handler answers as the built-in: yes" in text
    assert "ovserve-thread's custom handler answers as the built-in: yes" in text
    assert "| ovserve custom handler in processes / TorchServe, c4 |" in text
    assert text.startswith("# TorchServe gRPC API benchmark, ")
    assert "| ovserve | TorchServe gRPC Predictions | 4 |" in text
    assert "| ovserve | KServe V2 gRPC ModelInfer (BYTES) | 1 |" in text
    assert "| ovserve TorchServe API / its V2 gRPC, c4 |" in text
    # without TorchServe the 3x goal is not measured, and says so
    assert "| ovserve TorchServe API / TorchServe, c4 | " in text and "| n/a | n/a |" in text


@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_torchserve_row_answers_like_ovserve(tmp_path: Path) -> None:
    if ts_peer.java() is None:
        pytest.skip(f"no Java {ts_peer.JAVA_MIN}+ for TorchServe's frontend (apt-get install {ts_peer.JDK_PACKAGE})")
    if not ts_peer.installed():
        pytest.skip(f"TorchServe's virtualenv {ts_peer.VENV} is not installed (python -m bench.torchserve makes it)")
    _, rows, text = _bench(tmp_path, "--concurrency", "1")
    _answered(rows, "torchserve", "ts-grpc", {1})
    _answered(rows, "ovserve", "ts-grpc", {1})
    assert "| torchserve | TorchServe gRPC Predictions | 1 |" in text
    assert "- the same answer from both: yes" in text, text
    assert f"TorchServe: {ts_peer.Tuning().describe()}" in text


# -- what the harness computes and writes, in process ------------------------------------------------
def _row(server: str, kind: str, c: int, throughput: float, cpu: float = 100.0) -> Row:
    return Row("mobilenet_v2", server, kind, c, throughput=throughput, p50_ms=5.0, p99_ms=9.0, count=100,
               server_cpu_pct=cpu, client_cpu_pct=3.0)


def test_targets_are_the_issue_goals_from_the_rows() -> None:
    rows = [_row("ovserve", "ts-grpc", 1, 95), _row("ovserve", "grpc", 1, 100),
            _row("ovserve", "ts-grpc", 4, 250), _row("ovserve", "grpc", 4, 300),
            _row("torchserve", "ts-grpc", 4, 80), _row("ovserve-process", "ts-grpc", 4, 150),
            _row("ovserve-thread", "ts-grpc", 4, 200), _row("ovserve-process", "ts-grpc", 1, 90),
            _row("ovserve-thread", "ts-grpc", 1, 90)]
    got = {t.case: (round(t.value, 3) if t.value is not None else None, t.met)
           for t in tsbench.targets(rows, [1, 4, 16])}
    assert got == {
        "ovserve TorchServe API / its V2 gRPC, c1": (0.95, True),
        "ovserve TorchServe API / its V2 gRPC, c4": (0.833, False),
        "ovserve TorchServe API / its V2 gRPC, c16": (None, None),  # not measured: n/a, not a failure
        "ovserve TorchServe API / TorchServe, c4": (3.125, True),
        # issue 34: a custom handler in worker processes, against TorchServe and against threads
        "ovserve custom handler in processes / TorchServe, c4": (1.875, False),
        "custom handler in processes / in threads, c1": (1.0, True),
        "custom handler in processes / in threads, c4": (0.75, False),
        "custom handler in processes / in threads, c16": (None, None),
    }


def test_the_table_gives_server_cpu_per_inference() -> None:
    [line] = tsbench.table([_row("torchserve", "ts-grpc", 4, 200.0, cpu=150.0)])
    assert line[:4] == ["torchserve", "TorchServe gRPC Predictions", "4", "200"]
    assert line[tsbench.HEADER.index("server CPU us/infer")] == "7500"  # 1.5 cores / 200 per s


def test_the_run_is_one_dated_file_and_its_csv(tmp_path: Path) -> None:
    started = datetime(2026, 11, 24, 5, 1, 30, tzinfo=timezone.utc)
    rows = [_row("ovserve", "ts-grpc", 1, 95)]
    first = tsbench.write(rows, "text one", started, tmp_path)
    assert [p.name for p in first] == ["torchserve-20261124-0501.md", "torchserve-20261124-0501.csv"]
    second = tsbench.write(rows, "text two", started.replace(second=59), tmp_path)
    assert [p.name for p in second] == ["torchserve-20261124-050159.md", "torchserve-20261124-050159.csv"]
    assert (tmp_path / "torchserve-20261124-0501.md").read_text() == "text one"
    [line] = list(csv.DictReader((tmp_path / "torchserve-20261124-0501.csv").open()))
    assert (line["server"], line["protocol"], line["throughput"]) == ("ovserve", "ts-grpc", "95")


def test_answers_agree_only_on_the_same_classes_in_order_and_close_probabilities() -> None:
    assert tsbench.same_answer(TOP5, dict(TOP5)) == (True, 0.0)
    swapped = dict(reversed(list(TOP5.items())))
    assert tsbench.same_answer(TOP5, swapped)[0] is False
    assert tsbench.same_answer(TOP5, {**TOP5, "Egyptian cat": 0.6})[0] is False


def test_the_load_generator_checks_torchserve_answers() -> None:
    def reply(doc: object) -> bytes:
        return pb.PredictionResponse(prediction=json.dumps(doc).encode()).SerializeToString()

    assert loadgen.check_ts_answer(reply(TOP5)) == ""
    assert "descending" in loadgen.check_ts_answer(reply(dict(reversed(list(TOP5.items())))))
    assert "descending" in loadgen.check_ts_answer(reply({"a": 0.5}))  # not 5 classes
    assert "not JSON" in loadgen.check_ts_answer(pb.PredictionResponse(prediction=b"\xff").SerializeToString())


def test_the_predictions_request_carries_the_image_as_data() -> None:
    spec = loadgen.spec_of("mobilenet_v2")
    req = pb.PredictionsRequest.FromString(loadgen.ts_request(spec, b"\xff\xd8jpeg"))
    assert (req.model_name, dict(req.input), req.model_version) == ("mobilenet_v2", {"data": b"\xff\xd8jpeg"}, "")


def test_torchserve_is_configured_on_loopback_with_the_tuning() -> None:
    tuning = ts_peer.Tuning(workers=2, cores=2)
    assert tuning.ov_properties == {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": "1"}
    assert ts_peer.Tuning(workers=1, cores=2).threads == 2 and ts_peer.Tuning(workers=4, cores=2).threads == 1
    ports = {"rest": 1, "management": 2, "metrics": 3, "grpc": 4, "grpc-management": 5}
    props = dict(line.split("=", 1) for line in
                 ts_peer.config_properties(ports, Path("/store"), tuning).splitlines())
    assert props["grpc_inference_address"] == props["grpc_management_address"] == "127.0.0.1"
    assert (props["grpc_inference_port"], props["grpc_management_port"]) == ("4", "5")
    assert props["inference_address"] == "http://127.0.0.1:1" and props["metrics_address"] == "http://127.0.0.1:3"
    assert props["disable_token_authorization"] == props["enable_model_api"] == "true"
    assert props["default_workers_per_model"] == "2" and props["load_models"] == "mobilenet_v2.mar"
    yaml = ts_peer.model_config(ts_peer.Tuning(workers=2, batch_size=4, max_batch_delay_ms=3, cores=2))
    assert yaml.splitlines()[:4] == ["minWorkers: 2", "maxWorkers: 2", "batchSize: 4", "maxBatchDelay: 3"]
    assert '    INFERENCE_NUM_THREADS: "1"' in yaml
