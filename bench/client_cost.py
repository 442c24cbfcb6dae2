"""The client's CPU per call: ovserve's client beside tritonclient's and kserve's, on one ovserve server.

    python -m bench.client_cost [--calls 2000] [--warmup 200] [--rounds 5] [--out bench/results]

One ovserve server (``python -m ovserve.server serve``, ephemeral ports) serves the ``add`` model
(bench/specs.py: FP32 [1,16], y = x + 1). Each client runs in a Python process of its own (kserve's stubs
and tritonclient's both define protobuf package ``inference`` and cannot share one): it makes ``--warmup``
calls, then ``--calls`` sequential calls, each one what a user's code does (build the request from a numpy
array, infer, read the output as numpy), and reports the process's CPU time (user + system, every thread:
gRPC's and the event loop's too) and the wall time over those calls, per call in microseconds. A round
runs every client once, in turn; the table holds each client's median over ``--rounds`` rounds, so that
what else the machine does falls on every client alike (each round starts with the next
client). Every answer is checked (x + 1).

The clients, each with its own defaults: over gRPC ovserve's ``InferenceGRPCClient`` (async, KServe's
API), kserve's ``InferenceGRPCClient``, tritonclient's ``tritonclient.grpc`` (sync) and
``tritonclient.grpc.aio``; over REST (V2) ovserve's ``InferenceRESTClient`` (binary tensors both ways),
kserve's (a binary input, JSON outputs), ``tritonclient.http`` (sync) and ``tritonclient.http.aio``. A
client whose package is not installed is left out, with a line saying so.

The run is written to ``--out`` as ``client-cost-<stamp>.md``; docs/performance.md ("Client CPU per
call") cites it. No figure here is asserted anywhere: tests/test_bench_client_cost.py only runs it with a few
calls.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "add"

#: client -> (protocol, the package it needs, what it is)
CLIENTS: dict[str, tuple[str, str, str]] = {
    "ovserve-grpc": ("grpc", "ovserve.client", "ovserve.client.InferenceGRPCClient (async)"),
    "tritonclient-grpc": ("grpc", "tritonclient.grpc", "tritonclient.grpc.InferenceServerClient (sync)"),
    "tritonclient-grpc-aio": ("grpc", "tritonclient.grpc", "tritonclient.grpc.aio.InferenceServerClient"),
    "kserve-grpc": ("grpc", "kserve", "kserve.InferenceGRPCClient (async)"),
    "ovserve-rest": ("rest", "ovserve.client", "ovserve.client.InferenceRESTClient (async, V2)"),
    "tritonclient-http": ("rest", "tritonclient.http", "tritonclient.http.InferenceServerClient (sync)"),
    "tritonclient-http-aio": ("rest", "tritonclient.http", "tritonclient.http.aio.InferenceServerClient"),
    "kserve-rest": ("rest", "kserve", "kserve.InferenceRESTClient (async, V2)"),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    cli = argparse.ArgumentParser(prog="python -m bench.client_cost", description=__doc__.split("\n\n")[0])
    cli.add_argument("--calls", type=int, default=2000, help="measured sequential calls per client and round")
    cli.add_argument("--warmup", type=int, default=200, help="calls before the measured ones")
    cli.add_argument("--rounds", type=int, default=5, help="rounds (every client once each); medians over them")
    cli.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated, of: " + ", ".join(CLIENTS))
    cli.add_argument("--out", type=Path, default=None,
                     help="folder to write client-cost-<stamp>.md into (default: print only)")
    cli.add_argument("--wait-quiet", type=float, default=0.0,
                     help="seconds to wait, at most, for the machine's other load to fall under 10%% of a core")
    cli.add_argument("--worker", nargs=3, metavar=("CLIENT", "GRPC_TARGET", "REST_URL"), help=argparse.SUPPRESS)
    args = cli.parse_args(argv)
    unknown = set(args.clients.split(",")) - set(CLIENTS)
    if unknown:
        cli.error(f"unknown clients: {', '.join(sorted(unknown))}")
    return args


# -- one client, in its own process ------------------------------------------------------------
Call = Callable[[np.ndarray], Any]


def _sync_call(client: str, grpc_target: str, rest_url: str) -> tuple[Call, Callable[[], None]]:
    """A synchronous client's call (x -> y as numpy) and its close."""
    if client == "tritonclient-grpc":
        import tritonclient.grpc as tg

        c = tg.InferenceServerClient(grpc_target)

        def call(x: np.ndarray) -> Any:
            t = tg.InferInput("x", list(x.shape), "FP32")
            t.set_data_from_numpy(x)
            return c.infer(MODEL, [t]).as_numpy("y")

        return call, c.close
    if client == "tritonclient-http":
        import tritonclient.http as th

        h = th.InferenceServerClient(rest_url.removeprefix("http://"))

        def call_http(x: np.ndarray) -> Any:
            t = th.InferInput("x", list(x.shape), "FP32")
            t.set_data_from_numpy(x)
            return h.infer(MODEL, [t]).as_numpy("y")

        return call_http, h.close
    raise ValueError(client)


async def _async_client(client: str, grpc_target: str, rest_url: str) -> tuple[Callable[[np.ndarray], Awaitable[Any]],
                                                                               Callable[[], Awaitable[Any]]]:
    """An asynchronous client's call (x -> y as numpy) and its close, made in the running loop."""
    if client in ("ovserve-grpc", "kserve-grpc", "ovserve-rest", "kserve-rest"):
        if client.startswith("ovserve"):
            from ovserve.client import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
        else:
            from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
        if client.endswith("grpc"):
            g = InferenceGRPCClient(grpc_target)

            async def call_grpc(x: np.ndarray) -> Any:
                t = InferInput("x", list(x.shape), "FP32")
                t.set_data_from_numpy(x)
                return (await g.infer(InferRequest(MODEL, [t]))).outputs[0].as_numpy()

            return call_grpc, g.close
        r = InferenceRESTClient(RESTConfig(protocol="v2"))

        async def call_rest(x: np.ndarray) -> Any:
            t = InferInput("x", list(x.shape), "FP32")
            t.set_data_from_numpy(x)
            return (await r.infer(rest_url, InferRequest(MODEL, [t]), model_name=MODEL)).outputs[0].as_numpy()

        return call_rest, r.close
    if client == "tritonclient-grpc-aio":
        import tritonclient.grpc.aio as tga

        a = tga.InferenceServerClient(grpc_target)

        async def call_aio(x: np.ndarray) -> Any:
            t = tga.InferInput("x", list(x.shape), "FP32")
            t.set_data_from_numpy(x)
            return (await a.infer(MODEL, [t])).as_numpy("y")

        return call_aio, a.close
    if client == "tritonclient-http-aio":
        import tritonclient.http.aio as tha

        ha = tha.InferenceServerClient(rest_url.removeprefix("http://"))

        async def call_http_aio(x: np.ndarray) -> Any:
            t = tha.InferInput("x", list(x.shape), "FP32")
            t.set_data_from_numpy(x)
            return (await ha.infer(MODEL, [t])).as_numpy("y")

        return call_http_aio, ha.close
    raise ValueError(client)


def _check(x: np.ndarray, y: Any) -> None:
    if not np.array_equal(np.asarray(y, np.float32).reshape(x.shape), x + 1):
        raise AssertionError(f"wrong answer: {y!r} for x + 1 of {x!r}")


def measure_worker(client: str, grpc_target: str, rest_url: str, calls: int, warmup: int) -> dict[str, float]:
    """``warmup`` calls, then ``calls`` timed ones: CPU (this process, every thread) and wall us per call."""
    x = np.arange(16, dtype=np.float32).reshape(1, 16) / 4

    def stamp() -> tuple[float, float]:
        return time.process_time(), time.perf_counter()

    if client in ("tritonclient-grpc", "tritonclient-http"):
        call, close = _sync_call(client, grpc_target, rest_url)
        for _ in range(warmup):
            _check(x, call(x))
        answers = []
        cpu0, wall0 = stamp()
        for _ in range(calls):
            answers.append(call(x))
        cpu1, wall1 = stamp()
        close()
    else:
        async def run() -> tuple[float, float, float, float, list[Any]]:
            acall, aclose = await _async_client(client, grpc_target, rest_url)
            for _ in range(warmup):
                _check(x, await acall(x))
            got = []
            c0, w0 = stamp()
            for _ in range(calls):
                got.append(await acall(x))
            c1, w1 = stamp()
            await aclose()
            return c0, w0, c1, w1, got

        cpu0, wall0, cpu1, wall1, answers = asyncio.run(run())
    for y in answers:  # every answer, checked once the clock has stopped
        _check(x, y)
    return {"cpu_us": 1e6 * (cpu1 - cpu0) / calls, "wall_us": 1e6 * (wall1 - wall0) / calls}


# -- the parent: the server, the rounds, the table -----------------------------------------------
@dataclass
class Result:
    client: str
    cpu_us: list[float] = field(default_factory=list)
    wall_us: list[float] = field(default_factory=list)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpu_us)

    @property
    def wall(self) -> float:
        return statistics.median(self.wall_us)


def run_worker(client: str, grpc_target: str, rest_url: str, calls: int, warmup: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "bench.client_cost", "--calls", str(calls), "--warmup", str(warmup),
           "--worker", client, grpc_target, rest_url]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{client} failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    out: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children: the clients' processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def available(client: str) -> bool:
    return importlib.util.find_spec(CLIENTS[client][1]) is not None


def table(results: list[Result], markdown: bool) -> str:
    cpu = {r.client: r.cpu for r in results}

    def against(r: Result, other: str) -> str:
        base = cpu.get(f"tritonclient-{'grpc' if CLIENTS[r.client][0] == 'grpc' else 'http'}{other}")
        return f"{r.cpu / base:.2f}x" if base else "n/a"

    header = ["client", "protocol", "CPU us/call", "wall us/call", "CPU / tritonclient sync", "CPU / tritonclient aio",
              "CPU us per round"]
    body = [[r.client, CLIENTS[r.client][0], f"{r.cpu:.0f}", f"{r.wall:.0f}", against(r, ""), against(r, "-aio"),
             " ".join(f"{v:.0f}" for v in r.cpu_us)] for r in results]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(header)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     for row in [header, *body])


def versions() -> dict[str, str]:
    from . import report

    return report.installed("ovserve", "tritonclient", "kserve", "grpcio", "protobuf", "aiohttp", "httpx", "numpy")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.worker:
        client, grpc_target, rest_url = args.worker
        sys.argv[1:] = []  # kserve parses the command line when imported (its ModelServer's flags)
        print(json.dumps(measure_worker(client, grpc_target, rest_url, args.calls, args.warmup)))
        return 0
    from . import models, report, servers
    from .measure import machine_busy_seconds, wait_quiet

    wanted = args.clients.split(",")
    clients = [c for c in wanted if available(c)]
    for c in wanted:
        if c not in clients:
            print(f"{c}: left out, {CLIENTS[c][1]} is not installed", flush=True)
    started = report.now()
    command = "python -m bench.client_cost" + ("" if not argv else " " + shlex.join(argv))
    results = {c: Result(c) for c in clients}
    with tempfile.TemporaryDirectory(prefix="ovserve-client-cost-") as tmp:
        models.build_repository(Path(tmp), mobilenet=False)
        config = models.write_config(Path(tmp) / "config", [MODEL], repo=Path(tmp))
        with servers.start_ovserve(config) as server:
            server.wait_ready([MODEL])
            grpc_target, rest_url = f"127.0.0.1:{server.grpc_port}", f"http://127.0.0.1:{server.rest_port}"
            background = wait_quiet(10, args.wait_quiet) if args.wait_quiet > 0 else None
            print(f"ovserve: pid {server.proc.pid}, REST {server.rest_port}, gRPC {server.grpc_port}; "
                  f"{args.calls} calls after {args.warmup} per client, {args.rounds} rounds", flush=True)
            busy0, cpu0, wall0 = machine_busy_seconds(), server.cpu_seconds(), time.perf_counter()
            children0 = _children_cpu()
            for round_no in range(1, args.rounds + 1):
                # each round starts with the next client, so that no client always follows the same one
                turn = (round_no - 1) % len(clients)
                for c in clients[turn:] + clients[:turn]:
                    got = run_worker(c, grpc_target, rest_url, args.calls, args.warmup)
                    results[c].cpu_us.append(got["cpu_us"])
                    results[c].wall_us.append(got["wall_us"])
                    print(f"round {round_no} {c}: CPU {got['cpu_us']:.0f} us/call, wall {got['wall_us']:.0f} us/call",
                          flush=True)
            elapsed = time.perf_counter() - wall0
            server_pct = 100 * (server.cpu_seconds() - cpu0) / elapsed
            clients_pct = 100 * (_children_cpu() - children0) / elapsed
            # what else ran on the machine meanwhile: its busy CPU less the server's and the clients' processes
            others_pct = max(0.0, 100 * (machine_busy_seconds() - busy0) / elapsed - server_pct - clients_pct)
    rows = list(results.values())
    print()
    print(table(rows, markdown=False))
    if args.out is not None:
        path = write(args, rows, command, started, background, server_pct, others_pct)
        print(f"\nwrote {path}")
    return 0


def write(args: argparse.Namespace, rows: list[Result], command: str, started: Any, background: float | None,
          server_pct: float, others_pct: float) -> Path:
    from . import report

    m = report.machine()
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    text = "\n".join([
        f"# Client CPU per call, {started.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['os']}; Python {m['python']}",
        f"- software: {', '.join(f'{k} {v}' for k, v in versions().items())}",
        (f"- command: `{command}`: the `{MODEL}` model (FP32 [1,16]) on one ovserve server, 127.0.0.1; each client "
         f"in a process of its own, {args.warmup} calls of warm-up, then {args.calls} sequential calls (build the "
         "request from numpy, infer, output as numpy); its process's CPU time (user + system, every thread) and "
         f"wall time per call; medians of {args.rounds} rounds, each running every client once in turn, "
         "each round starting with the next client"),
        (f"- load: 1/5/15-minute load average at the end {' '.join(load) or 'n/a'}; over the run other processes "
         f"took {others_pct:.0f}% of a core (the server {server_pct:.0f}%)"
         + (f"; other processes' CPU just before: {background:.0f}% of a core" if background is not None else "")),
        "",
        table(rows, markdown=True),
        "",
        "Clients: " + "; ".join(f"`{r.client}`: {CLIENTS[r.client][2]}" for r in rows) + ".",
        "",
    ])
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"client-cost-{started.strftime('%Y%m%d-%H%M')}"
    path = args.out / f"{name}.md"
    if path.exists():
        path = args.out / f"{name}{started.strftime('%S')}.md"
    path.write_text(text)
    return path


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
