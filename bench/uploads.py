"""``python -m bench.uploads``: what N slow unary uploads held open cost in server memory, per gRPC engine.

Issue 33, (d): every gRPC engine (loop, the default, grpcio's C core, native) keeps a unary request's message in
memory until the whole of it has arrived, and gives the sender window as the bytes arrive (up to the size the
5-byte length prefix announces). So a client that sends a large message slowly, and never its last byte, holds
that much of the server's memory for as long as it likes: up to ``--max-request-bytes`` a call.

This tool starts ``ovserve serve`` on each engine and opens ``--calls`` raw HTTP/2 connections (hyperframe and hpack,
as tests/test_grpc_door.py does), each one ModelInfer call whose message is ``--mib`` MiB. Each sends all of its
message but the last byte, paced over ``--seconds``, honouring the windows the server gives, then holds. The
table gives the server's RSS (with its children) before, at its peak while the calls were held, and ``--settle``
seconds (3) after the clients closed their connections; an upload the server stops giving window to before its
message is sent (none of the engines did, at 64 MiB) counts as held once it has waited ``STALLED_S``. The run goes
to ``bench/results/uploads-<YYYYMMDD-HHMM>.md``; numbers taken while other processes use the cores are noisy (the
load average at start and end is written with them), but memory much less than times.
"""
from __future__ import annotations

import argparse
import os
import platform
import select
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hpack
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from . import servers
from .measure import RESULTS
from .ts_tensors import add_model

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
           (":authority", "ovserve"), ("content-type", "application/grpc"), ("te", "trailers")]
MODEL = "tensors"
MIB = 1 << 20
#: seconds without window to send in, after which an upload counts as held by the server
STALLED_S = 2.0


def message(size: int) -> bytes:
    """A gRPC message (its 5-byte prefix and a ModelInferRequest) of ``size`` bytes of tensor, for the model."""
    from tritonclient.grpc import service_pb2 as pb

    req = pb.ModelInferRequest(model_name=MODEL)
    req.inputs.add(name="x", datatype="FP32", shape=[1, size // 4])
    req.raw_input_contents.append(b"\x00" * (size // 4 * 4))
    body = req.SerializeToString()
    return b"\x00" + struct.pack(">I", len(body)) + body


class Upload(threading.Thread):
    """One connection, one call: all of ``data`` but its last byte, paced over ``seconds``, then held until
    ``release`` is set; the windows the server gives are honoured, its SETTINGS and PINGs acknowledged."""

    def __init__(self, port: int, data: bytes, seconds: float, release: threading.Event) -> None:
        super().__init__(daemon=True)
        self.port, self.data, self.seconds, self.release = port, data, seconds, release
        self.held = threading.Event()
        self.sent = 0
        #: the server stopped giving window before the message was sent (STALLED_S without any)
        self.stalled = False
        self.ended = ""  # what the server said, if it ended the call or the connection

    def run(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        try:
            self._run(sock)
        finally:
            sock.close()
            self.held.set()

    def _run(self, sock: socket.socket) -> None:
        block = hpack.Encoder().encode(HEADERS)
        sock.sendall(PREFACE + SettingsFrame(0).serialize() + HeadersFrame(1, block, flags=["END_HEADERS"]).serialize())
        conn_window, stream_window, initial = 65535, 65535, 65535
        goal = len(self.data) - 1
        started, pending, progress = time.monotonic(), b"", time.monotonic()
        while True:
            readable, _, _ = select.select([sock], [], [], 0.005)
            if readable:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    self.ended = self.ended or "closed"
                    return
                pending += chunk
                while len(pending) >= 9:
                    frame, length = Frame.parse_frame_header(memoryview(pending[:9]))
                    if len(pending) < 9 + length:
                        break
                    frame.parse_body(memoryview(pending[9:9 + length]))
                    pending = pending[9 + length:]
                    if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                        new = frame.settings.get(SettingsFrame.INITIAL_WINDOW_SIZE, initial)
                        stream_window += new - initial
                        initial = new
                        sock.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
                    elif isinstance(frame, WindowUpdateFrame):
                        if frame.stream_id == 0:
                            conn_window += frame.window_increment
                        else:
                            stream_window += frame.window_increment
                    elif isinstance(frame, PingFrame) and "ACK" not in frame.flags:
                        sock.sendall(PingFrame(0, frame.opaque_data, flags=["ACK"]).serialize())
                    elif isinstance(frame, (RstStreamFrame, GoAwayFrame)):
                        self.ended = type(frame).__name__
                        return
                    elif isinstance(frame, HeadersFrame) and "END_STREAM" in frame.flags:
                        self.ended = "answered"
                        return
            if self.sent >= goal or time.monotonic() - progress > STALLED_S:  # all sent, or the server holds back
                self.stalled = self.sent < goal
                self.held.set()
                if self.release.is_set():
                    return
                if self.sent >= goal:
                    continue
            paced = int(goal * min(1.0, (time.monotonic() - started) / self.seconds)) - self.sent
            n = min(conn_window, stream_window, 16384, goal - self.sent, paced)
            if n > 0:
                sock.sendall(DataFrame(1, self.data[self.sent:self.sent + n]).serialize())
                self.sent += n
                conn_window -= n
                stream_window -= n
                progress = time.monotonic()
            elif paced > 0:  # the windows are spent: only the server can open them
                pass
            else:
                progress = time.monotonic()


def measure(engine: str, calls: int, size: int, seconds: float, extra: list[str], log: Callable[[str], None],
            settle: float = 3.0) -> dict[str, Any]:
    import openvino as ov

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / MODEL / "1"
        folder.mkdir(parents=True)
        ov.save_model(add_model(), str(folder / "model.xml"))
        flags = ["--grpc-engine", engine, *extra]
        with servers.start_ovserve(Path(tmp), flags, name=engine, repository=True) as server:
            server.wait_ready([MODEL])
            time.sleep(1.0)
            before = server.rss_bytes()
            data = message(size)
            release = threading.Event()
            uploads = [Upload(server.grpc_port, data, seconds, release) for _ in range(calls)]
            for upload in uploads:
                upload.start()
            peak, deadline = before, time.monotonic() + seconds + 60
            while time.monotonic() < deadline and not all(u.held.is_set() for u in uploads):
                peak = max(peak, server.rss_bytes())
                time.sleep(0.05)
            for _ in range(20):  # held: a second more of samples
                peak = max(peak, server.rss_bytes())
                time.sleep(0.05)
            held = server.rss_bytes()
            release.set()
            for upload in uploads:
                upload.join(30)
            time.sleep(settle)
            after = server.rss_bytes()
            sent = sum(u.sent for u in uploads)
            ended = sorted({u.ended for u in uploads if u.ended}
                           | ({f"window closed after {min(u.sent for u in uploads) / MIB:.0f} MiB"}
                              if any(u.stalled for u in uploads) else set()))
            if not server.alive():
                raise RuntimeError(f"ovserve ({engine}) died during the run:\n{server.log}")
    row = {"before": before / MIB, "peak": peak / MIB, "held": held / MIB, "after": after / MIB, "sent": sent / MIB,
           "ended": ", ".join(ended) or "-"}
    log(f"  {engine:7} {calls} x {size / MIB:.0f} MiB: sent {row['sent']:.0f} MiB; RSS before {row['before']:.0f}, "
        f"peak {row['peak']:.0f}, held {row['held']:.0f}, after {row['after']:.0f} MiB; ended: {row['ended']}")
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.uploads", description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="loop,grpcio",
                   help="comma-separated --grpc-engine values (default loop,grpcio)")
    p.add_argument("--calls", default="1,8", help="comma-separated numbers of concurrent uploads (default 1,8)")
    p.add_argument("--mib", type=int, default=64, help="each call's message, MiB (default 64)")
    p.add_argument("--seconds", type=float, default=8.0, help="each upload's pace: all but its last byte in this time")
    p.add_argument("--server-flag", action="append", default=[], help="a flag for ovserve serve (repeatable)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds after the clients close before the last RSS")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the run's file goes (default bench/results)")
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    load = os.getloadavg()[0]
    started = datetime.now(UTC)
    rows = []
    for engine in args.engines.split(","):
        for calls in (int(c) for c in args.calls.split(",")):
            rows.append((engine, calls, measure(engine, calls, args.mib * MIB, args.seconds, args.server_flag, print,
                                                args.settle)))
    command = (f"python -m bench.uploads --engines {args.engines} --calls {args.calls} --mib {args.mib} "
               f"--seconds {args.seconds:g} --settle {args.settle:g}"
               + "".join(f" --server-flag={f}" for f in args.server_flag))
    machine = (f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; load average "
               f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end.")
    header = (f"| engine | calls | each, MiB | sent, MiB | RSS before | peak | held | {args.settle:g} s after close "
              "| the server |")
    lines = [f"# Slow unary uploads held open: server memory ({started:%Y-%m-%d %H:%M} UTC)", "",
             f"`{command}`", "", machine, "", "RSS in MiB, the server's process and its children.", "",
             header, "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for engine, calls, r in rows:
        lines.append(f"| {engine} | {calls} | {args.mib} | {r['sent']:.0f} | {r['before']:.0f} | {r['peak']:.0f} | "
                     f"{r['held']:.0f} | {r['after']:.0f} | {r['ended']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"uploads-{started:%Y%m%d-%H%M}.md"
        path.write_text(text)
        print(f"written: {path}")


if __name__ == "__main__":
    main()
