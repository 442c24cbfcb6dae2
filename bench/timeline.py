"""``python -m bench.timeline``: where a served model's execution streams wait (issue 21), as a timeline.

A served request that finishes on an OpenVINO stream goes back through the
event loop (completion callback -> loop -> outputs read -> the slot handed to
the next request -> its inputs bound -> ``start_async``) before that stream has
work again, unless another infer request was already queued on it. This tool
shows how much of the time the streams spend waiting in that hand-off:

1. It runs ``ovserve serve`` instrumented (``python -m bench.timeline --serve
   ARGS``: the real server, with :meth:`OpenVINOModel._settle` wrapped to
   record each inference's start, completion and settle times), loads it with
   the bench's load generator at the given concurrency over each of
   ``--protocols`` (gRPC by default; ``rest-binary`` beside it shows what the
   transport's hand-offs cost the streams), once per ``--nireq`` value (0: the
   server's default, the device's optimal number); with ``--photo`` the
   requests are the photo path's JPEG (:mod:`bench.photo`), which the server
   decodes and resizes before inference;
2. beside it, raw asynchronous OpenVINO at the same concurrency in this
   process, with the same properties;
3. and prints for each: inferences per second in the window, **stream
   occupancy** (the time-average of ``min(in OpenVINO, streams) / streams``:
   1.0 means no stream ever waited), the hand-off gap of each infer request
   (from one inference's completion to the next start on the same request,
   p50/p90), and a 30 ms stretch of each infer request's timeline
   (``#`` in OpenVINO, ``.`` waiting).

Model and properties as in the main bench (bench/specs.py; MobileNetV2 is
THROUGHPUT, 2 streams here). Nothing is written unless ``--out`` names a file.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import models, photo, soak, specs
from .loadgen import Case
from .measure import ROOT, run_case
from .servers import ServerProcess, ovserve_command

EVENTS_ENV = "OVSERVE_BENCH_TIMELINE"  # where the instrumented server writes its events, on exit
STRETCH_S = 0.030  # the timeline printed for each run
COLUMNS = 90
SHOWN = {"grpc": "gRPC", "rest-binary": "REST binary"}  # --protocols, as the report names them


# -- the instrumented server (a child process) --------------------------------------------------
def serve(argv: list[str]) -> int:
    """``ovserve serve ARGV`` with every settled inference recorded as (request, started, finished, settled)."""
    from ovserve.server.cli import main as cli_main
    from ovserve.server.runtime import openvino as rt

    events: list[tuple[int, float, float, float]] = []
    settle = rt.OpenVINOModel._settle

    def recorded(self: Any, slot: Any, finished: float) -> None:
        events.append((id(slot), slot.started, finished, time.perf_counter()))
        settle(self, slot, finished)

    rt.OpenVINOModel._settle = recorded  # type: ignore[method-assign]

    real_exit = os._exit

    def exit_after_dump(code: int) -> None:  # `ovserve serve` ends with os._exit: no atexit
        Path(os.environ[EVENTS_ENV]).write_text(json.dumps(events))
        real_exit(code)

    os._exit = exit_after_dump  # type: ignore[assignment]
    return cli_main(["serve", *argv])


# -- the analysis -------------------------------------------------------------------------------
@dataclass
class Timeline:
    label: str
    per_s: float
    occupancy: float
    gap_p50_us: float
    gap_p90_us: float
    in_flight: float  # time-average of the inferences in OpenVINO
    rows: list[str]


def analyse(label: str, events: list[tuple[int, float, float]], streams: int, skip_s: float = 1.5,
            tail_s: float = 0.5) -> Timeline:
    """``events``: (infer request, started, finished) of each inference; the window drops the first
    ``skip_s`` (warm-up) and the last ``tail_s`` seconds."""
    if not events:
        return Timeline(label, 0.0, 0.0, 0.0, 0.0, 0.0, [])
    t0 = min(e[1] for e in events) + skip_s
    t1 = max(e[2] for e in events) - tail_s
    window = [e for e in events if e[1] >= t0 and e[2] <= t1]
    if not window or t1 <= t0:
        return Timeline(label, 0.0, 0.0, 0.0, 0.0, 0.0, [])
    # in OpenVINO over time: +1 at each start, -1 at each completion
    marks = sorted([(e[1], 1) for e in window] + [(e[2], -1) for e in window])
    busy = weighted = 0.0
    level, last = 0, t0
    for t, step in marks:
        busy += min(level, streams) * (t - last)
        weighted += level * (t - last)
        level, last = level + step, t
    span = t1 - t0
    by_request: dict[int, list[tuple[float, float]]] = {}
    for req, start, end in sorted(window, key=lambda e: e[1]):
        by_request.setdefault(req, []).append((start, end))
    gaps = [b[0] - a[1] for runs in by_request.values() for a, b in itertools.pairwise(runs)]
    mid = t0 + span / 2
    rows = []
    for n, runs in enumerate(by_request.values()):
        cells = ["."] * COLUMNS
        for start, end in runs:
            lo = int((start - mid) / STRETCH_S * COLUMNS)
            hi = int((end - mid) / STRETCH_S * COLUMNS)
            for i in range(max(lo, 0), min(hi + 1, COLUMNS)):
                cells[i] = "#"
        rows.append(f"  request {n}  " + "".join(cells))
    return Timeline(label, len(window) / span, busy / (streams * span),
                    float(np.percentile(gaps, 50) * 1e6) if gaps else 0.0,
                    float(np.percentile(gaps, 90) * 1e6) if gaps else 0.0, weighted / span, rows)


# -- the runs -----------------------------------------------------------------------------------
def served(config: Path, case: Case, nireq: int, extra: list[str], tmp: Path) -> list[tuple[int, float, float]]:
    out = tmp / f"events-{nireq}.json"
    argv = ovserve_command(config, [*(["--nireq", str(nireq)] if nireq else []), *extra])[4:]  # after "serve"
    server = ServerProcess(f"ovserve-timeline-{nireq}", [sys.executable, "-m", "bench.timeline", "--serve", *argv],
                           env={EVENTS_ENV: str(out), "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    try:
        server.wait_ready([case.model])
        case.port = server.port_for(case.kind)
        row = run_case(case, "ovserve", server.pid, log=lambda m: None)
        if row.errors:
            raise RuntimeError(f"the load had errors: {row.first_error}")
    finally:
        server.stop()
    return [(int(a), float(b), float(c)) for a, b, c, _ in json.loads(out.read_text())]


def raw_async(model_xml: Path, plugin_config: dict[str, Any], x: np.ndarray, concurrency: int,
              seconds: float) -> tuple[list[tuple[int, float, float]], int]:
    """``concurrency`` asynchronous infer requests kept busy (OpenVINO's ``AsyncInferQueue``, which waits for
    a request's callback to have returned before starting it again); their (request, started, finished),
    and the compiled model's NUM_STREAMS."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(model_xml), "CPU", plugin_config)
    streams = int(compiled.get_property("NUM_STREAMS"))
    pool = ov.AsyncInferQueue(compiled, concurrency)
    events: list[tuple[int, float, float]] = []

    def done(_: ov.InferRequest, started: tuple[int, float]) -> None:  # with the GIL: no lock needed
        events.append((started[0], started[1], time.perf_counter()))

    pool.set_callback(done)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        idle = pool.get_idle_request_id()  # waits for one (without the GIL)
        pool.start_async({0: x}, (idle, time.perf_counter()), share_inputs=True)
    pool.wait_all()
    return events, streams


def render(t: Timeline) -> str:
    head = (f"{t.label}: {t.per_s:.0f} infer/s, stream occupancy {t.occupancy:.2f}, in OpenVINO on average "
            f"{t.in_flight:.2f}, hand-off gap p50 {t.gap_p50_us:.0f} us / p90 {t.gap_p90_us:.0f} us")
    return "\n".join([head, *t.rows])


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenet_v2", choices=["mobilenet_v2", "resnetish", "add"])
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--protocols", default="grpc", help="comma-separated: grpc, rest-binary")
    p.add_argument("--photo", action="store_true", help="send the photo path's JPEG instead of a tensor")
    p.add_argument("--nireq", default="0,4", help="comma-separated --nireq values for the server (0: its default)")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds of load per run (after 1 s of warm-up)")
    p.add_argument("--ovserve-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--out", type=Path, help="also write the report to this file")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--serve"]:
        return serve(argv[1:])
    args = parse_args(argv)
    spec = specs.spec_of(args.model)
    props = " ".join(f"{k}={v}" for k, v in spec.plugin_config.items())
    protocols = [p for p in args.protocols.split(",") if p]
    if not protocols or set(protocols) - set(SHOWN):
        print(f"--protocols: choose from {', '.join(SHOWN)}", file=sys.stderr)
        return 2
    if args.photo and args.model != photo.MODEL:
        print(f"--photo sends a JPEG, which only {photo.MODEL} (the classifier) decodes", file=sys.stderr)
        return 2
    what = "a JPEG per request (the photo path)" if args.photo else "tensors"
    title = f"# Stream timeline: {args.model} ({props}), {', '.join(protocols)} at concurrency {args.concurrency}"
    lines = [f"{title}, {what}", ""]
    if args.ovserve_arg:  # an engine, a setting: the file says what the served rows ran with
        lines += [f"ovserve serve ... {' '.join(args.ovserve_arg)}", ""]
    with tempfile.TemporaryDirectory(prefix="ovserve-bench-timeline-") as name:
        tmp = Path(name)
        paths = models.build_repository(tmp / "repo", mobilenet=args.model == "mobilenet_v2")
        if args.model not in paths:
            print(f"{args.model} cannot be had here", file=sys.stderr)
            return 2
        config = models.write_config(tmp / "config", [args.model], repo=tmp / "repo")
        events, streams = raw_async(paths[args.model], spec.plugin_config, spec.sample(), args.concurrency,
                                    args.seconds + 1.0)
        results = [analyse(f"raw async OpenVINO, {args.concurrency} requests", events, streams)]
        image = str(soak.test_image(tmp)[0]) if args.photo else ""
        for protocol, nireq in itertools.product(protocols, (int(n) for n in args.nireq.split(",") if n)):
            case = Case(protocol, args.model, args.concurrency, args.seconds, 1.0, image=image)
            got = served(config, case, nireq, list(args.ovserve_arg), tmp)
            results.append(analyse(f"ovserve {SHOWN[protocol]}, nireq {nireq or 'default'}", got, streams))
    lines += [(f"{streams} streams; timelines: a {STRETCH_S * 1e3:.0f} ms stretch from the middle of each "
               "window, # in OpenVINO, . waiting"), ""]
    for t in results:
        lines += [render(t), ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
