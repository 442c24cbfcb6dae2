"""``python -m bench.metrics_cost``: what Prometheus metrics cost (issue 19: at most 3% throughput; idle
RSS with metrics off unchanged).

The ``add`` model (the smallest, where per-request bookkeeping weighs the most) over gRPC and REST at one
concurrency, in a server with ``--metrics-enable`` and in one without, alternated round by round (off
first, then on first) so that drift on a shared machine falls on both alike; medians per case. Idle
RSS is read from each server before any request. With metrics on, /metrics is scraped once per round
(the counts must match the requests answered: the hooks ran). Prints one table; ``--out DIR`` writes it as
``metrics-<YYYYMMDD-HHMMSS>.md`` too.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from . import models, report, servers
from .loadgen import Case
from .measure import run_case, wait_quiet
from .specs import spec_of

SETTLE = 2.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.metrics_cost", description=__doc__.splitlines()[0])
    p.add_argument("--protocols", default="grpc,rest-binary,rest-json", help="comma-separated")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per case")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3, help="off/on pairs, the order alternating")
    p.add_argument("--wait-quiet", type=float, default=60, metavar="SECONDS")
    p.add_argument("--no-paths", dest="paths", action="store_false",
                   help="skip the in-process A/B of the request paths")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="also write the table there")
    return p.parse_args(argv)


def hook_cost_us(n: int = 200_000) -> float:
    """Microseconds the metrics add to one answered inference, in process: the request-outcome hook
    (a request without a version, resolved from the cache), the wait and the inference observations."""
    from ovserve.server.metrics import calls
    from ovserve.server.metrics.registry import Metrics

    metrics = Metrics(calls=calls.REST_CALLS + calls.GRPC_CALLS)
    series = metrics.version("add", "1")
    metrics.resolve = lambda name, version: "1"
    done, call, clock = metrics.done, calls.GRPC_INFER, time.perf_counter
    started = time.perf_counter()
    for _ in range(n):
        t = clock()
        series.waited(clock() - t)
        series.inferred(0.00012)
        done(call, "add", "", True, t)
    return (time.perf_counter() - started) / n * 1e6


async def _paths(repo: Path, blocks: int, per_block: int) -> dict[str, tuple[float, float]]:
    """Microseconds per request of ovserve's own request paths, in process, metrics off and on: the KServe
    gRPC servicer's ModelInfer (protobuf in and out, the decorators, the data plane, OpenVINO) and the REST
    app's V2 infer (the ASGI app from the first byte of the body to the last of the answer). Off and on
    alternate block by block on one server, so that the machine's drift falls on both alike; the
    median block of each."""
    import numpy as np

    from ovserve.common.proto import grpc_predict_v2_pb2 as pb
    from ovserve.server.metrics import calls
    from ovserve.server.metrics.registry import Metrics
    from ovserve.server.model_server import ModelServer
    from ovserve.server.repository.config import SingleModelSource
    from ovserve.server.repository.manager import ModelManager
    from ovserve.server.runtime.loading import LoadOptions
    from ovserve.server.transports.grpc_v2.servicer import InferenceServicer
    from ovserve.server.transports.rest.app import create_app

    options = LoadOptions(plugin_config=dict(spec_of("add").plugin_config))
    metrics = Metrics(calls=calls.REST_CALLS + calls.GRPC_CALLS)
    server = ModelServer(ModelManager(SingleModelSource("add", repo / "add", options), poll_interval=0),
                         metrics=metrics)
    await server.start()
    model = server.manager.version("add").model
    assert model is not None
    assert model.metrics is not None
    series = model.metrics
    grpc_on = InferenceServicer(server)
    rest_on = create_app(server, 1 << 20)
    server.metrics = None
    grpc_off = InferenceServicer(server)
    rest_off = create_app(server, 1 << 20)
    server.metrics = metrics

    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    request = pb.ModelInferRequest(model_name="add", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[1, 16])], raw_input_contents=[x.tobytes()])

    class Context:
        def invocation_metadata(self) -> tuple[()]:
            return ()

        async def abort(self, code: object, details: str) -> None:
            raise RuntimeError(details)

    context = Context()
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v2/models/add/infer", "raw_path": b"/v2/models/add/infer", "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080)}

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    statuses: list[int] = []

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def grpc_block(servicer: InferenceServicer) -> float:
        started = time.perf_counter()
        for _ in range(per_block):
            await servicer.ModelInfer(request, context)
        return (time.perf_counter() - started) / per_block * 1e6

    async def rest_block(app: object) -> float:
        started = time.perf_counter()
        for _ in range(per_block):
            await app(dict(scope), receive, send)  # type: ignore[operator]
        return (time.perf_counter() - started) / per_block * 1e6

    results: dict[str, dict[str, list[float]]] = {"grpc": {"off": [], "on": []}, "rest-json": {"off": [], "on": []}}
    for block in range(blocks):
        for mode in (("off", "on") if block % 2 == 0 else ("on", "off")):
            model.metrics = series if mode == "on" else None
            results["grpc"][mode].append(await grpc_block(grpc_on if mode == "on" else grpc_off))
            results["rest-json"][mode].append(await rest_block(rest_on if mode == "on" else rest_off))
    model.metrics = series
    assert set(statuses) == {200}, set(statuses)
    await server.stop()
    return {k: (statistics.median(v["off"]), statistics.median(v["on"])) for k, v in results.items()}


def request_paths_us(repo: Path, blocks: int = 10, per_block: int = 2000) -> dict[str, tuple[float, float]]:
    import asyncio

    return asyncio.run(_paths(repo, blocks, per_block))


def successes(port: int) -> float:
    """ovms_requests_success summed over every series (what the hooks counted)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith("ovms_requests_success{"))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    protocols = [p for p in args.protocols.split(",") if p]
    throughput: dict[tuple[str, str], list[float]] = {}
    p99: dict[tuple[str, str], list[float]] = {}
    cpu_us: dict[tuple[str, str], list[float]] = {}  # server CPU per answered request
    idle: dict[str, list[float]] = {"off": [], "on": []}
    started = report.now()
    with tempfile.TemporaryDirectory(prefix="ovserve-metrics-cost-") as tmp:
        models.build_repository(Path(tmp), mobilenet=False)
        config = models.write_config(Path(tmp) / "config", ["add"], repo=Path(tmp))
        for round_ in range(args.rounds):
            for mode in (("off", "on") if round_ % 2 == 0 else ("on", "off")):
                extra = ["--metrics-enable"] if mode == "on" else []
                if args.wait_quiet > 0:
                    wait_quiet(15, args.wait_quiet)
                with servers.start_ovserve(config, extra, name=f"metrics-{mode}") as server:
                    server.wait_ready(["add"])
                    time.sleep(SETTLE)
                    idle[mode].append(server.rss_bytes() / 2**20)
                    answered = 0
                    for protocol in protocols:
                        port = server.port_for(protocol)
                        row = run_case(Case(protocol, "add", args.concurrency, args.duration, args.warmup, port=port),
                                       server.name, server.proc.pid)
                        if row.errors:
                            raise RuntimeError(f"{mode} {protocol}: {row.errors} errors ({row.first_error})")
                        throughput.setdefault((protocol, mode), []).append(row.throughput)
                        p99.setdefault((protocol, mode), []).append(row.p99_ms)
                        cpu_us.setdefault((protocol, mode), []).append(
                            row.server_cpu_pct / 100 / row.throughput * 1e6 if row.throughput else 0.0)
                        answered += row.count
                        print(f"  round {round_ + 1} metrics {mode:3} {protocol:11} {row.throughput:8.0f}/s "
                              f"p99 {row.p99_ms:6.2f} ms  other CPU {row.other_cpu_pct:.0f}%", flush=True)
                    if mode == "on":  # warm-up requests count too: at least the measured ones
                        counted = successes(server.rest_port)
                        if counted < answered:
                            raise RuntimeError(f"metrics counted {counted:.0f} successes for {answered} answered")
        paths = request_paths_us(Path(tmp)) if args.paths else {}
    lines = [f"# Metrics on vs off ({started})", "",
             (f"`python -m bench.metrics_cost {' '.join(argv)}`: add model, concurrency {args.concurrency}, "
             f"{args.duration:g} s per case, {args.rounds} rounds (medians)."), "",
             "| protocol | off infer/s | on infer/s | on/off | off p99 ms | on p99 ms | server CPU us/req off | on |",
             "|---|---|---|---|---|---|---|---|"]
    for protocol in protocols:
        off, on = (statistics.median(throughput[(protocol, m)]) for m in ("off", "on"))
        cpu_off, cpu_on = (statistics.median(cpu_us[(protocol, m)]) for m in ("off", "on"))
        p99_off, p99_on = (statistics.median(p99[(protocol, m)]) for m in ("off", "on"))
        lines.append(f"| {protocol} | {off:.0f} | {on:.0f} | {on / off:.3f} | {p99_off:.2f} | {p99_on:.2f} | "
                     f"{cpu_off:.0f} | {cpu_on:.0f} |")
    lines += ["", ("The request paths in process (one server, off and on alternated block by block; "
                  "us per request, medians):"), "", "| path | off us | on us | on/off |", "|---|---|---|---|"]
    for name, (off_us, on_us) in paths.items():
        lines.append(f"| {name} | {off_us:.1f} | {on_us:.1f} | {on_us / off_us:.3f} |")
    hooks = hook_cost_us()
    cheapest = min(statistics.median(cpu_us[(p, "off")]) for p in protocols)
    lines += ["", (f"The hooks in process: {hooks:.2f} us per answered inference (outcome, wait, inference), "
                  f"{100 * hooks / cheapest:.1f}% of the cheapest case's server CPU per request ({cheapest:.0f} us): "
                  "the cost on a CPU-bound server, whatever the machine's noise.")]
    lines += ["", (f"Idle RSS (add loaded, before any request): off {statistics.median(idle['off']):.1f} MiB, "
                  f"on {statistics.median(idle['on']):.1f} MiB (medians of {args.rounds}).")]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"metrics-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.md"
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
