"""``python -m bench.soak``: one ovserve under mixed REST, gRPC and image traffic for a bounded time.

One server serves every model; one load generator process per stream (a
model and a transport), so the clients do not share a GIL. All streams warm
up together, open their measured window at the same instant and run
closed loops for ``--duration`` seconds. Reported per stream: requests,
errors by kind, throughput, p50 and p99 over the first and last window and
the whole run; the server's RSS and open fds at the start (after warm-up),
at the end and at their peak, and its CPU; the machine's other load; and,
per model, gRPC's p50 over REST's (issue 15, item 17: within 2x). Exit
status 1 when any request failed. See bench/README.md ("Soak").
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import psutil

from . import models, report, servers, specs
from .loadgen import Case
from .measure import ROOT, machine_busy_seconds, wait_quiet

#: Traffic kinds, each given an equal share of the concurrency: (name, transport, images?).
KINDS = (("rest-json", "rest-json", False), ("rest-binary", "rest-binary", False), ("grpc", "grpc", False),
         ("images", "rest-binary", True), ("images", "grpc", True))
TENSOR_MODELS = ("add", "resnetish")
#: REST JSON only for small tensors: 150,528 floats as JSON text is a ~3 MB body per request.
JSON_MODELS = ("add",)
FAIR = 2.0  # item 17: gRPC's p50 within this factor of REST's, same model, same load
READY_TIMEOUT = 180.0  # seconds for every load generator to connect and check its first answer


@dataclass
class Stream:
    model: str
    kind: str  # transport: grpc, rest-json, rest-binary
    concurrency: int

    @property
    def image(self) -> bool:
        return self.model in specs.IMAGE_MODELS

    @property
    def label(self) -> str:
        return f"{self.model} {self.kind}" + (" (jpeg)" if self.image else "")


def split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal shares, the larger ones first."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def default_streams(names: list[str], total: int) -> list[Stream]:
    """Every traffic kind its equal share of ``total``, shared evenly by the models it goes to:
    REST JSON (small tensors), REST binary and gRPC (tensors), images (REST binary and gRPC)."""
    kinds: dict[str, list[tuple[str, str]]] = {}
    for name, transport, image in KINDS:
        for m in names:
            is_image = m in specs.IMAGE_MODELS
            if is_image == image and (transport != "rest-json" or m in JSON_MODELS):
                kinds.setdefault(name, []).append((m, transport))
    if total < sum(len(v) for v in kinds.values()):
        raise SystemExit(f"concurrency {total} is less than the {sum(len(v) for v in kinds.values())} streams")
    streams = []
    for share, members in zip(split(total, len(kinds)), kinds.values(), strict=True):
        if share < len(members):  # a kind with more streams than its share: take from the total instead
            raise SystemExit(f"concurrency {total} leaves {share} for {len(members)} streams of one kind; raise it")
        streams += [Stream(m, t, c) for (m, t), c in zip(members, split(share, len(members)), strict=True)]
    return streams


def parse_streams(text: str) -> list[Stream]:
    """``MODEL:KIND=C,...`` (C defaults to 1)."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        head, _, c = item.partition("=")
        model, _, kind = head.partition(":")
        if kind not in ("grpc", "rest-json", "rest-binary") or not model:
            raise SystemExit(f"--streams: {item!r} is not MODEL:KIND[=C] with KIND grpc, rest-json or rest-binary")
        out.append(Stream(model, kind, int(c or 1)))
    for s in out:
        if s.image and s.kind == "rest-json":
            raise SystemExit(f"--streams: {s.model} takes images, over grpc or rest-binary")
    return out


# -- the server, sampled ---------------------------------------------------------------
@dataclass
class Sample:
    t: float  # seconds since the window opened
    rss: int  # bytes, process and children
    fds: int  # open file descriptors, process and children
    cpu_s: float  # CPU seconds so far, process and children
    busy_s: float  # the whole machine's busy CPU seconds so far


def open_fds(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.num_fds()
    return total


def sample(proc: psutil.Process, t0: float) -> Sample:
    return Sample(time.monotonic() - t0, servers.rss_bytes(proc), open_fds(proc), servers.cpu_seconds(proc),
                  machine_busy_seconds())


class Sampler(threading.Thread):
    """The server every ``period`` seconds until stopped."""

    def __init__(self, proc: psutil.Process, t0: float, period: float) -> None:
        super().__init__(daemon=True)
        self.proc, self.t0, self.period = proc, t0, period
        self.samples: list[Sample] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.period):
            try:
                self.samples.append(sample(self.proc, self.t0))
            except psutil.NoSuchProcess:
                return


# -- the load generators -----------------------------------------------------------------
class Generator:
    """One stream's load generator process, its stdout read on a thread."""

    def __init__(self, stream: Stream, case: Case) -> None:
        self.stream = stream
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.loadgen", json.dumps(asdict(case))], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        self.ready = False
        self.windows: dict | None = None
        self.result: dict | None = None
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()  # type: ignore[arg-type]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def pump(self, until: float, want: str) -> bool:
        """Read lines until ``want`` ("READY" or "RESULT") has come or ``until`` (monotonic) passed."""
        while not (self.ready if want == "READY" else self.result is not None):
            if self.result is not None:  # ended before READY (its first answer failed)
                return False
            try:
                line = self.lines.get(timeout=max(until - time.monotonic(), 0.01))
            except queue.Empty:
                return False
            if line is None:
                return False
            if line == "READY":
                self.ready = True
            elif line.startswith("WINDOWS "):
                self.windows = json.loads(line[len("WINDOWS "):])
            elif line.startswith("RESULT "):
                self.result = json.loads(line[len("RESULT "):])
        return True

    def go(self, start: float) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"GO {start!r}\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def failure(self) -> str:
        if self.result is not None and self.result.get("first_error"):
            return self.result["first_error"]
        return f"load generator failed (exit {self.proc.poll()}): {''.join(self.stderr)[-400:]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


# -- one run -------------------------------------------------------------------------------
@dataclass
class StreamResult:
    model: str
    kind: str
    concurrency: int
    image: bool
    count: int = 0
    errors: int = 0
    error_kinds: dict = field(default_factory=dict)
    first_error: str = ""
    client_cpu_s: float = 0.0
    first: dict = field(default_factory=dict)  # the first window: count, errors, p50_ms, p99_ms, throughput...
    last: dict = field(default_factory=dict)
    all: dict = field(default_factory=dict)
    series: list = field(default_factory=list)

    @property
    def label(self) -> str:
        return Stream(self.model, self.kind, self.concurrency).label


@dataclass
class Soak:
    started: str  # ISO UTC
    command: str
    duration: float
    window: float
    concurrency: int
    ovserve_args: list
    image: str  # what the image streams send
    streams: list  # of StreamResult
    server: dict  # rss/fds at start, end, peak; cpu_pct; samples
    cpu: dict  # machine: before_pct, busy_pct, server_pct, clients_pct, other_pct
    fairness: list  # per model: grpc p50, REST p50s, ratios, verdict
    errors: int = 0
    failures: list = field(default_factory=list)  # what went wrong beside request errors
    server_log: dict = field(default_factory=dict)  # log_problems() of the soak's lines
    machine: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    code: str = ""  # code_version()


def fairness(streams: list[StreamResult]) -> list[dict]:
    """Per model with gRPC and REST streams: gRPC p50 over each REST kind's (whole run), and whether it
    is within FAIR of the fastest REST kind's (the strictest reading of item 17)."""
    out = []
    for model in dict.fromkeys(s.model for s in streams):
        mine = {s.kind: s for s in streams if s.model == model and s.all.get("count")}
        grpc = mine.get("grpc")
        rest = {k: s for k, s in mine.items() if k.startswith("rest-")}
        if grpc is None or not rest:
            continue
        g = grpc.all["p50_ms"]
        ratios = {k: g / s.all["p50_ms"] for k, s in rest.items() if s.all["p50_ms"] > 0}
        total = sum(s.count for s in mine.values())
        share = grpc.count / total if total else 0.0
        conc = sum(s.concurrency for s in mine.values())
        worst = max(ratios.values()) if ratios else None
        out.append({"model": model, "grpc_p50_ms": g, "rest_p50_ms": {k: s.all["p50_ms"] for k, s in rest.items()},
                    "ratio": ratios, "worst_ratio": worst, "within": worst is not None and worst <= FAIR,
                    "grpc_share": share, "grpc_concurrency_share": grpc.concurrency / conc if conc else 0.0,
                    "first_ratio": _ratio(grpc.first, [s.first for s in rest.values()]),
                    "last_ratio": _ratio(grpc.last, [s.last for s in rest.values()])})
    return out


def _ratio(g: dict, rest: list[dict]) -> float | None:
    best = min((r["p50_ms"] for r in rest if r.get("count")), default=0.0)
    return g["p50_ms"] / best if g.get("count") and best > 0 else None


def build(tmp: Path, names: list[str]) -> list[str]:
    """Write the models into ``tmp``; returns the names served (mobilenet_v2 may become small_classifier)."""
    paths = models.build_repository(tmp, mobilenet="mobilenet_v2" in names)
    served = []
    for name in names:
        n = name
        if n == "mobilenet_v2" and n not in paths:
            print("mobilenet_v2's weights cannot be had: images go to small_classifier instead", flush=True)
            n = "small_classifier"
        if n == "small_classifier" and n not in paths:
            paths[n] = models.build_small_classifier(tmp)
        if n not in paths:
            raise SystemExit(f"unknown model {n!r}: add, resnetish, mobilenet_v2, small_classifier")
        if n not in served:
            served.append(n)
    return served


def test_image(tmp: Path) -> tuple[Path, str]:
    """A JPEG to send: scikit-image's cat photo (451x300) when installed, else a seeded synthetic
    640x480 picture of the same kind of size in bytes; returns the file and what it is."""
    import cv2
    import numpy as np

    try:
        import skimage.data

        rgb, what = skimage.data.chelsea(), "scikit-image's chelsea photo"
        bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
    except ImportError:
        rng = np.random.default_rng(specs.SEED)
        yy, xx = np.mgrid[0:480, 0:640]
        base = np.stack([xx * 255 / 640, yy * 255 / 480, (xx + yy) * 255 / 1120], -1)
        bgr = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        what = "a synthetic 640x480 gradient with noise"
    ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    path = tmp / "image.jpg"
    path.write_bytes(buf.tobytes())
    h, w = bgr.shape[:2]
    return path, f"{what}, {w}x{h} JPEG of {len(buf) / 1024:.0f} KiB"


def run(args: argparse.Namespace, command: str) -> Soak:
    started = report.now()
    with tempfile.TemporaryDirectory(prefix="ovserve-soak-") as tmp_name:
        tmp = Path(tmp_name)
        wanted = [m for m in args.models.split(",") if m]
        if args.streams:
            streams = parse_streams(args.streams)
            wanted = list(dict.fromkeys(s.model for s in streams))
        names = build(tmp, wanted)
        if args.streams:
            rename = dict(zip(wanted, names, strict=True))
            streams = [Stream(rename.get(s.model, s.model), s.kind, s.concurrency) for s in streams]
        else:
            streams = default_streams(names, args.concurrency)
        image, image_what = test_image(tmp)
        config = models.write_config(tmp / "config", names, repo=tmp)
        extra = [*args.ovserve_arg, *(["--grpc-engine", args.grpc_engine] if args.grpc_engine else [])]
        print(f"streams ({sum(s.concurrency for s in streams)} in flight): "
              + ", ".join(f"{s.label} x{s.concurrency}" for s in streams), flush=True)
        with servers.start_ovserve(config, extra, keep=None) as server:  # every line: the soak's are counted
            server.wait_ready(names)
            logged = len(server.output.lines)
            print(f"ovserve pid {server.proc.pid}, REST {server.rest_port}, gRPC {server.grpc_port}"
                  + (f", args {shlex.join(extra)}" if extra else ""), flush=True)
            before = wait_quiet(args.quiet_below, args.wait_quiet, log=lambda m: print(m, flush=True))
            soak = drive(args, server, streams, image)
            if server.proc.poll() is not None:
                soak["failures"].append(f"ovserve exited with {server.proc.returncode} during the soak")
            server.stop()
            log = log_problems(list(server.output.lines)[logged:])
    results: list[StreamResult] = soak["streams"]
    server_figs, cpu = soak["server"], soak["cpu"]
    cpu["before_pct"] = before
    return Soak(started.isoformat(timespec="seconds"), command, args.duration, args.window,
                sum(s.concurrency for s in streams), extra, image_what, results, server_figs, cpu,
                fairness(results), sum(r.errors for r in results), soak["failures"], log,
                report.machine(), versions(), code_version())


#: A traceback's last line: the exception and its message.
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b")


def log_problems(lines: list[str]) -> dict:
    """What the server logged at WARNING and above during the soak: counts, and the first few
    distinct messages (each traceback by its exception line)."""
    out: dict = {"warnings": 0, "errors": 0, "tracebacks": 0, "first": []}
    for raw in lines:
        line = raw.rstrip()
        kind = ("errors" if " ERROR " in line or " CRITICAL " in line else "warnings" if " WARNING " in line
                else "tracebacks" if line.startswith("Traceback") else "")
        if kind:
            out[kind] += 1
        message = line if kind in ("errors", "warnings") else line if EXCEPTION_LINE.match(line) else ""
        message = re.sub(r"^[\d-]+ [\d:,]+ ", "", message)  # without the time stamp, to see repeats
        if message and message not in out["first"] and len(out["first"]) < 6:
            out["first"].append(message[:300])
    return out


def drive(args: argparse.Namespace, server: servers.ServerProcess, streams: list[Stream], image: Path) -> dict:
    """Start every stream's load generator, open all windows together, sample the server; the figures."""
    gens = []
    for s in streams:
        port = server.port_for(s.kind)
        case = Case(s.kind, s.model, s.concurrency, args.duration, port=port, timeout=args.timeout,
                    max_requests=args.max_requests, image=str(image) if s.image else "", sync=True,
                    window=args.window)
        gens.append(Generator(s, case))
    failures: list[str] = []
    watched = server.ps
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        for g in gens:
            if not g.pump(deadline, "READY"):
                failures.append(f"{g.stream.label}: {g.failure()}")
        start = time.monotonic() + args.warmup
        for g in gens:
            g.go(start)
        time.sleep(max(start - time.monotonic(), 0))
        first = sample(watched, start)
        sampler = Sampler(watched, start, args.sample)
        sampler.start()
        time.sleep(max(start + args.duration - time.monotonic(), 0))
        end = sample(watched, start)
        sampler.done.set()
        deadline = time.monotonic() + args.timeout + 60
        for g in gens:
            if g.ready and not g.pump(deadline, "RESULT"):
                failures.append(f"{g.stream.label}: {g.failure()}")
    finally:
        for g in gens:
            g.stop()
    results = [collect(g) for g in gens]
    samples = [first, *sampler.samples, end]
    wall = end.t - first.t
    server_pct = 100 * (end.cpu_s - first.cpu_s) / wall
    busy_pct = 100 * (end.busy_s - first.busy_s) / wall
    clients_pct = 100 * sum(r.client_cpu_s for r in results) / wall
    mib = 2**20
    server_figs = {
        "rss_start_mib": first.rss / mib, "rss_end_mib": end.rss / mib,
        "rss_peak_mib": max(s.rss for s in samples) / mib,
        "fds_start": first.fds, "fds_end": end.fds, "fds_peak": max(s.fds for s in samples), "cpu_pct": server_pct,
        "samples": [[round(s.t, 2), round(s.rss / mib, 1), s.fds, round(s.cpu_s, 2), round(s.busy_s, 2)]
                    for s in samples],  # t, RSS MiB, fds, server CPU s, machine busy CPU s
    }
    cpu = {"busy_pct": busy_pct, "server_pct": server_pct, "clients_pct": clients_pct,
           "other_pct": max(busy_pct - server_pct - clients_pct, 0.0)}
    for name, (a, b) in (("first", (0.0, args.window)), ("last", (args.duration - args.window, args.duration))):
        cpu[f"server_{name}_pct"], cpu[f"other_{name}_pct"] = window_cpu(server_figs["samples"], a, b, clients_pct)
    return {"streams": results, "server": server_figs, "cpu": cpu, "failures": failures}


def window_cpu(samples: list[list[float]], a: float, b: float, clients_pct: float) -> tuple[float, float]:
    """(server, other processes) CPU % of a core between the samples nearest ``a`` and ``b`` seconds;
    the load generators' share is taken as their whole-run average."""
    s0, s1 = (min(samples, key=lambda x: abs(x[0] - t)) for t in (a, b))
    wall = s1[0] - s0[0]
    if wall <= 0:
        return 0.0, 0.0
    server = 100 * (s1[3] - s0[3]) / wall
    return server, max(100 * (s1[4] - s0[4]) / wall - server - clients_pct, 0.0)


def collect(g: Generator) -> StreamResult:
    s = g.stream
    r = StreamResult(s.model, s.kind, s.concurrency, s.image)
    res = g.result or {}
    r.first_error, r.client_cpu_s = res.get("first_error", ""), res.get("client_cpu_s", 0.0)
    if g.windows is None:  # never measured: its first answer failed, or the process did
        r.errors = max(res.get("errors", 0), 1)
        r.first_error = r.first_error or g.failure()
        r.error_kinds = {"first answer" if res else "load generator": r.errors}
        return r
    w = g.windows
    r.first, r.last, r.all, r.series = w["first"], w["last"], w["all"], w["series"]
    r.count, r.errors, r.error_kinds = w["all"]["count"], w["all"]["errors"], w["all"]["error_kinds"]
    return r


def code_version() -> str:
    """The checkout's commit, and whether server/ had changes not committed (the code measured)."""
    def git(*cmd: str) -> str:
        try:
            done = subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False)
            return done.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    return commit + (" with uncommitted changes in server/" if git("status", "--porcelain", "--", "server") else "")


def versions() -> dict[str, str]:
    return report.installed("ovserve", "openvino", "grpcio", "pygrpc-native", "uvicorn", "protobuf",
                            "opencv-python-headless")


# -- rendering ------------------------------------------------------------------------------
HEADER = ["stream", "conc", "requests", "share %", "errors", "req/s first/last/all",
          "p50 ms first/last/all", "p99 ms first/last/all"]
FAIR_HEADER = ["model", "gRPC p50 ms", "REST p50 ms", "gRPC / REST p50", "first / last window",
               "gRPC share: requests (in flight)", f"within {FAIR:g}x"]


def _three(r: StreamResult, key: str, fmt: str) -> str:
    return " / ".join(format(w.get(key, 0.0), fmt) if w else "-" for w in (r.first, r.last, r.all))


def table(soak: Soak) -> tuple[list[str], list[list[str]]]:
    total = sum(r.count for r in soak.streams) or 1
    body = []
    for r in soak.streams:
        body.append([r.label, str(r.concurrency), str(r.count), f"{100 * r.count / total:.1f}", str(r.errors),
                     _three(r, "throughput", ".0f"), _three(r, "p50_ms", ".2f"), _three(r, "p99_ms", ".2f")])
    return HEADER, body


def fair_table(soak: Soak) -> tuple[list[str], list[list[str]]]:
    def f(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    body = []
    for x in soak.fairness:
        body.append([x["model"], f"{x['grpc_p50_ms']:.2f}",
                     ", ".join(f"{k.removeprefix('rest-')} {v:.2f}" for k, v in x["rest_p50_ms"].items()),
                     ", ".join(f"/{k.removeprefix('rest-')} {v:.2f}" for k, v in x["ratio"].items()),
                     f"{f(x['first_ratio'])} / {f(x['last_ratio'])}",
                     f"{100 * x['grpc_share']:.0f}% ({100 * x['grpc_concurrency_share']:.0f}%)",
                     "yes" if x["within"] else "**no**"])
    return FAIR_HEADER, body


def quote(soak: Soak) -> str:
    """One line for docs and issue notes."""
    s, c = soak.server, soak.cpu
    ratios = ", ".join(f"{x['model']} {x['worst_ratio']:.2f}x" for x in soak.fairness if x["worst_ratio"] is not None)
    return (f"soak {soak.started[:16].replace('T', ' ')} UTC, {soak.duration:g} s at {soak.concurrency} in flight "
            f"({len(soak.streams)} streams): {sum(r.count for r in soak.streams):,} requests, {soak.errors} errors; "
            f"RSS {s['rss_start_mib']:.0f} -> {s['rss_end_mib']:.0f} MiB (peak {s['rss_peak_mib']:.0f}), "
            f"fds {s['fds_start']} -> {s['fds_end']} (peak {s['fds_peak']}); "
            f"gRPC p50 / REST p50: {ratios or 'n/a'}; other processes {c['other_pct']:.0f}% of a core")


def render(soak: Soak, markdown: bool) -> str:
    tab = report.markdown_table if markdown else report.text_table
    s, c = soak.server, soak.cpu
    kinds: dict[str, int] = {}
    for r in soak.streams:
        for k, n in r.error_kinds.items():
            kinds[f"{r.label}: {k}"] = n
    lines = [
        tab(*table(soak)),
        "",
        (f"- Windows: first and last {soak.window:g} s, and all {soak.duration:g} s. "
         f"Images: {soak.image}."),
        f"- Errors: {soak.errors}" + (" (" + "; ".join(f"{k} {n}" for k, n in kinds.items()) + ")" if kinds else "")
        + "." + "".join(f"\n- First error of {r.label}: {r.first_error}" for r in soak.streams if r.first_error),
        (f"- Server: RSS {s['rss_start_mib']:.0f} MiB at the start (after warm-up), {s['rss_end_mib']:.0f} at the end, "
         f"peak {s['rss_peak_mib']:.0f}; open fds {s['fds_start']} -> {s['fds_end']} (peak {s['fds_peak']}); "
         f"CPU {s['cpu_pct']:.0f}% of a core."),
        (f"- Machine: busy {c['busy_pct']:.0f}% of a core during the soak (server {c['server_pct']:.0f}%, "
         f"load generators {c['clients_pct']:.0f}%, other processes {c['other_pct']:.0f}%; first / last window: "
         f"server {c['server_first_pct']:.0f} / {c['server_last_pct']:.0f}%, other processes "
         f"{c['other_first_pct']:.0f} / {c['other_last_pct']:.0f}%); "
         f"other processes just before: {c['before_pct']:.0f}%."),
        *[f"- Failure: {f}" for f in soak.failures],
        f"- Server log during the soak: {soak.server_log['errors']} ERROR, {soak.server_log['warnings']} WARNING "
        f"lines, {soak.server_log['tracebacks']} tracebacks"
        + "".join(f"\n    - `{m}`" for m in soak.server_log["first"]),
        "",
        (f"gRPC vs REST, same model, same load (issue 15 item 17: gRPC p50 within {FAIR:g}x of REST's; "
         "'within' compares with the fastest REST kind):"),
        "",
        tab(*fair_table(soak)) if soak.fairness else "(no model has both gRPC and REST streams)",
    ]
    return "\n".join(lines)


def series_table(soak: Soak, markdown: bool) -> str:
    """p50 ms of each stream in each consecutive window, and the server's RSS/fds at each window's end."""
    tab = report.markdown_table if markdown else report.text_table
    n = max((len(r.series) for r in soak.streams), default=0)
    if n == 0:
        return ""
    windows = next(r.series for r in soak.streams if len(r.series) == n)
    header = ["p50 ms (req/s)", *[f"{w['start']:g}-{w['stop']:g} s" for w in windows]]
    body = [[r.label, *[f"{w['p50_ms']:.2f} ({w['throughput']:.0f})" for w in r.series]] for r in soak.streams
            if len(r.series) == n]
    samples = soak.server["samples"]

    def at(t: float) -> list:
        return min(samples, key=lambda x: abs(x[0] - t))

    body.append(["server RSS MiB / fds", *[f"{at(w['stop'])[1]:.0f} / {at(w['stop'])[2]}" for w in windows]])
    cpus = [window_cpu(samples, w["start"], w["stop"], soak.cpu["clients_pct"]) for w in windows]
    body.append(["server CPU %", *[f"{c[0]:.0f}" for c in cpus]])
    body.append(["other processes CPU %", *[f"{c[1]:.0f}" for c in cpus]])
    return tab(header, body)


def document(soak: Soak) -> str:
    m = soak.machine
    when = datetime.fromisoformat(soak.started)
    return "\n".join([
        f"# ovserve soak, {when.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['os']}; Python {m['python']}",
        f"- software: {', '.join(f'{k} {v}' for k, v in soak.versions.items())}; code {soak.code}",
        f"- command: `{soak.command}`",
        f"- {soak.duration:g} s, {soak.concurrency} requests in flight in closed loops, windows of {soak.window:g} s"
        + (f"; ovserve args `{shlex.join(soak.ovserve_args)}`" if soak.ovserve_args else ""),
        f"- OpenVINO properties: {'; '.join(f'{r.model} {_props(r.model)}' for r in _models(soak))}",
        "",
        render(soak, markdown=True),
        "",
        "Per window:",
        "",
        series_table(soak, markdown=True),
        "",
        "Quote: " + quote(soak),
        "",
    ])


def _props(model: str) -> str:
    return " ".join(f"{k}={v}" for k, v in specs.spec_of(model).plugin_config.items())


def _models(soak: Soak) -> list[StreamResult]:
    return list({r.model: r for r in soak.streams}.values())


def write(soak: Soak, out: Path, json_path: Path | None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.fromisoformat(soak.started).strftime("%Y%m%d-%H%M%S")
    md = out / f"soak-{stamp}.md"
    md.write_text(document(soak))
    written = [md]
    if json_path is not None:
        json_path.write_text(json.dumps(asdict(soak), indent=1))
        written.append(json_path)
    return written


# -- the command ------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=None, metavar="S", help="measured seconds (default 300)")
    p.add_argument("--minutes", type=float, default=None, help="measured minutes (instead of --duration)")
    p.add_argument("--window", type=float, default=60, metavar="S",
                   help="the first and last windows, and the per-window table, in seconds (default 60)")
    p.add_argument("--warmup", type=float, default=5, metavar="S", help="unmeasured seconds with all streams running")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight in all, split evenly over the "
                   "kinds REST JSON, REST binary, gRPC and images, then over each kind's models")
    p.add_argument("--models", default="add,resnetish,mobilenet_v2",
                   help="tensors to add and resnetish, JPEG images to mobilenet_v2 (small_classifier when its "
                        "weights cannot be had) or small_classifier")
    p.add_argument("--streams", default="", metavar="MODEL:KIND=C,...",
                   help="exact streams instead (KIND grpc, rest-json or rest-binary; C in flight), e.g. "
                        "add:rest-json=15,add:grpc=1 for a gRPC probe beside REST load")
    p.add_argument("--timeout", type=float, default=10, metavar="S", help="per request")
    p.add_argument("--max-requests", type=int, default=2_000_000, help="per stream, at most")
    p.add_argument("--sample", type=float, default=1.0, metavar="S", help="seconds between server samples")
    p.add_argument("--grpc-engine", choices=["grpcio", "native", "loop"], default=None, help="ovserve's --grpc-engine")
    p.add_argument("--ovserve-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `ovserve serve` (repeatable), e.g. --ovserve-arg=--nireq=2")
    p.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                   help="wait up to S seconds for other processes to leave the CPU before starting")
    p.add_argument("--quiet-below", type=float, default=10, metavar="PCT", help="what --wait-quiet waits for")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where soak-<date>.md goes")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write every figure as JSON")
    args = p.parse_args(argv)
    if args.duration is not None and args.minutes is not None:
        p.error("give --duration or --minutes, not both")
    if args.duration is None:
        args.duration = 60 * (args.minutes if args.minutes is not None else 5)
    if args.duration <= 0 or args.window <= 0:
        p.error("--duration and --window must be positive")
    args.window = min(args.window, args.duration)
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop the server and the generators
    command = "python -m bench.soak" + ("" if not argv else " " + shlex.join(argv))
    soak = run(args, command)
    print()
    print(render(soak, markdown=False))
    print()
    print(series_table(soak, markdown=False))
    written = write(soak, args.out, args.json)
    print("\n" + quote(soak))
    print("wrote " + ", ".join(str(p) for p in written))
    return 1 if soak.errors or soak.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
