"""``python -m bench.photo``: the photo path end to end (issue 21), served and in process, in one run.

A JPEG to the real MobileNetV2 classifier (decode, resize, infer, the scores for
the top 5), at each concurrency (1, 4, 16), through the same load generator:

1. **ovserve, gRPC**: the JPEG as a BYTES input in ``bytes_contents`` (OVMS's
   way) to ``ModelInfer``; the server decodes and resizes it (OpenCV) and
   answers the scores;
2. **ovserve, REST binary**: the same JPEG through the binary tensor extension;
3. **in process**: ``concurrency`` threads each doing the same work without a
   server, OpenCV decode and resize plus raw asynchronous OpenVINO on the same
   compiled model (:func:`bench.raw.run_photo`).

The rows alternate at each concurrency, so a slow spell of the machine hits
all three. With ``--repeat N`` the whole run is done N times, each round on a
freshly started server (a server's throughput moves by several per cent from
one start to the next): the table shows each cell's median over the rounds,
and each target the median of its rounds' paired ratios (served over the
in-process pipeline of the same round). Goal (issue 21): each served path at
least 0.8x the in-process pipeline's throughput at concurrency 4. Written to
``bench/results/photo-<YYYYMMDD-HHMM>.md`` (and ``.csv``).
"""
from __future__ import annotations

import argparse
import shlex
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from . import models, report, servers, soak, specs
from .loadgen import Case
from .measure import RESULTS, Row, add_run_options, run_quietest, wait_quiet

MODEL = "mobilenet_v2"
#: (server, protocol) of each row, in the table's order, and what it is called there
PATHS = {("ovserve", "grpc"): "gRPC ModelInfer, BYTES (bytes_contents)",
         ("ovserve", "rest-binary"): "REST binary tensor extension, BYTES",
         ("raw", "photo"): "in process: OpenCV + raw async OpenVINO"}
GOAL = 0.8  # served / in process, at concurrency 4


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.photo", description=__doc__.splitlines()[0])
    add_run_options(p, "photo", RESULTS)
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="rounds, each on a fresh server; the table shows medians, the targets median paired ratios")
    return p.parse_args(argv)


class Runner:
    def __init__(self, args: argparse.Namespace, model_path: Path, image: Path,
                 log: Callable[[str], None] = print) -> None:
        self.args, self.model_path, self.image, self.log = args, model_path, image, log
        self.rows: list[Row] = []
        self.rounds: list[list[Row]] = []
        self.concurrency = [int(c) for c in args.concurrency.split(",") if c]

    def case(self, kind: str, c: int, port: int = 0) -> Case:
        a = self.args
        return Case(kind, MODEL, c, a.duration, a.warmup, port=port, image=str(self.image),
                    model_path=str(self.model_path), plugin_config=specs.spec_of(MODEL).plugin_config)

    def measure(self, case: Case, server: str, pid: int | None) -> None:
        """Run a case; rerun it when the rest of the machine was busy meanwhile, keep the quietest."""
        row = run_quietest(case, server, pid, self.args.max_noise, self.args.wait_quiet, self.log)
        self.rows.append(row)
        self.rounds[-1].append(row)
        err = f" ({row.first_error[:160]})" if row.first_error else ""
        self.log(f"  {server:8} {row.protocol:12} c{case.concurrency:<3} {row.throughput:7.0f}/s  p50 "
                 f"{row.p50_ms:7.2f} ms  p99 {row.p99_ms:7.2f} ms  errors {row.errors}  server CPU "
                 f"{row.server_cpu_pct:.0f}%  other {row.other_cpu_pct:.0f}%{err}")

    def run(self, config: Path) -> None:
        for n in range(max(1, self.args.repeat)):
            self.rounds.append([])
            self.round(config, n)

    def round(self, config: Path, n: int) -> None:
        with servers.start_ovserve(config, list(self.args.ovserve_arg)) as server:
            server.wait_ready([MODEL])
            self.log(f"round {n + 1}: ovserve pid {server.pid}, REST {server.rest_port}, gRPC {server.grpc_port}")
            for c in self.concurrency:
                self.measure(self.case("grpc", c, server.grpc_port), "ovserve", server.pid)
                self.measure(self.case("rest-binary", c, server.rest_port), "ovserve", server.pid)
                self.measure(self.case("raw-photo", c), "raw", None)
            if not server.alive():
                raise RuntimeError(f"ovserve died during the run:\n{server.log}")


# -- the results -------------------------------------------------------------------------------
HEADER = ["path", "conc", "images/s", "p50 ms", "p99 ms", "errors", "CPU %", "CPU us/image", "x in process"]


def _find(rows: list[Row], server: str, protocol: str, c: int) -> Row | None:
    return next((r for r in rows if (r.server, r.protocol, r.concurrency) == (server, protocol, c) and r.count), None)


def merged(rows: list[Row]) -> list[Row]:
    """One row per (path, concurrency): the median of each figure over the rounds that answered (as
    ``bench.defaults.cell`` reads its rounds; a round with no answer is not a zero), errors and counts summed."""
    cells: dict[tuple[str, str, int], list[Row]] = {}
    for r in rows:
        cells.setdefault((r.server, r.protocol, r.concurrency), []).append(r)
    out = []
    for (server, protocol, c), group in cells.items():
        answered = [r for r in group if r.count] or group

        def med(field: str, answered: list[Row] = answered) -> float:
            return statistics.median(getattr(r, field) for r in answered)
        out.append(Row(MODEL, server, protocol, c, throughput=med("throughput"), p50_ms=med("p50_ms"),
                       p99_ms=med("p99_ms"), count=sum(r.count for r in group), errors=sum(r.errors for r in group),
                       server_cpu_pct=med("server_cpu_pct"), other_cpu_pct=med("other_cpu_pct"),
                       first_error=next((r.first_error for r in group if r.first_error), "")))
    return out


def table(rows: list[Row]) -> list[list[str]]:
    order = list(PATHS)
    out = []
    rows = merged(rows)
    for r in sorted(rows, key=lambda r: (order.index((r.server, r.protocol)), r.concurrency)):
        base = _find(rows, "raw", "photo", r.concurrency)
        x = r.throughput / base.throughput if base is not None and base.throughput and r.server != "raw" else None
        # the server's CPU for served rows; the in-process pipeline's own process for the raw row
        out.append([PATHS[(r.server, r.protocol)], str(r.concurrency), f"{r.throughput:.0f}", f"{r.p50_ms:.2f}",
                    f"{r.p99_ms:.2f}", str(r.errors), f"{r.server_cpu_pct:.0f}",
                    report._fmt(report.cpu_us(r), 0), "" if x is None else f"{x:.2f}"])
    return out


def targets(rows: list[Row], rounds: list[list[Row]] | None = None) -> list[report.Target]:
    """Served c4 over the in-process pipeline at c4: the median of the rounds' paired ratios (one round: ``rows``)."""
    cells = merged(rows)
    rounds = rounds if rounds and len(rounds) > 1 else [cells]
    out = []
    base = _find(cells, "raw", "photo", 4)
    for protocol in ("grpc", "rest-binary"):
        ours = _find(cells, "ovserve", protocol, 4)
        a, b = (ours.throughput if ours else None), (base.throughput if base else None)
        ratios = []
        for one in rounds:
            served, raw = _find(one, "ovserve", protocol, 4), _find(one, "raw", "photo", 4)
            if served is not None and raw is not None and raw.throughput:
                ratios.append(served.throughput / raw.throughput)
        v = statistics.median(ratios) if ratios else None
        paired = f" (median of {len(ratios)} rounds' ratios)" if len(ratios) > 1 else ""
        out.append(report.Target(f"photo {protocol} c4 / in process c4",
                                 f"{report._per_s(a)} vs {report._per_s(b)}{paired}",
                                 f">= {GOAL} x", v, None if v is None else v >= GOAL))
    return out


def render(rows: list[Row], markdown: bool, rounds: list[list[Row]] | None = None) -> str:
    t = report.markdown_table if markdown else report.text_table
    noisy = any(r.other_cpu_pct > report.NOISY_PCT for r in rows)
    return "\n".join([
        t(HEADER, table(rows)),
        "",
        *([f"Other processes took more than {report.NOISY_PCT}% of a core during some case (after reruns)."]
          if noisy else []),
        "Targets (issue 21):" + ("\n" if markdown else ""),
        t(*report.targets_table(targets(rows, rounds))),
    ])


def document(rows: list[Row], command: str, started: datetime, args: argparse.Namespace, image: str,
             rounds: list[list[Row]] | None = None) -> str:
    m = report.machine()
    return "\n".join([
        f"# The photo path, {started.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['os']}; Python {m['python']}",
        (f"- command: `{command}` ({args.duration:g} s per case after {args.warmup:g} s of warm-up, closed loop, "
         "127.0.0.1)"),
        *([(f"- {len(rounds)} rounds, each on a fresh server: the table shows medians over the rounds, the targets "
            "the median of each round's paired ratio")] if rounds and len(rounds) > 1 else []),
        (f"- model: the real MobileNetV2 (ovserve.server.tools.zoo), compiled alike for the server and in process: "
         f"{' '.join(f'{k}={v}' for k, v in specs.spec_of(MODEL).plugin_config.items())}"),
        f"- image: {image}",
        "",
        render(rows, markdown=True, rounds=rounds),
        "",
    ])


def write(rows: list[Row], text: str, started: datetime, out: Path) -> list[Path]:
    """``photo-<stamp>.md`` and ``.csv`` in ``out``."""
    return report.write_named("photo", rows, text, started, out)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the server is stopped on the way out
    started = report.now()
    command = "python -m bench.photo" + ("" if not argv else " " + shlex.join(argv))
    with tempfile.TemporaryDirectory(prefix="ovserve-bench-photo-") as name:
        tmp = Path(name)
        from ovserve.server.tools.zoo.fetch import FetchError
        from ovserve.server.tools.zoo.mobilenet_v2 import write_classifier

        try:
            model_path = write_classifier(tmp / "repo", MODEL) / "model.xml"
        except FetchError as exc:
            print(f"the real MobileNetV2 cannot be had ({exc}): nothing to measure", file=sys.stderr)
            return 2
        models.with_servers_precision(MODEL, model_path)
        image, what = soak.test_image(tmp)
        config = models.write_config(tmp / "config", [MODEL], repo=tmp / "repo")
        if args.wait_quiet > 0:
            wait_quiet(10, args.wait_quiet)
        runner = Runner(args, model_path, image)
        runner.run(config)
    print()
    print(render(runner.rows, markdown=False, rounds=runner.rounds))
    if not args.no_out:
        text = document(runner.rows, command, started, args, what, runner.rounds)
        print("\nwrote " + ", ".join(map(str, write(runner.rows, text, started, args.out))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
