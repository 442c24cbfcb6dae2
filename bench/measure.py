"""One benchmark case, driven from the parent: the load generator in its own
process, the server's CPU and peak RSS sampled over exactly the measured window.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from .loadgen import Case
from .servers import cpu_seconds, rss_bytes

ROOT = Path(__file__).resolve().parent.parent
#: where every bench run is written (dated files; latest.md is the last full run)
RESULTS = ROOT / "bench" / "results"
RSS_PERIOD = 0.2  # seconds between RSS samples during a window


@dataclass
class Row:
    model: str
    server: str  # raw, ovserve, kserve
    protocol: str  # sync, async, grpc, rest-json, rest-binary
    concurrency: int
    throughput: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    count: int = 0
    errors: int = 0
    server_cpu_pct: float = 0.0  # % of one core, process and children
    server_rss_mib: float = 0.0  # peak over the window
    client_cpu_pct: float | None = None  # % of one core; None when client and server are one process
    other_cpu_pct: float = 0.0  # the rest of the machine's busy CPU over the window: noise
    first_error: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent not idle (all cores)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)


def wait_quiet(limit_pct: float, timeout: float, log: Callable[[str], None] = print) -> float:
    """Wait (at most ``timeout`` s) until the machine's busy CPU over 2 s is under
    ``limit_pct`` % of one core; returns the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        b0, t0 = machine_busy_seconds(), time.perf_counter()
        time.sleep(2)
        busy = 100 * (machine_busy_seconds() - b0) / (time.perf_counter() - t0)
        if busy < limit_pct or time.monotonic() > deadline:
            return busy
        log(f"machine busy ({busy:.0f}% of a core in other processes); waiting for it to calm down")


class _PeakRss(threading.Thread):
    def __init__(self, proc: psutil.Process) -> None:
        super().__init__(daemon=True)
        self.proc, self.peak, self.done = proc, rss_bytes(proc), threading.Event()

    def run(self) -> None:
        while not self.done.wait(RSS_PERIOD):
            self.peak = max(self.peak, rss_bytes(self.proc))


def _lines(stream, out: queue.Queue[str | None]) -> None:
    for line in stream:
        out.put(line.rstrip("\n"))
    out.put(None)


def run_case(case: Case, server: str, server_pid: int | None, log: Callable[[str], None] = print) -> Row:
    """Run ``case`` in a load generator process; ``server_pid`` None means the
    load generator is itself the server (raw OpenVINO)."""
    row = Row(case.model, server, case.kind.removeprefix("raw-"), case.concurrency)
    cmd = [sys.executable, "-m", "bench.loadgen", json.dumps(asdict(case))]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
    errs: list[str] = []
    threading.Thread(target=lambda: errs.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
    watched = psutil.Process(server_pid if server_pid is not None else proc.pid)
    # Start-up (imports, model compile, building bodies) + warm-up + window + drain.
    deadline = time.monotonic() + 300 + case.warmup + case.duration + case.timeout
    result: dict | None = None
    sampler: _PeakRss | None = None
    cpu0 = busy0 = t0 = busy_pct = 0.0
    try:
        while result is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if line is None:
                break
            if line == "START":
                sampler = _PeakRss(watched)
                sampler.start()
                cpu0, busy0, t0 = cpu_seconds(watched), machine_busy_seconds(), time.perf_counter()
            elif line == "STOP" and sampler is not None:
                wall = time.perf_counter() - t0
                row.server_cpu_pct = 100 * (cpu_seconds(watched) - cpu0) / wall
                busy_pct = 100 * (machine_busy_seconds() - busy0) / wall
                sampler.done.set()
                row.server_rss_mib = max(sampler.peak, rss_bytes(watched)) / 2**20
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        proc.wait(30)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if sampler is not None:
            sampler.done.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    if result is None:
        row.errors = max(row.errors, 1)
        row.first_error = f"load generator failed (exit {proc.returncode}): {''.join(errs)[-500:]}"
        log(f"  ! {row.first_error}")
        return row
    row.throughput, row.p50_ms, row.p99_ms = result["throughput"], result["p50_ms"], result["p99_ms"]
    row.count, row.errors, row.first_error = result["count"], result["errors"], result["first_error"]
    if server_pid is not None and result["elapsed"] > 0:
        row.client_cpu_pct = 100 * result["client_cpu_s"] / result["elapsed"]
    if sampler is not None:
        row.other_cpu_pct = max(busy_pct - row.server_cpu_pct - (row.client_cpu_pct or 0), 0.0)
    return row


def run_quietest(case: Case, server: str, server_pid: int | None, max_noise: float, wait_quiet_s: float,
                 log: Callable[[str], None] = print) -> Row:
    """:func:`run_case`, run again (at most twice, after a quiet spell) while other processes took more than
    ``max_noise`` % of a core during it; the quietest try."""
    tries = [run_case(case, server, server_pid, log)]
    while tries[-1].other_cpu_pct > max_noise and len(tries) < 3 and wait_quiet_s > 0:
        log(f"  (other processes took {tries[-1].other_cpu_pct:.0f}% of a core: measuring again)")
        wait_quiet(10, wait_quiet_s, log)
        tries.append(run_case(case, server, server_pid, log))
    return min(tries, key=lambda r: r.other_cpu_pct)


def add_run_options(p: argparse.ArgumentParser, prefix: str, results: Path) -> None:
    """The options every side bench shares (``python -m bench.<prefix>``): the window, the concurrencies,
    extra server arguments, the quiet wait, reruns on noise and where ``<prefix>-<stamp>.md`` goes."""
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per case")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each case")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated in-flight requests")
    p.add_argument("--ovserve-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `ovserve serve` (repeatable)")
    p.add_argument("--wait-quiet", type=float, default=120, metavar="SECONDS",
                   help="wait up to this long for other processes to leave the CPU alone before starting")
    p.add_argument("--max-noise", type=float, default=15, metavar="PCT",
                   help="rerun a case (at most twice, keeping the quietest) when other processes took more "
                        "than PCT %% of a core during it")
    p.add_argument("--out", type=Path, default=results, metavar="DIR",
                   help=f"where the run's {prefix}-<YYYYMMDD-HHMM>.md and .csv go (default: bench/results)")
    p.add_argument("--no-out", action="store_true", help="print only, write nothing")
