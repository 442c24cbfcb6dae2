"""The benchmark's side instruments run end to end, so they cannot rot.

``bench.floor`` (raw OpenVINO beside the bytes served requests move) and
``bench.contention`` (raw OpenVINO beside a CPU competitor) each run once for
a fraction of a second; what they print is checked for shape and sense,
never for speed.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
from tritonclient.grpc import service_pb2 as pb

from bench import floor, report, specs

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_wire_messages_are_the_served_request_and_reply() -> None:
    spec = specs.SPECS["resnetish"]
    x = spec.sample()
    request, reply = floor.wire_messages(spec, x)
    for framed in (request, reply):
        assert framed[0] == 0 and int.from_bytes(framed[1:5], "big") == len(framed) - 5
    parsed = pb.ModelInferRequest.FromString(request[5:])
    assert (parsed.model_name, list(parsed.inputs[0].shape)) == ("resnetish", [1, 3, 224, 224])
    np.testing.assert_array_equal(np.frombuffer(parsed.raw_input_contents[0], np.float32).reshape(x.shape), x)
    answer = pb.ModelInferResponse.FromString(reply[5:])
    assert len(answer.raw_output_contents[0]) == 4 * 1000


@pytest.mark.slow
def test_floor_runs_raw_openvino_beside_the_wire() -> None:
    out = _run("bench.floor", "--repeat", "1", "--seconds", "0.5", "--no-out")
    alone = re.search(r"alone: (\d+)/s", out)
    beside = re.search(r"(\d+)/s carried: (\d+) MB/s in.*\): (\d+)/s = ([\d.]+) x alone", out)
    assert alone and beside, out
    assert int(alone.group(1)) > 0 and int(beside.group(1)) > 0 and int(beside.group(3)) > 0, out
    assert re.search(r"a server at 0\.85 x raw async is (within|out of) reach", out), out


@pytest.mark.slow
def test_floor_serves_the_model_in_each_round_and_pairs_it_with_that_rounds_ceiling(tmp_path: Path) -> None:
    out = _run("bench.floor", "--repeat", "2", "--seconds", "0.5", "--served", "grpc,rest-binary", "--out",
               str(tmp_path))
    [written] = tmp_path.glob("floor-*.md")
    assert "--served grpc,rest-binary" in written.read_text() and "x the ceiling" in written.read_text()
    ceiling = [int(v) for v in re.search(r"\(runs: ([\d, ]+); median of the paired", out).group(1).split(", ")]
    assert len(ceiling) == 2, out
    for protocol in ("grpc", "rest-binary"):
        line = re.search(rf"{protocol} +(\d+)/s \(runs: (\d+), (\d+); server CPU (\d+)%\) = ([\d.]+) x the ceiling, "
                         rf"([\d.]+) x raw alone: (met|not met)", out)
        assert line, out
        runs = [int(line.group(2)), int(line.group(3))]
        assert min(runs) > 0 and int(line.group(4)) > 0, out
        # the ratio is the median of each round's served / that round's ceiling
        paired = sorted(r / c for r, c in zip(runs, ceiling, strict=True))
        assert float(line.group(5)) == pytest.approx(sum(paired) / 2, abs=0.011), out


@pytest.mark.slow
def test_contention_runs_raw_openvino_beside_a_competitor() -> None:
    out = _run("bench.contention", "--models", "resnetish", "--shares", "0,0.2", "--repeat", "1", "--seconds", "0.5")
    line = re.search(r"resnetish \(LATENCY\): 0%: (\d+)/s \(1\.00\)  20%: (\d+)/s \(([\d.]+)\)", out)
    assert line and int(line.group(1)) > 0 and int(line.group(2)) > 0, out


def test_runs_in_the_same_minute_are_written_side_by_side_not_over_each_other(tmp_path: Path) -> None:
    # bench.floor's file and every side bench's (report.write_named) take their name from report.stamped
    started = datetime(2026, 11, 24, 19, 17, 42, tzinfo=timezone.utc)
    first = floor.write(["first run"], "python -m bench.floor", started, tmp_path / "results")
    second = floor.write(["second run"], "python -m bench.floor", started, tmp_path / "results")
    assert (first.name, second.name) == ("floor-20261124-1917.md", "floor-20261124-191742.md")
    assert "first run" in first.read_text() and "second run" in second.read_text()
    named = report.write_named("photo", [], "table", started, tmp_path / "results")
    again = report.write_named("photo", [], "table", started, tmp_path / "results")
    assert [p.name for p in named + again] == ["photo-20261124-1917.md", "photo-20261124-1917.csv",
                                               "photo-20261124-191742.md", "photo-20261124-191742.csv"]


def test_precision_sets_raw_openvino_in_each_precision_beside_ovserve_untuned(tmp_path: Path) -> None:
    out = _run("bench.precision", "--models", "resnetish", "--seconds", "0.3", "--loads", "1", "--wait-quiet", "0",
               "--out", str(tmp_path))
    from ovserve.server.runtime.measure import default_precision

    precisions = {default_precision(ov.Core()), "f32"}
    raw = dict(re.findall(r"raw (\w+) +(\d+)/s alone, +\d+/s beside the wire", out))
    assert set(raw) == precisions and all(int(v) > 0 for v in raw.values()), out
    assert {p for p in precisions if re.search(rf"ovserve in {p} +grpc \d+/s, rest-binary \d+/s", out)} == precisions
    said = re.search(r"ovserve untuned +grpc \d+/s, rest-binary \d+/s; it said: (.*)", out)
    assert said and said.group(1).startswith("INFERENCE_PRECISION_HINT"), out
    if len(precisions) > 1:  # something to choose: measured, both medians said (an empty cache each time)
        assert re.search(r"\(measured \w+ [\d.]+ ms, f32 [\d.]+ ms per inference", said.group(1)), out
    assert re.search(r"load measuring \d+ ms, cached \d+ ms, off \d+ ms", out), out
    [written] = tmp_path.glob("precision-*.md")
    text = written.read_text()
    assert "| resnetish | grpc |" in text and "| resnetish | rest-binary |" in text
    assert "untuned / faster served" in text
    assert "--models resnetish" in text and "CPU flags" in text


def test_hint_serves_each_hint_beside_ovserve_untuned(tmp_path: Path) -> None:
    out = _run("bench.hint", "--models", "resnetish", "--protocols", "grpc", "--concurrency", "2", "--seconds", "0.3",
               "--warmup", "0.2", "--repeat", "1", "--wait-quiet", "0", "--out", str(tmp_path))
    for who in ("LATENCY", "THROUGHPUT", "untuned"):
        assert re.search(rf"^  {who} +grpc c2 \d+/s", out, re.MULTILINE), out
    assert re.search(r"untuned: PERFORMANCE_HINT (LATENCY|THROUGHPUT) \(", out), out  # what the untuned server said
    [written] = tmp_path.glob("hint-*.md")
    text = written.read_text()
    assert re.search(r"^\| resnetish \| grpc \| 2 \| \d+ \| \d+ \| [\d.]+ \| \d+ \| [\d.]+ \|", text,
                     re.MULTILINE), text
    assert "--models resnetish" in text


def test_renew_times_a_fresh_infer_request_beside_an_inference_for_every_model_and_hint() -> None:
    out = _run("bench.renew", "--no-mobilenet", "--repeat", "5")
    rows = re.findall(r"^\| (\w+) \| (LATENCY|THROUGHPUT) \| (\d+) \| (\d+) \|$", out, re.MULTILINE)
    assert {(name, hint) for name, hint, _, _ in rows} == {(m, h) for m in ("add", "resnetish")
                                                         for h in ("LATENCY", "THROUGHPUT")}, out
    assert all(int(infer) > 0 for *_, infer in rows), out


def test_ts_tensors_times_context_model_through_the_arena_and_through_the_socket(tmp_path: Path) -> None:
    out = _run("bench.ts_tensors", "--configs", "socket,arena", "--sizes", "150000", "--repeat-scale", "0.01",
               "--out", str(tmp_path))
    assert re.search(r"^\| 150,000 \| [\d,]+ \([\d,]+\) \| [\d,]+ \([\d,]+\) \|$", out, re.MULTILINE), out
    [written] = tmp_path.glob("ts-tensors-*.md")
    assert "| socket median (min) µs | arena median (min) µs |" in written.read_text()


def test_loopcost_measures_both_paths_on_the_real_server_and_pairs_their_rounds() -> None:
    # the real model server on this process's loop: the V2 servicer's ModelInfer, then the runtime alone
    out = _run("bench.loopcost", "--model", "resnetish", "--concurrency", "2", "--requests", "60", "--rounds", "2",
               "--probe", "--probe-times", "20")
    rounds = {}
    for path in ("servicer", "runtime"):
        line = next(x for x in out.splitlines() if x.startswith(path))
        runs = [(float(rate), float(us)) for rate, us in re.findall(r"(\d+)/s (\d+) us", line)]
        assert len(runs) == 2 and all(rate > 0 and us > 0 for rate, us in runs), line
        rounds[path] = runs
    line = next(x for x in out.splitlines() if x.startswith("the layers above the runtime"))
    printed = [float(d) for d in re.findall(r"([+-]\d+)", line.split("paired rounds:")[1])]
    expected = [s[1] - r[1] for s, r in zip(rounds["servicer"], rounds["runtime"], strict=True)]
    assert printed == pytest.approx(expected, abs=1.01)  # printed rounded, from unrounded figures
    assert len(re.findall(r"after +[\d.]+ ms +median", out)) == 4


def test_a_served_ratio_just_under_its_goal_is_not_printed_as_the_goal() -> None:
    """0.897 of the ceiling against a 0.9 goal reads 0.897 and not met, never "0.90 ... not met"."""
    lines: list[str] = []
    beside = [floor.Beside(400.0, 340.0, 340.0, 0.05, 0.02)] * 3
    floor.report_served(["grpc"], [420.0] * 3, beside, [floor.Served({"grpc": 358.8}, {"grpc": 189.0})] * 3,
                        0.9, 0.8, say=lines.append)
    assert lines[1].endswith("= 0.897 x the ceiling, 0.85 x raw alone: not met"), lines
    assert floor.ratio_text(0.904, 0.9) == "0.90" and floor.ratio_text(0.8951, 0.9) == "0.895"
    assert floor.ratio_text(0.88, 0.9) == "0.88"


def test_explain_measures_the_mass_on_each_photos_object_for_the_old_and_new_default(tmp_path: Path) -> None:
    out = _run("bench.explain", "--only", "default", "--repeat", "1", "--out", str(tmp_path))
    [written] = tmp_path.glob("explain-*.md")
    assert written.read_text() in out
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in out.splitlines()
            if line.startswith("| ") and "default" in line}
    assert list(rows) == ["old default: occlusion 28/28, logit", "default: occlusion 56/28, probability"], out
    for cells in rows.values():  # chelsea, chelsea-whole, coffee, motorcycle, time, calls
        assert all(0.0 <= float(c) <= 1.0 for c in cells[:4]) and cells[5].strip(" |") == "3", out
    old, new = (float(rows[k][0]) for k in rows)
    assert old < 0.65 <= new, out  # chelsea's face: issue 38's bar, which the old default misses



def test_uploads_measures_the_memory_a_held_upload_costs(tmp_path: Path) -> None:
    """One 4 MiB message sent but for its last byte and held: the server's RSS grows by about that much."""
    out = _run("bench.uploads", "--engines", "loop", "--calls", "1", "--mib", "4", "--seconds", "0.5", "--settle",
               "0.2", "--out", str(tmp_path))
    row = re.search(r"^\| loop \| 1 \| 4 \| 4 \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| - \|$", out, re.MULTILINE)
    assert row, out
    before, peak, held, _ = map(int, row.groups())
    assert held >= before + 3 and peak >= held, out  # the 4 MiB held (RSS rounds to whole MiB)
    [written] = tmp_path.glob("uploads-*.md")
    assert "| engine | calls | each, MiB | sent, MiB |" in written.read_text()
