"""``python -m bench``: raw OpenVINO, ovserve and the KServe peer, back to back, in one run.

Order: build the models; raw in-process OpenVINO (no server running); then
ovserve alone; then the KServe peer alone. Every case is a closed loop at
each concurrency for a fixed time, its load generator in its own process.
See bench/README.md.
"""
from __future__ import annotations

import argparse
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from . import models, peer, report, servers, specs
from .loadgen import Case
from .measure import RESULTS, Row, run_quietest, wait_quiet

PROTOCOLS = ("grpc", "rest-json", "rest-binary")
#: Where a run is written by default: one file per run, cited by docs/performance.md.
SETTLE = 2.0  # seconds a server idles after loading before its idle RSS is read


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true",
                   help="seconds-long check: add and resnetish, concurrency 1, no peer; writes files only with --out")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per case")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each case")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated in-flight requests")
    p.add_argument("--models", default="add,resnetish,mobilenet_v2",
                   help="comma-separated; mobilenet_v2 when available")
    p.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma-separated subset of " + ",".join(PROTOCOLS))
    p.add_argument("--no-raw", action="store_true", help="skip raw OpenVINO")
    p.add_argument("--no-ovserve", action="store_true", help="skip ovserve")
    p.add_argument("--no-peer", action="store_true", help="skip the KServe peer (and its virtualenv)")
    p.add_argument("--hint", choices=["LATENCY", "THROUGHPUT"], default=None,
                   help="PERFORMANCE_HINT for every model (default: each model's own, in bench/specs.py); "
                        "every runner compiles a model alike")
    p.add_argument("--grpc-client", choices=["h2", "aio"], default=None,
                   help="h2 (default when hpack is installed): the bench's light HTTP/2 client; "
                        "aio: grpcio's own (dearer per call)")
    p.add_argument("--batch-delay-us", type=int, default=2000, metavar="US",
                   help="max_queue_delay_us of the dynamic-batching rows (ovserve-batch: add and resnetish at the "
                        "highest concurrency, max_batch_size = that concurrency); 0 skips them")
    p.add_argument("--grpc-engines", default=None, metavar="LIST",
                   help="comma-separated gRPC engines of ovserve to measure: grpcio (the ovserve rows, every "
                        "protocol, `--grpc-engine grpcio`, what the default `auto` serves), native (ovserve-native "
                        "rows: gRPC only, `--grpc-engine native`) and loop (ovserve-loop rows: gRPC only, "
                        "`--grpc-engine loop`); "
                        "default: all three (native where pygrpc-native is installed)")
    p.add_argument("--ovserve-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `ovserve serve` (repeatable)")
    p.add_argument("--wait-quiet", type=float, default=120, metavar="SECONDS",
                   help="wait up to this long for other processes to leave the CPU alone before starting")
    p.add_argument("--max-noise", type=float, default=15, metavar="PCT",
                   help="rerun a case (after waiting for quiet, at most twice) when other processes used "
                        "more than PCT %% of a core during it")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="where the run's <YYYYMMDD-HHMM>.md, latest.md and CSV go (default: bench/results; "
                        "with --smoke, nowhere unless given)")
    args = p.parse_args(argv)
    if args.grpc_client is None:
        import importlib.util

        if importlib.util.find_spec("hpack") is not None:  # the h2 client's only extra dependency
            args.grpc_client = "h2"
        else:
            print("hpack is not installed (pip install -e '.[bench]'): gRPC load from grpc.aio, "
                  "which costs the client more CPU per call", flush=True)
            args.grpc_client = "aio"
    if args.grpc_engines is None:
        import importlib.util

        args.grpc_engines = "grpcio,native,loop" if importlib.util.find_spec("pygrpc_native") else "grpcio,loop"
    args.grpc_engines = [e for e in args.grpc_engines.split(",") if e]
    if args.out is None and not args.smoke:  # a smoke run's seconds-long numbers are no result to keep
        args.out = RESULTS
    if args.smoke:
        args.duration, args.warmup, args.concurrency = min(args.duration, 0.5), 0.2, "1"
        args.no_peer, args.wait_quiet = True, 0
        args.models = ",".join(m for m in args.models.split(",") if m != "mobilenet_v2")
    return args


class Bench:
    def __init__(self, args: argparse.Namespace, paths: dict[str, Path]) -> None:
        self.args = args
        self.paths = paths
        self.names = [m for m in args.models.split(",") if m in paths]
        self.concurrency = [int(c) for c in args.concurrency.split(",")]
        self.protocols = [p for p in args.protocols.split(",") if p in PROTOCOLS]
        self.rows: list[Row] = []
        self.idle: dict[str, float] = {}  # server -> MiB with add and resnetish loaded
        self.idle_all: dict[str, float] = {}  # server -> MiB with every benchmarked model loaded

    def case(self, kind: str, model: str, c: int, **kw: object) -> Case:
        a = self.args
        return Case(kind, model, c, a.duration, a.warmup, grpc_client=a.grpc_client, **kw)  # type: ignore[arg-type]

    def measure(self, case: Case, server: str, pid: int | None) -> None:
        """Run a case; rerun it when the rest of the machine was busy meanwhile, keep the quietest."""
        self.record(run_quietest(case, server, pid, self.args.max_noise, self.args.wait_quiet,
                                 lambda line: print(line, flush=True)))

    def record(self, row: Row) -> None:
        self.rows.append(row)
        cpu = "" if row.client_cpu_pct is None else f" client CPU {row.client_cpu_pct:.0f}%"
        err = f" ({row.first_error[:160]})" if row.first_error else ""
        print(f"  {row.server:8} {row.model:13} {row.protocol:11} c{row.concurrency:<3} {row.throughput:8.0f}/s "
              f"p50 {row.p50_ms:8.2f} ms  p99 {row.p99_ms:8.2f} ms  errors {row.errors}  "
              f"server CPU {row.server_cpu_pct:.0f}%{cpu} other {row.other_cpu_pct:.0f}%{err}", flush=True)

    def raw(self) -> None:
        print("raw OpenVINO, in process", flush=True)
        for name in self.names:
            for kind in ("raw-sync", "raw-async"):
                for c in self.concurrency:
                    case = self.case(kind, name, c, model_path=str(self.paths[name]),
                                     plugin_config=specs.SPECS[name].plugin_config)
                    self.measure(case, "raw", None)

    def idle_rss(self, start: Callable[[list[str]], servers.ServerProcess]) -> None:
        """Idle RSS with exactly add and resnetish loaded (issue 4's definition), in a server of its own."""
        if not {"add", "resnetish"} < set(self.names):
            return  # exactly those two (or not both): the main server's reading is the one
        with start(["add", "resnetish"]) as server:
            server.wait_ready(["add", "resnetish"])
            time.sleep(SETTLE)
            self.idle[server.name] = server.rss_bytes() / 2**20
        print(f"{server.name}: idle RSS with add and resnetish loaded {self.idle[server.name]:.0f} MiB", flush=True)

    def served(self, start: Callable[[list[str]], servers.ServerProcess], protocols: list[str] | None = None) -> None:
        protocols = self.protocols if protocols is None else [p for p in self.protocols if p in protocols]
        if not protocols:
            return
        self.idle_rss(start)
        with start(self.names) as server:
            server.wait_ready(self.names)
            time.sleep(SETTLE)
            self.idle_all[server.name] = server.rss_bytes() / 2**20
            if set(self.names) == {"add", "resnetish"}:
                self.idle[server.name] = self.idle_all[server.name]
            print(f"{server.name}: pid {server.proc.pid}, REST {server.rest_port}, gRPC {server.grpc_port}, "
                  f"idle RSS with {', '.join(self.names)} loaded {self.idle_all[server.name]:.0f} MiB", flush=True)
            for name in self.names:
                for protocol in protocols:
                    port = server.port_for(protocol)
                    for c in self.concurrency:
                        self.measure(self.case(protocol, name, c, port=port), server.name, server.proc.pid)
            if server.proc.poll() is not None:
                raise RuntimeError(f"{server.name} died during the run:\n{server.log}")

    def batched(self, start: Callable[[list[str], list[str]], servers.ServerProcess]) -> None:
        """Dynamic batching rows: add and resnetish at the highest concurrency, their own server."""
        names = [n for n in ("add", "resnetish") if n in self.names]
        c = max(self.concurrency)
        if not names or c < 2 or self.args.batch_delay_us <= 0:
            return
        flags = ["--max-batch-size", str(c), "--max-queue-delay-us", str(self.args.batch_delay_us)]
        with start(names, flags) as server:
            server.wait_ready(names)
            print(f"{server.name}: {' '.join(flags)}", flush=True)
            for name in names:
                for protocol in self.protocols:
                    port = server.port_for(protocol)
                    self.measure(self.case(protocol, name, c, port=port), server.name, server.proc.pid)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so every server and load generator is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    specs.with_hint(args.hint)
    started = report.now()
    command = "python -m bench" + ("" if not argv else " " + shlex.join(argv))
    versions: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="ovserve-bench-") as tmp:
        want_mobilenet = "mobilenet_v2" in args.models.split(",")
        paths = models.build_repository(Path(tmp), mobilenet=want_mobilenet)
        bench = Bench(args, paths)
        print(f"models: {', '.join(bench.names)} (resnetish: {models.resnetish_flops() / 1e9:.2f} GFLOP); "
              f"{args.duration:g} s per case; concurrency {args.concurrency}; properties: {specs.hints()}; "
              f"gRPC client {args.grpc_client}", flush=True)
        configs = {}  # the ovserve config.json serving each set of models

        def ovserve_config(names: list[str]) -> Path:
            key = ",".join(names)
            if key not in configs:
                configs[key] = models.write_config(Path(tmp) / "configs" / key, names, repo=Path(tmp))
            return configs[key]

        def ovserve(names: list[str]) -> servers.ServerProcess:
            # grpcio named: the default engine (auto: grpcio, since 2026-12-05), whose rows these have been since
            # the first run; the experimental engines' are the ovserve-loop and ovserve-native rows
            return servers.start_ovserve(ovserve_config(names), ["--grpc-engine", "grpcio", *args.ovserve_arg])

        def kserve(names: list[str]) -> servers.ServerProcess:
            return peer.start({n: {"path": str(paths[n]), "plugin_config": specs.SPECS[n].plugin_config}
                               for n in names})

        background = wait_quiet(10, args.wait_quiet) if args.wait_quiet > 0 else 0.0
        if not args.no_raw:
            bench.raw()
        if not args.no_ovserve and "grpcio" in args.grpc_engines:
            bench.served(ovserve)
        for engine in ("native", "loop"):  # the other engines' gRPC rows, under their report labels
            if args.no_ovserve or engine not in args.grpc_engines:
                continue

            def ovserve_on(names: list[str], engine: str = engine) -> servers.ServerProcess:
                return servers.start_ovserve(ovserve_config(names), [*args.ovserve_arg, "--grpc-engine", engine],
                                             name=report.GRPC_ENGINES[engine])

            bench.served(ovserve_on, ["grpc"])
        if not args.no_ovserve:

            def ovserve_batch(names: list[str], flags: list[str]) -> servers.ServerProcess:
                folder = Path(tmp) / "configs" / ("batch-" + ",".join(names))
                config = models.write_config(folder, names, repo=Path(tmp))
                return servers.start_ovserve(config, [*args.ovserve_arg, *flags], name="ovserve-batch")

            bench.batched(ovserve_batch)
        if not args.no_peer:
            peer.ensure_venv()
            versions.update({f"peer {k}": v for k, v in peer.versions().items()})
            bench.served(kserve)
    versions = {**local_versions(), **versions}
    run = report.Run(bench.rows, bench.idle, bench.names, command, started, versions, args.duration, background,
                     bench.idle_all, specs.hints())
    print()
    print(report.render(run, markdown=False))
    if args.out is not None:
        written = report.write_outputs(run, args.out)
        print("\nwrote " + ", ".join(str(p) for p in written))
    else:
        print("\n--smoke: nothing written (--out DIR keeps the run's files)")
    return 0


def local_versions() -> dict[str, str]:
    return report.installed("ovserve", "openvino", "grpcio", "pygrpc-native", "uvicorn", "protobuf")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
