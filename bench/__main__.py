"""``python -m bench``: raw OpenVINO, ovserve and the KServe peer, back to back, in one run.

Order: build the models; raw in-process OpenVINO (no server running); then
ovserve alone; then the KServe peer alone. Every case is a closed loop at
each concurrency for a fixed time, its load generator in its own process.
See bench/README.md.
"""
from __future__ import annotations

import argparse
import re
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
                   help="comma-separated gRPC engines of ovserve to measure (grpcio, loop, native): the default "
                        "engine's are the ovserve rows (every protocol, `--grpc-engine auto`: what a user gets by "
                        "default), each other engine's the ovserve-<engine> rows (gRPC only, `--grpc-engine "
                        "<engine>`); default: every installed engine (native where pygrpc-native is installed)")
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

        default = default_engine()
        installed = [e for e in report.ENGINES if e != "native" or importlib.util.find_spec("pygrpc_native")]
        args.grpc_engines = ",".join([default, *(e for e in installed if e != default)])
    args.grpc_engines = [e for e in args.grpc_engines.split(",") if e]
    unknown = [e for e in args.grpc_engines if e not in report.ENGINES]
    if unknown:
        p.error(f"--grpc-engines: unknown {', '.join(unknown)}; choose from {', '.join(report.ENGINES)}")
    if args.out is None and not args.smoke:  # a smoke run's seconds-long numbers are no result to keep
        args.out = RESULTS
    if args.smoke:
        args.duration, args.warmup, args.concurrency = min(args.duration, 0.5), 0.2, "1"
        args.no_peer, args.wait_quiet = True, 0
        args.models = ",".join(m for m in args.models.split(",") if m != "mobilenet_v2")
    return args


def default_engine() -> str:
    """The gRPC engine ``ovserve serve`` runs by default (``--grpc-engine auto``), by the server's own rule."""
    from ovserve.server.transports.grpc.listener import choose_engine

    return choose_engine("auto")[0]


#: The line each gRPC listener logs at start, e.g. ``gRPC engine: loop (h2 4.4.1), for grpc (auto)``.
ENGINE_LINE = r"gRPC engine: (\w+) .*, for grpc \(([^)]*)\)"


def logged_engine(line: str) -> tuple[str, str]:
    """(engine, why) from a listener's ``gRPC engine:`` line: ``("loop", "auto")``."""
    m = re.search(ENGINE_LINE, line)
    if m is None:
        raise ValueError(f"not a gRPC engine line: {line!r}")
    return m.group(1), m.group(2)


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
        self.engines: dict[str, str] = {}  # server -> its gRPC engine as its log said, e.g. "loop (auto)"

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
        print(f"  {row.server:14} {row.model:13} {row.protocol:11} c{row.concurrency:<3} {row.throughput:8.0f}/s "
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

    def served(self, start: Callable[[list[str]], servers.ServerProcess], protocols: list[str] | None = None,
               engine: str | None = None) -> None:
        """``start``'s server over ``protocols`` (default: every one asked); with ``engine``, its gRPC listener
        must log that engine, so that its rows' label says what served them."""
        protocols = self.protocols if protocols is None else [p for p in self.protocols if p in protocols]
        if not protocols:
            return
        self.idle_rss(start)
        with start(self.names) as server:
            server.wait_ready(self.names)
            if server.name.startswith("ovserve"):  # not the peer
                self.check_engine(server, engine)
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

    def check_engine(self, server: servers.ServerProcess, engine: str | None) -> None:
        """Record the gRPC engine ``server`` logged; refuse to measure it under another engine's label."""
        served, why = logged_engine(server.wait_log(ENGINE_LINE))
        self.engines[server.name] = f"{served} ({why})"
        if engine is not None and served != engine:
            raise RuntimeError(f"{server.name}'s rows are {engine}'s, but it serves gRPC on {served} ({why}); "
                               "--grpc-engines chooses the engines, not --ovserve-arg")

    def batched(self, start: Callable[[list[str], list[str]], servers.ServerProcess], engine: str) -> None:
        """Dynamic batching rows: add and resnetish at the highest concurrency, their own server (gRPC on
        ``engine``, the default)."""
        names = [n for n in ("add", "resnetish") if n in self.names]
        c = max(self.concurrency)
        if not names or c < 2 or self.args.batch_delay_us <= 0:
            return
        flags = ["--max-batch-size", str(c), "--max-queue-delay-us", str(self.args.batch_delay_us)]
        with start(names, flags) as server:
            server.wait_ready(names)
            self.check_engine(server, engine)
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

        default = default_engine()

        def ovserve(names: list[str]) -> servers.ServerProcess:
            # the ovserve rows are what a user gets by default: `auto` named (OVSERVE_GRPC_ENGINE cannot change it),
            # last (nor can --ovserve-arg); each other engine's are the ovserve-<engine> rows
            return servers.start_ovserve(ovserve_config(names), [*args.ovserve_arg, "--grpc-engine", "auto"])

        def kserve(names: list[str]) -> servers.ServerProcess:
            return peer.start({n: {"path": str(paths[n]), "plugin_config": specs.SPECS[n].plugin_config}
                               for n in names})

        background = wait_quiet(10, args.wait_quiet) if args.wait_quiet > 0 else 0.0
        if not args.no_raw:
            bench.raw()
        if not args.no_ovserve and default in args.grpc_engines:
            bench.served(ovserve, engine=default)
        for engine in args.grpc_engines:  # the other engines' gRPC rows: ovserve-<engine>
            if args.no_ovserve or engine == default:
                continue

            def ovserve_on(names: list[str], engine: str = engine) -> servers.ServerProcess:
                return servers.start_ovserve(ovserve_config(names), [*args.ovserve_arg, "--grpc-engine", engine],
                                             name=report.engine_server(engine, default))

            bench.served(ovserve_on, ["grpc"], engine=engine)
        if not args.no_ovserve:

            def ovserve_batch(names: list[str], flags: list[str]) -> servers.ServerProcess:
                folder = Path(tmp) / "configs" / ("batch-" + ",".join(names))
                config = models.write_config(folder, names, repo=Path(tmp))
                return servers.start_ovserve(config, [*args.ovserve_arg, *flags, "--grpc-engine", "auto"],
                                             name="ovserve-batch")

            bench.batched(ovserve_batch, default)
        if not args.no_peer:
            peer.ensure_venv()
            versions.update({f"peer {k}": v for k, v in peer.versions().items()})
            bench.served(kserve)
    versions = {**local_versions(), **versions}
    run = report.Run(bench.rows, bench.idle, bench.names, command, started, versions, args.duration, background,
                     bench.idle_all, specs.hints(), bench.engines)
    print()
    print(report.render(run, markdown=False))
    if args.out is not None:
        written = report.write_outputs(run, args.out)
        print("\nwrote " + ", ".join(str(p) for p in written))
    else:
        print("\n--smoke: nothing written (--out DIR keeps the run's files)")
    return 0


def local_versions() -> dict[str, str]:
    return report.installed("ovserve", "openvino", "grpcio", "h2", "pygrpc-native", "uvicorn", "protobuf")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
