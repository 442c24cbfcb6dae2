"""The ceiling of a served model on this machine: raw OpenVINO beside the bytes its requests move.

``python -m bench.floor`` answers one question with a measurement: could
*any* server, however lean, reach a given share of raw OpenVINO's throughput
on this machine when its clients share the machine's cores (as the
benchmark's load generator does)? It runs raw asynchronous inference (the
``raw async`` rows, :mod:`bench.contention`) alone, then beside the least
work a served request needs besides inference: a sender process writes each
request's bytes (the real serialized KServe V2 ``ModelInferRequest`` with its
gRPC prefix) over loopback TCP and a sink process reads them and answers
with the bytes of a real reply, paced at the rate the target asks for
(``--share`` of raw alone) on ``concurrency`` connections. No HTTP/2, no
protobuf parsing, no copy into an input tensor, no hand-off: a gRPC server
does all of that on top.

If raw OpenVINO cannot keep up that rate beside this traffic, no server can
meet the target here: it would have to run the same inferences while moving
the same bytes, and more.

With ``--served grpc,rest-binary`` each round also starts a fresh ovserve on
the same model files and properties and measures it through the benchmark's
load generator at the same concurrency, right after that round's ceiling: a
served row against the ceiling and against raw alone *of its own round*, the
median of those paired ratios over the rounds. A server's throughput moves
from one start to the next (up to 12% for the native gRPC engine), and the
machine's speed from one hour to the next, so a ceiling measured in another
run can put a served row 10% either side of a line; the paired ratios cannot.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import shlex
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import openvino as ov
import psutil

from . import contention, loadgen, models, report, servers, specs
from .measure import RESULTS, run_case


def _framed(message: bytes) -> bytes:
    """A gRPC length-prefixed message: 1 byte flag, 4 bytes length, the protobuf."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def wire_messages(spec: specs.ModelSpec, x: np.ndarray) -> tuple[bytes, bytes]:
    """The request and reply bytes of one served inference of ``spec`` (gRPC framing, V2 protobuf)."""
    from tritonclient.grpc import service_pb2 as pb

    reply = pb.ModelInferResponse(model_name=spec.name, model_version="1")
    reply.outputs.add(name=spec.output_name, datatype="FP32", shape=[1, models.CLASSES])
    reply.raw_output_contents.append(np.zeros(models.CLASSES, np.float32).tobytes())
    return _framed(loadgen.grpc_request(spec, x)), _framed(reply.SerializeToString())


def _read_exactly(conn: socket.socket, buf: memoryview) -> bool:
    got = 0
    while got < len(buf):
        n = conn.recv_into(buf[got:])
        if n == 0:
            return False
        got += n
    return True


def sink(listener: socket.socket, lanes: int, request_size: int, reply: bytes) -> None:
    """Read whole requests into one buffer per connection and answer each with ``reply``."""
    def serve(conn: socket.socket) -> None:
        buf = memoryview(bytearray(request_size))
        with conn:
            while _read_exactly(conn, buf):
                conn.sendall(reply)

    threads = []
    for _ in range(lanes):
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threads.append(threading.Thread(target=serve, args=(conn,), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join()


def sender(port: int, lanes: int, rate: float, request: bytes, reply_size: int,
           sent: mp.sharedctypes.Synchronized, stop: mp.synchronize.Event) -> None:
    """``lanes`` connections, each sending a request and reading its reply at ``rate / lanes`` a second.

    Paced on a fixed schedule; a lane that falls behind by a whole period skips
    the missed slots rather than sending a burst (a closed loop would not).
    """
    period = lanes / rate

    def lane(i: int) -> None:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = memoryview(bytearray(reply_size))
            due = time.perf_counter() + i * period / lanes
            while not stop.is_set():
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                conn.sendall(request)
                if not _read_exactly(conn, buf):
                    return
                with sent.get_lock():
                    sent.value += 1
                due = max(due + period, time.perf_counter() - period)

    threads = [threading.Thread(target=lane, args=(i,), daemon=True) for i in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@dataclass
class Beside:
    """One raw run beside the wire traffic."""
    infer_per_s: float
    asked_per_s: float  # the rate the sender was paced at
    wire_per_s: float  # requests the sender got answered during the raw run
    sender_cpu: float  # share of one core
    sink_cpu: float


def raw_beside_wire(compiled: ov.CompiledModel, x: np.ndarray, concurrency: int, seconds: float,
                    rate: float, request: bytes, reply: bytes) -> Beside:
    """Raw async inference while a sender and a sink move ``rate`` requests a second over loopback."""
    ctx = mp.get_context("fork")
    stop, sent = ctx.Event(), ctx.Value("q", 0)
    listener = socket.create_server(("127.0.0.1", 0), backlog=concurrency)
    sink_proc = ctx.Process(target=sink, args=(listener, concurrency, len(request), reply), daemon=True)
    sink_proc.start()
    send_proc = ctx.Process(target=sender, args=(listener.getsockname()[1], concurrency, rate, request,
                                                 len(reply), sent, stop), daemon=True)
    send_proc.start()
    listener.close()
    try:
        time.sleep(1.0)  # connections up, traffic steady
        if not send_proc.is_alive():
            raise RuntimeError(f"the sender stopped (exit {send_proc.exitcode})")
        procs = [psutil.Process(p.pid) for p in (send_proc, sink_proc)]
        cpu0 = [sum(p.cpu_times()[:2]) for p in procs]
        n0, t0 = sent.value, time.perf_counter()
        infer = contention.raw_async(compiled, x, concurrency, seconds)
        elapsed = time.perf_counter() - t0
        cpu = [(sum(p.cpu_times()[:2]) - c) / elapsed for p, c in zip(procs, cpu0, strict=True)]
        return Beside(infer, rate, (sent.value - n0) / elapsed, cpu[0], cpu[1])
    finally:
        stop.set()
        send_proc.join(5)
        for proc in (send_proc, sink_proc):
            if proc.is_alive():
                proc.kill()
            proc.join(5)


@dataclass
class Served:
    """One round's served rows: infer/s and server CPU (% of a core) per protocol."""
    per_s: dict[str, float]
    cpu_pct: dict[str, float]


def served_round(config: Path, spec: specs.ModelSpec, model_path: Path, protocols: list[str],
                 concurrency: int, seconds: float, extra: list[str]) -> Served:
    """A fresh ovserve serving ``spec``'s model as ``config`` says, measured over each protocol in turn."""
    out = Served({}, {})
    with servers.start_ovserve(config, extra) as server:
        server.wait_ready([spec.name])
        for protocol in protocols:
            port = server.port_for(protocol)
            case = loadgen.Case(protocol, spec.name, concurrency, seconds, 1.0, port=port, model_path=str(model_path),
                                plugin_config=spec.plugin_config)
            row = run_case(case, "ovserve", server.pid, log=lambda *_: None)
            if row.errors or not row.count:
                raise RuntimeError(f"ovserve over {protocol}: {row.errors} errors ({row.first_error[:300]})")
            out.per_s[protocol], out.cpu_pct[protocol] = row.throughput, row.server_cpu_pct
        if not server.alive():
            raise RuntimeError(f"ovserve died during the round:\n{server.log}")
    return out


def ratio_text(value: float, goal: float) -> str:
    """``value`` to two decimals, or three where two would read on the other side of ``goal`` (0.897 against
    0.9 is not met, and "0.90 ... not met" reads as a contradiction)."""
    return f"{value:.2f}" if (round(value, 2) >= goal) == (value >= goal) else f"{value:.3f}"


def report_served(protocols: list[str], alone: list[float], beside: list[Beside], served: list[Served],
                  of_ceiling: float, of_raw: float, say: Callable[[str], None] = print) -> None:
    """Each protocol's median throughput and its paired ratios to the same round's ceiling and raw alone."""
    say(f"  served by ovserve (a fresh server each round), each against its own round "
        f"(goal: {of_ceiling:.2f} x the ceiling and {of_raw:.2f} x raw alone):")
    for protocol in protocols:
        runs = [s.per_s[protocol] for s in served]
        x_ceiling = float(np.median([r / b.infer_per_s for r, b in zip(runs, beside, strict=True)]))
        x_raw = float(np.median([r / a for r, a in zip(runs, alone, strict=True)]))
        cpu = float(np.median([s.cpu_pct[protocol] for s in served]))
        met = x_ceiling >= of_ceiling and x_raw >= of_raw
        say(f"    {protocol:12} {np.median(runs):4.0f}/s (runs: {', '.join(f'{v:.0f}' for v in runs)}; server CPU "
            f"{cpu:.0f}%) = {ratio_text(x_ceiling, of_ceiling)} x the ceiling, {ratio_text(x_raw, of_raw)} x raw "
            f"alone: {'met' if met else 'not met'}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnetish", choices=["resnetish", "mobilenet_v2"])
    p.add_argument("--hint", choices=["LATENCY", "THROUGHPUT"], help="PERFORMANCE_HINT (default: the model's own)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--share", type=float, default=0.85, help="the wire rate, as a share of raw alone (the target)")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--repeat", type=int, default=3, help="alternate alone/beside this many times; report medians")
    p.add_argument("--served", default="", metavar="PROTOCOLS",
                   help="comma-separated protocols (grpc, rest-binary, rest-json) to serve the model over with a fresh "
                        "ovserve in each round, right after the round's ceiling")
    p.add_argument("--ovserve-arg", action="append", default=[], metavar="ARG",
                   help="an argument for the served ovserve (repeatable)")
    p.add_argument("--of-ceiling", type=float, default=0.9, help="the served goal, x the ceiling (issue 21: 0.9)")
    p.add_argument("--of-raw", type=float, default=0.8, help="the served goal, x raw alone (issue 21: 0.8)")
    p.add_argument("--out", type=Path, default=RESULTS, metavar="DIR", help="where floor-<stamp>.md goes")
    p.add_argument("--no-out", action="store_true", help="print only, write nothing")
    args = p.parse_args(argv)
    protocols = [v for v in args.served.split(",") if v]
    started = report.now()
    lines: list[str] = []

    def say(line: str) -> None:
        print(line)
        lines.append(line)

    specs.with_hint(args.hint)
    spec = specs.SPECS[args.model]
    with tempfile.TemporaryDirectory(prefix="ovserve-floor-") as tmp:
        paths = models.build_repository(Path(tmp), mobilenet=args.model == "mobilenet_v2")
        if args.model not in paths:
            print(f"{args.model}: not available here", file=sys.stderr)
            return 1
        compiled = ov.Core().compile_model(str(paths[args.model]), "CPU", dict(spec.plugin_config))
        config = models.write_config(Path(tmp) / "config", [args.model], repo=Path(tmp))
        x = spec.sample()
        request, reply = wire_messages(spec, x)
        alone: list[float] = []
        beside: list[Beside] = []
        served: list[Served] = []
        for _ in range(args.repeat):
            alone.append(contention.raw_async(compiled, x, args.concurrency, args.seconds))
            pace = args.share * float(np.median(alone))  # the target's rate, from the runs alone so far
            beside.append(raw_beside_wire(compiled, x, args.concurrency, args.seconds, pace, request, reply))
            if protocols:
                served.append(served_round(config, spec, paths[args.model], protocols, args.concurrency,
                                           args.seconds, list(args.ovserve_arg)))
    base = float(np.median(alone))
    infer = float(np.median([b.infer_per_s for b in beside]))
    carried = float(np.median([b.wire_per_s for b in beside]))
    kept_pace = float(np.median([b.wire_per_s / b.asked_per_s for b in beside]))
    client, server = (float(np.median([getattr(b, k) for b in beside])) for k in ("sender_cpu", "sink_cpu"))
    rate = args.share * base
    runs = ", ".join(f"{b.infer_per_s:.0f}" for b in beside)
    # each beside run / the alone run before it
    paired = float(np.median([b.infer_per_s / a for a, b in zip(alone, beside, strict=True)]))
    say(f"{args.model} ({spec.plugin_config.get('PERFORMANCE_HINT')}), raw async OpenVINO at {args.concurrency} "
        f"in flight, median of {args.repeat}:")
    say(f"  alone: {base:.0f}/s (runs: {', '.join(f'{v:.0f}' for v in alone)})")
    say(f"  beside the bytes of {args.share:.2f} x that ({np.median([b.asked_per_s for b in beside]):.0f} requests/s "
        f"asked, {carried:.0f}/s carried: {carried * len(request) / 1e6:.0f} MB/s in, "
        f"{carried * len(reply) / 1e6:.1f} MB/s out; "
        f"sender {client:.0%}, sink {server:.0%} of a core): "
        f"{infer:.0f}/s = {infer / base:.2f} x alone (runs: {runs}; median of the paired ratios {paired:.2f})")
    if kept_pace < 0.98:
        verdict = f"out of reach here: the bytes alone fell behind (carried {kept_pace:.0%} of the rate asked)"
    else:
        verdict = ("within reach" if infer >= rate else "out of reach") + (
            f" here: it needs {rate:.0f} inferences/s while moving those bytes; raw OpenVINO beside them, "
            f"with no server work at all, managed {infer:.0f}/s")
    say(f"  a server at {args.share:.2f} x raw async is {verdict}")
    if protocols:
        report_served(protocols, alone, beside, served, args.of_ceiling, args.of_raw, say)
    if not args.no_out:
        print(f"\nwrote {write(lines, shlex.join(['python', '-m', 'bench.floor', *argv]), started, args.out)}")
    return 0


def write(lines: list[str], command: str, started: datetime, out: Path) -> Path:
    """``floor-<stamp>.md`` in ``out``: the machine, the command and what the run printed."""
    m = report.machine()
    text = "\n".join([f"# The ceiling of a served model, {started.strftime('%Y-%m-%d %H:%M UTC')}", "",
                      f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['os']}; Python {m['python']}",
                      f"- command: `{command}`", "", "```", *lines, "```", ""])
    path = report.stamped("floor", started, out)
    path.write_text(text)
    return path


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
