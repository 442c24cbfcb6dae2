"""``python -m bench.torchserve``: a JPEG to the real MobileNetV2 through TorchServe's gRPC Predictions, three ways.

In one run, back to back, each a closed loop at each concurrency (1, 4, 16)
through the same load generator and HTTP/2 client (:mod:`bench.loadgen`):

1. **ovserve, TorchServe API**: ``Predictions`` on ``--ts-inference-port``; the
   built-in ``image_classifier`` decodes the JPEG, runs the model and answers
   TorchServe's top 5 as JSON;
2. **ovserve, KServe V2 gRPC**: the same photo as a BYTES input to
   ``ModelInfer`` on the same server (decode and resize in the server, the
   logits back); rows 1 and 2 alternate at each concurrency;
3. **ovserve, a custom handler** (``bench/ov_handler.py``, the same work as
   TorchServe's handler below, the model through ``context.model``), registered
   with RegisterModel, once in worker processes (``--ts-workers process``, the
   default) and once in threads (``--ts-workers thread``), each on a server of
   its own (issue 34: what isolating a handler costs);
4. **TorchServe 0.12**: its Java frontend and Python workers running the same
   OpenVINO IR through ``bench/ts_handler.py`` (:mod:`bench.ts_peer`: its own
   virtualenv, a JDK, the archive, the configuration).

The run's table and the issue's two goals (ovserve's TorchServe API within 10%
of its own V2 gRPC; at least 3x TorchServe's throughput at concurrency 4) are
printed and written to ``bench/results/torchserve-<YYYYMMDD-HHMM>.md``, with issue 34's (a custom
handler in worker processes at least 2x TorchServe at concurrency 4). Before
any load, one request to each server checks that both answer the same top 5.
See bench/README.md, "TorchServe".
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from . import models, report, servers, soak, specs, ts_peer
from .loadgen import Case
from .measure import RESULTS, ROOT, Row, add_run_options, run_quietest, wait_quiet

MODEL = ts_peer.MODEL
#: the custom handler's model, registered from a folder in the model store
CUSTOM = f"{MODEL}_custom"
HANDLER = Path(__file__).with_name("ov_handler.py")
#: the custom handler's rows: server name by --ts-workers mode
CUSTOM_SERVERS = {"process": "ovserve-process", "thread": "ovserve-thread"}
#: (server, kind) of each row, in the table's order, and what it is called there
APIS = {("ovserve", "ts-grpc"): "TorchServe gRPC Predictions",
        ("ovserve", "grpc"): "KServe V2 gRPC ModelInfer (BYTES)",
        ("ovserve-process", "ts-grpc"): "TorchServe gRPC, custom handler in worker processes",
        ("ovserve-thread", "ts-grpc"): "TorchServe gRPC, custom handler in threads",
        ("torchserve", "ts-grpc"): "TorchServe gRPC Predictions"}
SAME_ANSWER = 0.02  # largest difference of a top-5 probability between the servers taken for the same answer


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.torchserve", description=__doc__.splitlines()[0])
    add_run_options(p, "torchserve", RESULTS)
    p.add_argument("--no-torchserve", action="store_true",
                   help="ovserve's rows only (no TorchServe, no virtualenv, no JDK)")
    p.add_argument("--ts-workers", type=int, default=2,
                   help="TorchServe workers; each runs OpenVINO on cores/workers threads (default 2: one per core)")
    p.add_argument("--ts-batch-size", type=int, default=1, help="TorchServe's batchSize (1: no batching)")
    p.add_argument("--ts-batch-delay-ms", type=int, default=5, help="TorchServe's maxBatchDelay when batching")
    p.add_argument("--custom", default="process,thread",
                   help="the custom handler's rows: comma-separated --ts-workers modes (process, thread; empty: none)")
    p.add_argument("--custom-workers", type=int, default=4,
                   help="ovserve's workers for the custom handler (default 4: twice the model's infer requests, as a "
                        "repository model gets)")
    p.add_argument("--grpc-client", choices=["h2", "aio"], default="h2",
                   help="h2: the bench's light HTTP/2 client (default); aio: grpcio's own")
    return p.parse_args(argv)


@dataclass
class Setup:
    """What the run found out besides the rows: installs, answers, the tuning, versions."""

    image: str = ""
    tuning: str = ""
    installs: list[str] = field(default_factory=list)
    answers: dict[str, dict[str, float]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def predict_once(port: int, image: bytes, model: str = MODEL) -> dict[str, float]:
    """One Predictions through grpcio (messages from the project's copy of TorchServe's inference.proto)."""
    import grpc

    # the client's private descriptor pool: this process may also hold a TorchServe user's own stubs
    from ovserve.client.proto import ts_inference as pb

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        predictions = channel.unary_unary("/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions",
                                          request_serializer=pb.PredictionsRequest.SerializeToString,
                                          response_deserializer=pb.PredictionResponse.FromString)
        reply = predictions(pb.PredictionsRequest(model_name=model, input={"data": image}), timeout=60)
    top: dict[str, float] = json.loads(reply.prediction)
    return top


def same_answer(a: dict[str, float], b: dict[str, float]) -> tuple[bool, float]:
    """Whether two top 5 name the same classes in the same order; the largest probability difference."""
    diff = max((abs(a[k] - b[k]) for k in a if k in b), default=1.0)
    return list(a) == list(b) and diff <= SAME_ANSWER, diff


class Runner:
    def __init__(self, args: argparse.Namespace, log: Callable[[str], None] = print) -> None:
        self.args = args
        self.log = log
        self.rows: list[Row] = []
        self.concurrency = [int(c) for c in args.concurrency.split(",") if c]

    def case(self, kind: str, c: int, port: int, image: Path, model: str = MODEL) -> Case:
        a = self.args
        return Case(kind, model, c, a.duration, a.warmup, port=port, grpc_client=a.grpc_client, image=str(image))

    def measure(self, case: Case, server: str, pid: int) -> None:
        """Run a case; rerun it when the rest of the machine was busy meanwhile, keep the quietest."""
        row = run_quietest(case, server, pid, self.args.max_noise, self.args.wait_quiet, self.log)
        self.rows.append(row)
        err = f" ({row.first_error[:160]})" if row.first_error else ""
        self.log(f"  {server:10} {case.kind:8} c{case.concurrency:<3} {row.throughput:7.0f}/s  p50 {row.p50_ms:7.2f} ms"
                 f"  p99 {row.p99_ms:7.2f} ms  errors {row.errors}  server CPU {row.server_cpu_pct:.0f}%"
                 f"  other {row.other_cpu_pct:.0f}%{err}")

    def ovserve(self, config: Path, image: Path, setup: Setup) -> None:
        extra = ["--ts-inference-port", "0", *self.args.ovserve_arg]
        with servers.start_ovserve(config, extra) as server:
            server.wait_ready([MODEL])
            port = server.ports.get("ts-inference")
            if not port:
                raise RuntimeError(f"ovserve announced no ts-inference listener:\n{server.log}")
            setup.answers["ovserve"] = predict_once(port, image.read_bytes())
            self.log(f"ovserve: pid {server.pid}, TorchServe gRPC {port}, KServe gRPC {server.grpc_port}")
            for c in self.concurrency:  # the two APIs alternate, so a slow spell of the machine hits both
                self.measure(self.case("ts-grpc", c, port, image), "ovserve", server.pid)
                self.measure(self.case("grpc", c, server.grpc_port, image), "ovserve", server.pid)
            if not server.alive():
                raise RuntimeError(f"ovserve died during the run:\n{server.log}")

    def custom(self, mode: str, config: Path, model_dir: Path, tmp: Path, image: Path, setup: Setup) -> None:
        """The custom handler, registered as a TorchServe user registers theirs, its workers in ``mode``."""
        import grpc

        from ovserve.client.proto import ts_management as mpb

        store = tmp / "store"
        folder = store / CUSTOM
        if not folder.exists():
            shutil.copytree(model_dir, folder)
            shutil.copy(HANDLER, folder / HANDLER.name)
        plugin = json.dumps(specs.SPECS[MODEL].plugin_config)
        extra = ["--ts-inference-port", "0", "--ts-management-port", "0", "--model-store", str(store),
                 "--ts-model-api", "--ts-workers", mode, "--plugin-config", plugin, *self.args.ovserve_arg]
        server_name = CUSTOM_SERVERS[mode]
        with servers.start_ovserve(config, extra, name=server_name) as server:
            server.wait_ready([MODEL])
            with grpc.insecure_channel(f"127.0.0.1:{server.ports.get('ts-management')}") as channel:
                register = channel.unary_unary(
                    "/org.pytorch.serve.grpc.management.ManagementAPIsService/RegisterModel",
                    request_serializer=mpb.RegisterModelRequest.SerializeToString,
                    response_deserializer=mpb.ManagementResponse.FromString)
                register(mpb.RegisterModelRequest(url=CUSTOM, handler=HANDLER.name, synchronous=True,
                                                  initial_workers=self.args.custom_workers), timeout=120)
            port = server.ports.get("ts-inference")
            setup.answers[server_name] = predict_once(port, image.read_bytes(), CUSTOM)
            self.log(f"{server_name}: pid {server.pid}, TorchServe gRPC {port}, {self.args.custom_workers} "
                     f"custom-handler workers (--ts-workers {mode})")
            for c in self.concurrency:
                self.measure(self.case("ts-grpc", c, port, image, CUSTOM), server_name, server.pid)
            if not server.alive():
                raise RuntimeError(f"ovserve ({mode}) died during the run:\n{server.log}")

    def torchserve(self, model_dir: Path, tmp: Path, image: Path, setup: Setup) -> None:
        exe, java_s = ts_peer.ensure_java(self.log)
        _, venv_s = ts_peer.ensure_venv(self.log)
        setup.installs.append(f"java: {exe}" + (f" (installed in {java_s:.0f} s)" if java_s else " (found)"))
        setup.installs.append(f"TorchServe's virtualenv {ts_peer.VENV.relative_to(ROOT)}: "
                              f"{ts_peer.venv_size_mib():.0f} MiB"
                              + (f" (installed in {venv_s:.0f} s)" if venv_s else " (found)"))
        setup.versions.update(ts_peer.versions())
        a = self.args
        tuning = ts_peer.Tuning(a.ts_workers, a.ts_batch_size, a.ts_batch_delay_ms)
        setup.tuning = tuning.describe()
        t0 = time.monotonic()
        with ts_peer.start(model_dir, tmp / "torchserve", tuning) as ts:
            ts.wait_workers(tuning.workers)
            setup.notes.append(f"TorchServe: archive built and {tuning.workers} workers READY in "
                               f"{time.monotonic() - t0:.0f} s")
            setup.answers["torchserve"] = predict_once(ts.grpc_port, image.read_bytes())
            self.log(f"torchserve: pid {ts.pid}, gRPC {ts.grpc_port}; {setup.tuning}")
            for c in self.concurrency:
                self.measure(self.case("ts-grpc", c, ts.grpc_port, image), "torchserve", ts.pid)
            if not ts.alive():
                raise RuntimeError(f"TorchServe died during the run:\n{ts.log}")


# -- the results -------------------------------------------------------------------------------
HEADER = ["server", "API", "conc", "infer/s", "p50 ms", "p99 ms", "errors", "server CPU %", "server CPU us/infer",
          "server RSS MiB", "client CPU %", "other CPU %"]


def _find(rows: list[Row], server: str, kind: str, c: int) -> Row | None:
    return next((r for r in rows if (r.server, r.protocol, r.concurrency) == (server, kind, c) and r.count), None)


def table(rows: list[Row]) -> list[list[str]]:
    order = list(APIS)
    out = []
    for r in sorted(rows, key=lambda r: (order.index((r.server, r.protocol)), r.concurrency)):
        us = 1e4 * r.server_cpu_pct / r.throughput if r.throughput else None
        out.append([r.server, APIS[(r.server, r.protocol)], str(r.concurrency), f"{r.throughput:.0f}",
                    f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}", str(r.errors), f"{r.server_cpu_pct:.0f}",
                    "n/a" if us is None else f"{us:.0f}", f"{r.server_rss_mib:.0f}",
                    "-" if r.client_cpu_pct is None else f"{r.client_cpu_pct:.0f}",
                    f"{r.other_cpu_pct:.0f}" + (" !" if r.other_cpu_pct > report.NOISY_PCT else "")])
    return out


def _per_s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}/s"


def targets(rows: list[Row], concurrency: list[int]) -> list[report.Target]:
    """The issue's goals: ovserve's TorchServe API within 10% of its V2 gRPC (at each concurrency) and 3x
    TorchServe's throughput at concurrency 4."""
    out: list[report.Target] = []

    def ratio(case: str, a: Row | None, b: Row | None, goal: float, against: str) -> None:
        x, y = (a.throughput if a else None), (b.throughput if b else None)
        v = x / y if x is not None and y else None
        out.append(report.Target(case, f"{_per_s(x)} vs {_per_s(y)} {against}", f">= {goal} x", v,
                                 None if v is None else v >= goal))

    for c in concurrency:
        ratio(f"ovserve TorchServe API / its V2 gRPC, c{c}", _find(rows, "ovserve", "ts-grpc", c),
              _find(rows, "ovserve", "grpc", c), 0.9, "V2 gRPC")
    ratio("ovserve TorchServe API / TorchServe, c4", _find(rows, "ovserve", "ts-grpc", 4),
          _find(rows, "torchserve", "ts-grpc", 4), 3, "TorchServe")
    # issue 34: a custom handler in worker processes, against TorchServe and against the same handler in threads
    ratio("ovserve custom handler in processes / TorchServe, c4", _find(rows, "ovserve-process", "ts-grpc", 4),
          _find(rows, "torchserve", "ts-grpc", 4), 2, "TorchServe")
    for c in concurrency:
        ratio(f"custom handler in processes / in threads, c{c}", _find(rows, "ovserve-process", "ts-grpc", c),
              _find(rows, "ovserve-thread", "ts-grpc", c), 0.9, "threads")
    return out


def answers_text(setup: Setup) -> list[str]:
    lines = [f"- {server}'s answer: " + ", ".join(f"{k} {v:.4f}" for k, v in top.items())
             for server, top in setup.answers.items()]
    if {"ovserve", "torchserve"} <= set(setup.answers):
        same, diff = same_answer(setup.answers["ovserve"], setup.answers["torchserve"])
        lines.append(f"- the same answer from both: {'yes' if same else '**no**'} "
                     f"(same classes in the same order, largest probability difference {diff:.4f})")
    for custom in CUSTOM_SERVERS.values():
        if {"ovserve", custom} <= set(setup.answers):
            same, diff = same_answer(setup.answers["ovserve"], setup.answers[custom])
            lines.append(f"- {custom}'s custom handler answers as the built-in: {'yes' if same else '**no**'} "
                         f"(largest probability difference {diff:.4f})")
    return lines


def render(rows: list[Row], setup: Setup, concurrency: list[int], markdown: bool) -> str:
    t = report.markdown_table if markdown else report.text_table
    t_header, t_body = report.targets_table(targets(rows, concurrency))
    noisy = any(r.other_cpu_pct > report.NOISY_PCT for r in rows)
    return "\n".join([
        t(HEADER, table(rows)),
        "",
        *([f"`!`: other processes took more than {report.NOISY_PCT}% of a core during the case (after reruns)."]
          if noisy else []),
        "Targets (issues 17 and 34):" + ("\n" if markdown else ""),
        t(t_header, t_body),
    ])


def document(rows: list[Row], setup: Setup, command: str, started: datetime, args: argparse.Namespace,
             concurrency: list[int]) -> str:
    m = report.machine()
    versions = ", ".join(f"{k} {v}" for k, v in setup.versions.items())
    return "\n".join([
        f"# TorchServe gRPC API benchmark, {started.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['os']}; Python {m['python']}",
        f"- software: {versions}",
        (f"- command: `{command}` ({args.duration:g} s per case after {args.warmup:g} s of warm-up, closed loop, "
         f"127.0.0.1, gRPC client {args.grpc_client})"),
        (f"- model: the real MobileNetV2 (ovserve.server.tools.zoo); ovserve compiles it with "
         f"{' '.join(f'{k}={v}' for k, v in specs.SPECS[MODEL].plugin_config.items())} (bench/specs.py)"
         + (f"; TorchServe: {setup.tuning}" if setup.tuning else "")),
        f"- image: {setup.image}",
        *[f"- {line}" for line in setup.installs + setup.notes],
        *answers_text(setup),
        "",
        render(rows, setup, concurrency, markdown=True),
        "",
    ])


def write(rows: list[Row], text: str, started: datetime, out: Path) -> list[Path]:
    """``torchserve-<stamp>.md`` and ``.csv`` in ``out``."""
    return report.write_named("torchserve", rows, text, started, out)


def local_versions() -> dict[str, str]:
    return report.installed("ovserve", "openvino", "grpcio", "opencv-python-headless")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every server is stopped on the way out
    started = report.now()
    command = "python -m bench.torchserve" + ("" if not argv else " " + shlex.join(argv))
    runner = Runner(args)
    setup = Setup(versions=local_versions())
    with tempfile.TemporaryDirectory(prefix="ovserve-bench-ts-") as name:
        tmp = Path(name)
        from ovserve.server.tools.zoo.fetch import FetchError
        from ovserve.server.tools.zoo.mobilenet_v2 import write_classifier

        try:
            model_dir = write_classifier(tmp / "repo", MODEL)
        except FetchError as exc:
            print(f"the real MobileNetV2 cannot be had ({exc}): nothing to measure", file=sys.stderr)
            return 2
        image, setup.image = soak.test_image(tmp)
        config = models.write_config(tmp / "config", [MODEL], repo=tmp / "repo")
        if args.wait_quiet > 0:
            wait_quiet(10, args.wait_quiet)
        runner.ovserve(config, image, setup)
        for mode in [m for m in args.custom.split(",") if m]:
            runner.custom(mode, config, model_dir, tmp, image, setup)
        if not args.no_torchserve:
            runner.torchserve(model_dir, tmp, image, setup)
    print()
    print(render(runner.rows, setup, runner.concurrency, markdown=False))
    for line in answers_text(setup):
        print(line.removeprefix("- "))
    if not args.no_out:
        text = document(runner.rows, setup, command, started, args, runner.concurrency)
        print("\nwrote " + ", ".join(map(str, write(runner.rows, text, started, args.out))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
