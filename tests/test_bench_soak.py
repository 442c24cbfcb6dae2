"""The mixed-load soak (``python -m bench.soak``) runs end to end, so it cannot rot.

The end-to-end tests run the real soak for a few seconds against a real
ovserve (tensors to ``add`` and ``resnetish`` over REST JSON, REST binary and
gRPC, JPEG images to ``small_classifier`` over REST binary and gRPC) and
check what it reports for structure and for zero errors, and that a soak
whose requests fail says so in its exit status. Speed is never asserted:
the soak's numbers belong in docs/performance.md. The rest checks the pure
parts: how the concurrency is split and how errors and windows are counted.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import loadgen, soak

ROOT = Path(__file__).resolve().parent.parent
STREAMS = {("add", "rest-json"), ("add", "rest-binary"), ("add", "grpc"), ("resnetish", "rest-binary"),
           ("resnetish", "grpc"), ("small_classifier", "rest-binary"), ("small_classifier", "grpc")}


def _soak(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "bench.soak", "--out", str(tmp_path), "--json", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_soak_mixed_load_reports_every_stream_without_errors(tmp_path: Path) -> None:
    proc, result = _soak(tmp_path, "--duration", "6", "--window", "2", "--warmup", "1", "--concurrency", "8",
                         "--models", "add,resnetish,small_classifier")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    streams = result["streams"]
    assert {(s["model"], s["kind"]) for s in streams} == STREAMS
    assert sum(s["concurrency"] for s in streams) == result["concurrency"] == 8
    assert result["errors"] == 0 and not result["failures"], result["failures"]
    assert (result["server_log"]["errors"], result["server_log"]["tracebacks"]) == (0, 0), result["server_log"]
    for s in streams:
        assert s["errors"] == 0 and s["error_kinds"] == {}, s
        assert s["image"] == (s["model"] == "small_classifier")
        for name in ("first", "last", "all"):
            w = s[name]
            assert w["count"] > 0 and w["errors"] == 0, (s["model"], s["kind"], name, w)
            assert 0 < w["p50_ms"] <= w["p99_ms"] and w["throughput"] > 0
        assert s["all"]["count"] == s["count"] >= s["first"]["count"]
        assert (s["first"]["start"], s["first"]["stop"], s["last"]["start"], s["last"]["stop"]) == (0, 2, 4, 6)
        assert [(w["start"], w["stop"]) for w in s["series"]] == [(0, 2), (2, 4), (4, 6)]
        assert sum(w["count"] for w in s["series"]) == s["count"]
    server = result["server"]
    for key in ("rss_start_mib", "rss_end_mib", "fds_start", "fds_end"):
        assert server[key] > 0, server
    assert server["rss_peak_mib"] >= max(server["rss_start_mib"], server["rss_end_mib"])
    assert server["fds_peak"] >= max(server["fds_start"], server["fds_end"])
    assert server["cpu_pct"] > 0 and len(server["samples"]) >= 3
    assert {"before_pct", "busy_pct", "server_pct", "clients_pct", "other_pct", "server_first_pct", "other_first_pct",
            "server_last_pct", "other_last_pct"} == set(result["cpu"])
    assert result["cpu"]["server_pct"] > 0 and result["cpu"]["server_first_pct"] > 0
    fair = {f["model"]: f for f in result["fairness"]}
    assert set(fair) == {"add", "resnetish", "small_classifier"}
    assert set(fair["add"]["ratio"]) == {"rest-json",
                                         "rest-binary"} and set(fair["resnetish"]["ratio"]) == {"rest-binary"}
    for f in fair.values():
        assert f["worst_ratio"] == max(f["ratio"].values()) > 0 and 0 < f["grpc_share"] < 1
        assert f["within"] == (f["worst_ratio"] <= soak.FAIR)
    # the table, the per-window table and the line to quote, printed and in the dated markdown
    [md] = tmp_path.glob("soak-*.md")
    text = md.read_text()
    for out in (proc.stdout, text):
        assert "p50 ms first/last/all" in out and "gRPC / REST p50" in out and "server RSS MiB / fds" in out, out
        assert "other processes CPU %" in out
        assert "requests, 0 errors; RSS" in out and "open fds" in out
    assert "- command: `python -m bench.soak --out" in text and "Quote: soak " in text


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_soak_exits_nonzero_when_requests_fail(tmp_path: Path) -> None:
    # the server refuses every image (its pixel limit is below the test photo's): the image streams
    # fail, the tensor stream does not, and the soak's exit status says so
    proc, result = _soak(tmp_path, "--duration", "2", "--window", "1", "--warmup", "0.5",
                         "--streams", "add:grpc=1,small_classifier:rest-binary=1,small_classifier:grpc=1",
                         "--ovserve-arg=--max-image-pixels=1000")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    by = {(s["model"], s["kind"]): s for s in result["streams"]}
    assert by["add", "grpc"]["errors"] == 0 and by["add", "grpc"]["count"] > 0
    assert "HTTP 400" in by["small_classifier", "rest-binary"]["first_error"]
    assert "gRPC status 3" in by["small_classifier", "grpc"]["first_error"]  # INVALID_ARGUMENT
    for key in (("small_classifier", "rest-binary"), ("small_classifier", "grpc")):
        assert by[key]["errors"] >= 1 and by[key]["error_kinds"] == {"first answer": by[key]["errors"]}
    assert result["errors"] == by["small_classifier",
                                  "rest-binary"]["errors"] + by["small_classifier", "grpc"]["errors"]
    assert "- Errors: 2 (" in proc.stdout and "pixels" in proc.stdout, proc.stdout[-3000:]


# -- the pure parts --------------------------------------------------------------------------
def test_concurrency_is_split_evenly_over_kinds_then_models() -> None:
    streams = {(s.model, s.kind): s.concurrency for s in soak.default_streams(["add", "resnetish", "mobilenet_v2"], 16)}
    assert streams == {("add", "rest-json"): 4, ("add", "rest-binary"): 2, ("resnetish", "rest-binary"): 2,
                       ("add", "grpc"): 2, ("resnetish", "grpc"): 2,
                       ("mobilenet_v2", "rest-binary"): 2, ("mobilenet_v2", "grpc"): 2}
    streams = {(s.model, s.kind): s.concurrency for s in soak.default_streams(["add", "resnetish"], 16)}
    assert streams == {("add", "rest-json"): 6, ("add", "rest-binary"): 3, ("resnetish", "rest-binary"): 2,
                       ("add", "grpc"): 3, ("resnetish", "grpc"): 2}
    with pytest.raises(SystemExit, match="concurrency 4"):
        soak.default_streams(["add", "resnetish", "mobilenet_v2"], 4)


def test_streams_are_parsed_and_images_never_go_as_json() -> None:
    parsed = soak.parse_streams("add:rest-json=15, add:grpc")
    assert [(s.model, s.kind, s.concurrency) for s in parsed] == [("add", "rest-json", 15), ("add", "grpc", 1)]
    with pytest.raises(SystemExit, match="MODEL:KIND"):
        soak.parse_streams("add:http=2")
    with pytest.raises(SystemExit, match="takes images"):
        soak.parse_streams("mobilenet_v2:rest-json=2")


def test_errors_are_classed_by_kind() -> None:
    assert loadgen.error_kind("HTTP 503: b'busy'") == "HTTP 503"
    assert loadgen.error_kind("gRPC status 14: unavailable") == "gRPC UNAVAILABLE"
    assert loadgen.error_kind("gRPC status 3: bad") == "gRPC INVALID_ARGUMENT"
    assert loadgen.error_kind("RESOURCE_EXHAUSTED: too big") == "gRPC RESOURCE_EXHAUSTED"  # grpc.aio's wording
    assert loadgen.exception_kind(TimeoutError("no answer in time")) == "timeout"
    assert loadgen.exception_kind(ConnectionResetError()) == "connection"
    assert loadgen.exception_kind(ValueError()) == "ValueError"


def test_server_log_problems_are_counted_with_their_first_messages() -> None:
    lines = ["2026-11-24 01:39:15,574 INFO ovserve: ready\n",
             "2026-11-24 01:39:15,574 ERROR ovserve.rest: unexpected error on POST /v2/models/m/infer\n",
             "Traceback (most recent call last):\n", '  File "x.py", line 1, in f\n',
             "AttributeError: 'Handle' object has no attribute 'when'\n",
             "2026-11-24 01:39:16,001 ERROR ovserve.rest: unexpected error on POST /v2/models/m/infer\n",
             "2026-11-24 01:39:17,000 WARNING ovserve.runtime: m: slow\n"]
    assert soak.log_problems(lines) == {
        "warnings": 1, "errors": 2, "tracebacks": 1,
        "first": ["ERROR ovserve.rest: unexpected error on POST /v2/models/m/infer",
                  "AttributeError: 'Handle' object has no attribute 'when'", "WARNING ovserve.runtime: m: slow"]}


def test_windows_count_what_came_in_each() -> None:
    rec = loadgen.TimedRecorder(100)
    rec.recording = True
    start = time.monotonic_ns()
    # answers at 0.5 s (1 ms), 1.5 s (3 ms) and 2.5 s (5 ms) into a 3 s run; errors at 0.2 and 2.9 s
    for at, ms in ((0.5, 1), (1.5, 3), (2.5, 5)):
        rec.lat_ns.append(ms * 1_000_000)
        rec.done_ns.append(start + int(at * 1e9))
    for at, kind in ((0.2, "timeout"), (2.9, "HTTP 500")):
        rec.errors += 1
        rec.err_ns.append(start + int(at * 1e9))
        rec.err_kinds.append(kind)
    w = loadgen.window_report(rec, start, duration=3.0, window=1.0)
    assert (w["first"]["count"], w["first"]["errors"], w["first"]["error_kinds"]) == (1, 1, {"timeout": 1})
    assert (w["last"]["count"], w["last"]["p50_ms"], w["last"]["error_kinds"]) == (1, 5.0, {"HTTP 500": 1})
    assert (w["all"]["count"], w["all"]["errors"], w["all"]["p50_ms"]) == (3, 2, 3.0)
    assert w["all"]["throughput"] == pytest.approx(1.0)
    assert [(s["start"], s["stop"], s["count"]) for s in w["series"]] == [(0, 1, 1), (1, 2, 1), (2, 3, 1)]
