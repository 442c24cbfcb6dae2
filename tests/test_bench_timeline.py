"""``python -m bench.timeline``: the analysis of where streams wait, on made-up events whose answer is known, and
the command end to end on a real server (bench tier: every run answered and analysed; never a speed)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.timeline import analyse, main

ROOT = Path(__file__).resolve().parent.parent


def test_one_stream_with_a_gap_after_each_inference() -> None:
    # one infer request on one stream: 10 ms inferences, each followed by 2.5 ms of hand-off
    events = [(1, i * 0.0125, i * 0.0125 + 0.010) for i in range(400)]
    t = analyse("one", events, streams=1, skip_s=0.5, tail_s=0.5)
    assert t.occupancy == pytest.approx(0.8, abs=0.01)
    assert t.gap_p50_us == pytest.approx(2500, abs=1) and t.gap_p90_us == pytest.approx(2500, abs=1)
    assert t.per_s == pytest.approx(80, rel=0.02)
    assert len(t.rows) == 1 and "#" in t.rows[0] and "." in t.rows[0]


def test_a_request_queued_behind_each_stream_keeps_it_busy() -> None:
    # two requests on one stream, each started while the other runs: the stream never waits
    events = [(i % 2, i * 0.010 - 0.005 * (i % 2 == 1), (i + 1) * 0.010) for i in range(400)]
    t = analyse("two", events, streams=1, skip_s=0.5, tail_s=0.5)
    assert t.occupancy == pytest.approx(1.0, abs=0.01) and t.in_flight > 1.0


@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_command_runs_raw_and_served(tmp_path: Path) -> None:
    out = tmp_path / "timeline.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.timeline", "--model", "resnetish", "--concurrency", "2", "--seconds", "1.5",
         "--nireq", "0,1", "--protocols", "grpc,rest-binary", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=540, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    for label in ("raw async OpenVINO, 2 requests:", "ovserve gRPC, nireq default:", "ovserve gRPC, nireq 1:",
                  "ovserve REST binary, nireq default:", "ovserve REST binary, nireq 1:"):
        line = next((ln for ln in text.splitlines() if ln.startswith(label)), "")
        assert line and " 0 infer/s" not in line, text
    assert "request 1" in text  # the default (twice the optimal number) ran two infer requests


@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_photo_path_is_timed_through_both_transports(tmp_path: Path) -> None:
    """``--photo``: each request a JPEG the server decodes and resizes for the real MobileNetV2 classifier (here
    served on the loop gRPC engine, named in the file)."""
    pytest.importorskip("cv2")
    from ovserve.server.tools.zoo import fetch
    from ovserve.server.tools.zoo.mobilenet_v2 import default_weights

    try:
        default_weights()
    except fetch.FetchError as exc:
        pytest.skip(f"the MobileNetV2 weights cannot be had here: {exc}")
    out = tmp_path / "timeline.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.timeline", "--model", "mobilenet_v2", "--photo", "--concurrency", "2",
         "--seconds", "1.5", "--nireq", "0", "--protocols", "grpc,rest-binary", "--out", str(out),
         "--ovserve-arg=--grpc-engine=loop"],
        cwd=ROOT, capture_output=True, text=True, timeout=540, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert "a JPEG per request (the photo path)" in text.splitlines()[0], text
    assert "ovserve serve ... --grpc-engine=loop" in text.splitlines()[2], text  # the served rows' engine
    for label in ("ovserve gRPC, nireq default:", "ovserve REST binary, nireq default:"):
        line = next((ln for ln in text.splitlines() if ln.startswith(label)), "")
        assert line and " 0 infer/s" not in line, text


def test_an_unknown_protocol_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--protocols", "grpc,rest-json"]) == 2
    assert "grpc, rest-binary" in capsys.readouterr().err


def test_the_photo_path_on_a_model_that_takes_no_image_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "resnetish", "--photo"]) == 2
    assert "only mobilenet_v2" in capsys.readouterr().err
