"""The closed-loop load generator: one case per process, requests built once.

Run as ``python -m bench.loadgen CASE_JSON``. ``concurrency`` workers each
send a request, wait for its answer and send the next, for ``duration``
seconds (and at most ``max_requests`` requests), after ``warmup`` seconds
that are not counted. The process prints ``START`` and ``STOP`` on stdout
when the measured window opens and closes (so the parent can sample the
server's CPU and memory over exactly that window), then ``RESULT {json}``.

Kinds:

- ``grpc``: KServe V2 ``ModelInfer`` on pre-serialized protobuf bytes, all
  workers sharing one HTTP/2 connection as one gRPC channel would, through
  :mod:`bench.h2grpc` (or grpcio's ``grpc.aio`` with ``grpc_client="aio"``).
- ``ts-grpc``: TorchServe's ``Predictions`` (its gRPC inference API, served
  by ovserve with ``--ts-inference-port`` and by TorchServe itself) on the
  same HTTP/2 client: a pre-serialized ``PredictionsRequest`` whose input
  ``data`` is the ``image`` file's bytes; the first answer must be TorchServe's
  image classifier's top 5 (``{label: probability}``, descending).
- ``rest-json`` / ``rest-binary``: KServe V2 ``/infer`` over keep-alive
  HTTP/1.1, one connection per worker, on raw asyncio sockets with the whole
  request (headers and body) pre-built; the binary form uses the binary
  tensor extension both ways.
- ``raw-sync`` / ``raw-async``: no server at all, see :mod:`bench.raw`.

With ``image`` (a JPEG or PNG file), ``grpc`` and ``rest-binary`` send that
file instead of a tensor, as OVMS clients send pictures: a BYTES input of
shape [1], typed ``bytes_contents`` over gRPC, one 4-byte length-prefixed
element over REST's binary extension; the server decodes and resizes it.

Only the first answer of a run is decoded and checked against the model;
every later one is checked for its status alone.

For the soak (:mod:`bench.soak`), ``sync`` makes several load generators
open their windows together: after the first answer each starts its
workers (the unmeasured warm-up), prints ``READY``, and waits for ``GO T``
on stdin, T being the CLOCK_MONOTONIC second (system-wide on Linux) when
recording starts. With ``window`` > 0 it also prints, before ``RESULT``,
``WINDOWS {json}``: count, errors by kind, p50, p99 and throughput over the
first and last ``window`` seconds, the whole run, and each consecutive
window (:func:`window_report`).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import struct
import sys
import time
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .specs import ModelSpec, spec_of

GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
TS_METHOD = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions"
#: Most latencies kept per run (a run is bounded by this many requests too).
MAX_REQUESTS = 2_000_000


@dataclass
class Case:
    kind: str  # grpc, ts-grpc, rest-json, rest-binary, raw-sync, raw-async
    model: str
    concurrency: int
    duration: float
    warmup: float = 1.0
    host: str = "127.0.0.1"
    port: int = 0
    model_path: str = ""  # raw kinds: the model.xml to compile
    plugin_config: dict = field(default_factory=dict)
    timeout: float = 30.0  # per request
    grpc_client: str = "h2"  # h2 (bench.h2grpc) or aio (grpcio's grpc.aio, to cross-check)
    max_requests: int = MAX_REQUESTS
    image: str = ""  # an encoded image file to send (BYTES [1]) instead of the model's tensor
    sync: bool = False  # READY, then wait for "GO <monotonic start>" on stdin (bench.soak)
    window: float = 0.0  # > 0: report per window of this many seconds too (the WINDOWS line)


@dataclass
class Stats:
    count: int = 0
    errors: int = 0
    elapsed: float = 0.0
    throughput: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    mean_ms: float = 0.0
    client_cpu_s: float = 0.0
    first_error: str = ""


class Recorder:
    """Latencies of the measured window; the warm-up is not recorded."""

    def __init__(self, max_requests: int) -> None:
        self.lat_ns: list[int] = []
        self.errors = 0
        self.first_error = ""
        self.recording = False
        self.max_requests = max_requests

    def ok(self, ns: int) -> None:
        if self.recording:
            self.lat_ns.append(ns)

    def error(self, what: str, kind: str = "") -> None:
        if self.recording:
            self.errors += 1
            self.first_error = self.first_error or what[:300]

    @property
    def full(self) -> bool:
        return len(self.lat_ns) + self.errors >= self.max_requests

    def stats(self, elapsed: float, cpu: float) -> Stats:
        lat = np.asarray(self.lat_ns, dtype=np.float64) / 1e6
        s = Stats(count=len(lat), errors=self.errors, elapsed=elapsed, client_cpu_s=cpu, first_error=self.first_error)
        if len(lat):
            s.throughput = len(lat) / elapsed
            s.p50_ms, s.p99_ms = (float(v) for v in np.percentile(lat, [50, 99]))
            s.mean_ms = float(lat.mean())
        return s


class TimedRecorder(Recorder):
    """Also when each answer came (CLOCK_MONOTONIC ns) and each error's kind, for per-window figures."""

    def __init__(self, max_requests: int) -> None:
        super().__init__(max_requests)
        self.done_ns = array("q")
        self.err_ns = array("q")
        self.err_kinds: list[str] = []

    def ok(self, ns: int) -> None:
        if self.recording:
            self.lat_ns.append(ns)
            self.done_ns.append(time.monotonic_ns())

    def error(self, what: str, kind: str = "") -> None:
        if self.recording:
            super().error(what, kind)
            self.err_ns.append(time.monotonic_ns())
            self.err_kinds.append(kind or error_kind(what))


def error_kind(detail: str) -> str:
    """The class of a failed request from what the calls below report: ``HTTP 503``,
    ``gRPC UNAVAILABLE``, ``timeout``, ``connection``, else the exception's name."""
    head = detail.split(":", 1)[0]
    if head.startswith("HTTP "):
        return head
    if head.startswith("gRPC status "):
        code = head.removeprefix("gRPC status ")
        return "gRPC " + GRPC_CODES.get(int(code), code) if code.isdigit() else head
    if head.isupper() and head.replace("_", "").isalpha():  # grpc.aio: "UNAVAILABLE: ..."
        return "gRPC " + head
    return head or "unknown"


def exception_kind(exc: BaseException) -> str:
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return "timeout"
    if isinstance(exc, (ConnectionError, OSError)):
        return "connection"
    return type(exc).__name__


GRPC_CODES = {1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
              6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
              10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
              15: "DATA_LOSS", 16: "UNAUTHENTICATED"}


def _window(lat_ms: np.ndarray, done: np.ndarray, err_t: np.ndarray, err_kinds: list[str],
            start: float, stop: float) -> dict:
    """Figures of the answers that came in [start, stop) seconds of the run."""
    ok = (done >= start) & (done < stop)
    bad = (err_t >= start) & (err_t < stop)
    kinds: dict[str, int] = {}
    for k in np.asarray(err_kinds, dtype=object)[bad]:
        kinds[k] = kinds.get(k, 0) + 1
    lat = lat_ms[ok]
    p50, p99 = (float(v) for v in np.percentile(lat, [50, 99])) if len(lat) else (0.0, 0.0)
    span = max(stop - start, 1e-9)
    return {"start": round(start, 3), "stop": round(stop, 3), "count": int(ok.sum()), "errors": int(bad.sum()),
            "error_kinds": kinds, "p50_ms": p50, "p99_ms": p99, "throughput": int(ok.sum()) / span}


def window_report(rec: TimedRecorder, start_ns: int, duration: float, window: float) -> dict:
    """first/last ``window`` seconds, the whole run, and every consecutive window (the last may be short)."""
    lat_ms = np.asarray(rec.lat_ns, dtype=np.float64) / 1e6
    done = (np.frombuffer(rec.done_ns, dtype=np.int64) - start_ns) / 1e9
    err_t = (np.frombuffer(rec.err_ns, dtype=np.int64) - start_ns) / 1e9
    window = min(window, duration)

    def one(a: float, b: float) -> dict:
        return _window(lat_ms, done, err_t, rec.err_kinds, a, b)

    edges = [*np.arange(0.0, duration, window), duration]
    return {"window": window, "duration": duration,
            "first": one(0.0, window), "last": one(duration - window, duration), "all": one(0.0, duration),
            "series": [one(a, b) for a, b in itertools.pairwise(edges) if b - a > 1e-6]}


def signal_line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# -- request bodies, built once ----------------------------------------------
def grpc_request(spec: ModelSpec, x: np.ndarray) -> bytes:
    from tritonclient.grpc import service_pb2 as pb

    req = pb.ModelInferRequest(model_name=spec.name)
    req.inputs.add(name=spec.input_name, datatype=spec.datatype, shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req.SerializeToString()


def grpc_image_request(spec: ModelSpec, image: bytes) -> bytes:
    """BYTES [1] of one encoded image in typed ``bytes_contents`` (OVMS's way), asking for the one output."""
    from tritonclient.grpc import service_pb2 as pb

    req = pb.ModelInferRequest(model_name=spec.name)
    tensor = req.inputs.add(name=spec.input_name, datatype="BYTES", shape=[1])
    tensor.contents.bytes_contents.append(image)
    req.outputs.add(name=spec.output_name)
    return req.SerializeToString()


def ts_request(spec: ModelSpec, image: bytes) -> bytes:
    """TorchServe's PredictionsRequest: the encoded image as input ``data`` (what its handlers read)."""
    from ovserve.client.proto import ts_inference as pb  # the client's private pool: no clash with test-time stubs

    return pb.PredictionsRequest(model_name=spec.name, input={"data": image}).SerializeToString()


def http_image_request(spec: ModelSpec, image: bytes, host: str, port: int) -> bytes:
    """BYTES [1] over the binary extension: one element, prefixed by its 4-byte little-endian length."""
    raw = struct.pack("<I", len(image)) + image
    tensor = {"name": spec.input_name, "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
    outputs = [{"name": spec.output_name, "parameters": {"binary_data": True}}]
    header = json.dumps({"inputs": [tensor], "outputs": outputs}, separators=(",", ":")).encode()
    body = header + raw
    head = (f"POST /v2/models/{spec.name}/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Length: {len(body)}\r\nInference-Header-Content-Length: {len(header)}\r\n"
            "Content-Type: application/octet-stream\r\n\r\n")
    return head.encode() + body


def http_request(spec: ModelSpec, x: np.ndarray, binary: bool, host: str, port: int) -> bytes:
    tensor = {"name": spec.input_name, "shape": list(x.shape), "datatype": spec.datatype}
    extra = ""
    if binary:
        raw = x.tobytes()
        tensor["parameters"] = {"binary_data_size": len(raw)}
        outputs = [{"name": spec.output_name, "parameters": {"binary_data": True}}]
        header = json.dumps({"inputs": [tensor], "outputs": outputs}, separators=(",", ":")).encode()
        body = header + raw
        extra = f"Inference-Header-Content-Length: {len(header)}\r\nContent-Type: application/octet-stream\r\n"
    else:
        tensor["data"] = x.reshape(-1).tolist()
        body = json.dumps({"inputs": [tensor]}, separators=(",", ":")).encode()
        extra = "Content-Type: application/json\r\n"
    head = (f"POST /v2/models/{spec.name}/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n")
    return head.encode() + body


# -- the first answer, decoded and checked -------------------------------------
def expected(spec: ModelSpec, x: np.ndarray) -> np.ndarray | None:
    return x + 1 if spec.name == "add" else None


def check_output(spec: ModelSpec, x: np.ndarray, y: np.ndarray) -> str:
    """'' when ``y`` is a plausible answer of the model to ``x``, else what is wrong."""
    want = expected(spec, x)
    if want is not None:
        return "" if y.shape == want.shape and np.allclose(y, want, atol=1e-2) else f"wrong values {y.reshape(-1)[:4]}"
    return "" if y.size == 1000 and np.isfinite(y).all() else f"unexpected output of shape {y.shape}"


def decode_grpc(data: bytes) -> np.ndarray:
    from tritonclient.grpc import service_pb2 as pb

    resp = pb.ModelInferResponse.FromString(data)
    out = resp.outputs[0]
    if resp.raw_output_contents:
        return np.frombuffer(resp.raw_output_contents[0], dtype=np.float32).reshape(tuple(out.shape))
    return np.asarray(out.contents.fp32_contents, dtype=np.float32).reshape(tuple(out.shape))


def check_ts_answer(data: bytes) -> str:
    """'' when ``data`` (a PredictionResponse) holds an image classifier's top 5, else what is wrong."""
    from ovserve.client.proto import ts_inference as pb  # the client's private pool: no clash with test-time stubs

    try:
        top = json.loads(pb.PredictionResponse.FromString(data).prediction)
    except ValueError as exc:
        return f"the prediction is not JSON: {exc}"
    probs = list(top.values()) if isinstance(top, dict) else []
    if len(probs) != 5 or not all(isinstance(p, float) and 0 <= p <= 1 for p in probs) or probs != sorted(
            probs, reverse=True):
        return f"not a top 5 of {{label: probability}} in descending order: {str(top)[:200]}"
    return ""


def decode_http(headers: bytes, body: bytes) -> np.ndarray:
    header_len = None
    for line in headers.split(b"\r\n"):
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"inference-header-content-length":
            header_len = int(v)
    doc = json.loads(body[:header_len] if header_len is not None else body)
    out = doc["outputs"][0]
    if header_len is not None:
        return np.frombuffer(body[header_len:], dtype=np.float32).reshape(out["shape"])
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


# -- HTTP/1.1 keep-alive connection on a raw asyncio socket --------------------
class HttpConnection(asyncio.Protocol):
    """One request at a time; answers framed by Content-Length or chunked."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future | None = None
        self.head_end = -1  # where the current answer's body starts, once its head is in
        self.length = -1  # its Content-Length; -1 while chunked

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection closed: {exc}"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.head_end < 0:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head_end = end + 4
            self.length = _content_length(bytes(self.buf[:end]))
        if self.length >= 0:
            stop = self.head_end + self.length
            if len(self.buf) >= stop:
                self._done(bytes(self.buf[self.head_end : stop]), stop)
        else:
            parsed = _dechunk(self.buf, self.head_end)
            if parsed is not None:
                self._done(*parsed)

    def _done(self, body: bytes, stop: int) -> None:
        head = bytes(self.buf[: self.head_end])
        del self.buf[:stop]
        self.head_end = self.length = -1
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((head, body))

    async def request(self, request: bytes, timeout: float) -> tuple[bytes, bytes]:
        """Send ``request`` and wait for the whole answer; on timeout the connection is closed."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.waiter = waiter = loop.create_future()
        timer = loop.call_later(timeout, self._expire, waiter)
        self.transport.write(request)
        try:
            return await waiter
        finally:
            timer.cancel()

    def _expire(self, waiter: asyncio.Future) -> None:
        if not waiter.done():
            waiter.set_exception(TimeoutError("no answer in time"))
            assert self.transport is not None
            self.transport.close()  # a late answer must not be read as the next one's


def _content_length(head: bytes) -> int:
    """The Content-Length of an answer's head; -1 when there is none (chunked)."""
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if len(k) == 14 and k.lower() == b"content-length":
            return int(v)
    return -1


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    """(body, end) of a complete chunked body starting at ``pos``; None while incomplete."""
    parts = []
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        if size == 0:
            end = buf.find(b"\r\n\r\n", eol)  # no trailers expected: the last chunk line, then an empty line
            return (b"".join(parts), end + 4) if end >= 0 else None
        start = eol + 2
        if len(buf) < start + size + 2:
            return None
        parts.append(bytes(buf[start : start + size]))
        pos = start + size + 2


# -- the closed loop ------------------------------------------------------------
Call = Callable[[], Awaitable[tuple[bool, object]]]


async def closed_loop(case: Case, calls: list[Call], rec: Recorder) -> Stats:
    """Run each call in its own worker until the window closes; returns the window's stats."""
    state = {"stop": False}

    async def worker(call: Call) -> None:
        clock = time.perf_counter_ns
        while not state["stop"] and not rec.full:
            t0 = clock()
            try:
                ok, detail = await call()  # each call bounds itself by case.timeout
            except Exception as exc:  # timeouts, resets: counted, then the next request
                rec.error(f"{type(exc).__name__}: {exc}", exception_kind(exc))
                await asyncio.sleep(0.01)
                continue
            if ok:
                rec.ok(clock() - t0)
            else:
                rec.error(str(detail))

    workers = [asyncio.create_task(worker(c)) for c in calls]
    if case.sync:
        await asyncio.sleep(max(await _go() - time.monotonic(), 0))
    else:
        await asyncio.sleep(case.warmup)
    rec.recording = True
    start_ns = time.monotonic_ns()
    signal_line("START")
    t0, cpu0 = time.perf_counter(), time.process_time()
    deadline = t0 + case.duration
    # Until the deadline, a full recorder (checked every 50 ms) or every worker done (at once).
    while (left := deadline - time.perf_counter()) > 0 and not rec.full:
        done, _ = await asyncio.wait(workers, timeout=min(0.05, left))
        if len(done) == len(workers):
            break
    rec.recording = False
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    signal_line("STOP")
    state["stop"] = True
    _, pending = await asyncio.wait(workers, timeout=case.timeout + 5)
    for w in pending:
        w.cancel()
    if case.window > 0 and isinstance(rec, TimedRecorder):
        signal_line("WINDOWS " + json.dumps(window_report(rec, start_ns, case.duration, case.window)))
    return rec.stats(elapsed, cpu)


async def _go() -> float:
    """READY, then the monotonic second of the start from the ``GO T`` line on stdin."""
    signal_line("READY")
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    word, _, value = line.partition(" ")
    if word != "GO":
        raise SystemExit(f"expected 'GO <start>' on stdin, got {line!r}")
    return float(value)


def recorder(case: Case) -> Recorder:
    return TimedRecorder(case.max_requests) if case.window > 0 else Recorder(case.max_requests)


async def checked_first(call: Call, check: Callable[[object], str]) -> str:
    """'' when the first answer passes ``check``, else why not."""
    try:
        ok, detail = await call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    if not ok:
        return str(detail)
    try:
        return check(detail)
    except Exception as exc:
        return f"cannot decode the answer: {type(exc).__name__}: {exc}"


async def first_answer(call: Call, spec: ModelSpec, x: np.ndarray, decode: Callable[[object], np.ndarray]) -> str:
    """'' when the first answer is the model's answer to ``x``, else why not."""
    return await checked_first(call, lambda detail: check_output(spec, x, decode(detail)))


def grpc_unary(case: Case, spec: ModelSpec, x: np.ndarray) -> tuple[str, bytes, Callable[[object], str]]:
    """The gRPC method, the request message and the first answer's check of a ``grpc`` or ``ts-grpc`` case."""
    if case.kind == "ts-grpc":
        if not case.image:
            raise SystemExit("ts-grpc sends an image: give the case an image file")
        return TS_METHOD, ts_request(spec, _image(case)), check_ts_answer  # type: ignore[return-value]
    payload = grpc_image_request(spec, _image(case)) if case.image else grpc_request(spec, x)
    return GRPC_METHOD, payload, lambda body: check_output(spec, x, decode_grpc(body))  # type: ignore[arg-type]


async def run_grpc(case: Case, spec: ModelSpec, x: np.ndarray) -> Stats:
    """A unary method (ModelInfer, or TorchServe's Predictions) on one HTTP/2 connection, as one gRPC channel
    would."""
    from . import h2grpc

    method, payload, check = grpc_unary(case, spec, x)
    conn = await h2grpc.connect(case.host, case.port)
    block = h2grpc.request_block(method, f"{case.host}:{case.port}")
    message = h2grpc.grpc_message(payload)

    async def call() -> tuple[bool, object]:
        status, text, body = await conn.call(block, message, case.timeout)
        return (True, body) if status == 0 else (False, f"gRPC status {status}: {text}")

    try:
        problem = await checked_first(call, check)
        if problem:
            return Stats(errors=1, first_error=f"first answer: {problem}")
        return await closed_loop(case, [call] * case.concurrency, recorder(case))
    finally:
        conn.close()


async def run_grpc_aio(case: Case, spec: ModelSpec, x: np.ndarray) -> Stats:
    """The same through grpcio's own client (dearer per call; for cross-checks)."""
    import grpc

    method, payload, check = grpc_unary(case, spec, x)
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    async with grpc.aio.insecure_channel(f"{case.host}:{case.port}", options=options) as channel:
        rpc = channel.unary_unary(method)

        async def call() -> tuple[bool, object]:
            try:
                return True, await rpc(payload, timeout=case.timeout)
            except grpc.aio.AioRpcError as exc:
                return False, f"{exc.code().name}: {exc.details()}"

        problem = await checked_first(call, check)
        if problem:
            return Stats(errors=1, first_error=f"first answer: {problem}")
        return await closed_loop(case, [call] * case.concurrency, recorder(case))


async def run_http(case: Case, spec: ModelSpec, x: np.ndarray) -> Stats:
    loop = asyncio.get_running_loop()
    if case.image:
        if case.kind != "rest-binary":
            raise SystemExit(f"images go over grpc or rest-binary, not {case.kind}")
        payload = http_image_request(spec, _image(case), case.host, case.port)
    else:
        payload = http_request(spec, x, case.kind == "rest-binary", case.host, case.port)
    conns: list[HttpConnection] = []
    for _ in range(case.concurrency):
        _, proto = await loop.create_connection(HttpConnection, case.host, case.port)
        conns.append(proto)

    def make_call(i: int) -> Call:
        async def call() -> tuple[bool, object]:
            conn = conns[i]
            if conn.transport is None or conn.transport.is_closing():
                _, conns[i] = await loop.create_connection(HttpConnection, case.host, case.port)
                conn = conns[i]
            head, body = await conn.request(payload, case.timeout)
            status = head[9:12]
            if status != b"200":
                return False, f"HTTP {status.decode(errors='replace')}: {body[:200]!r}"
            return True, (head, body)
        return call

    calls = [make_call(i) for i in range(case.concurrency)]
    try:
        problem = await first_answer(calls[0], spec, x, lambda d: decode_http(*d))  # type: ignore[misc]
        if problem:
            return Stats(errors=1, first_error=f"first answer: {problem}")
        return await closed_loop(case, calls, recorder(case))
    finally:
        for c in conns:
            if c.transport is not None:
                c.transport.close()


def _image(case: Case) -> bytes:
    return Path(case.image).read_bytes()


def run(case: Case) -> Stats:
    spec = spec_of(case.model)
    x = spec.sample()
    if case.kind.startswith("raw-"):
        from . import raw

        return raw.run(case, spec, x)
    if case.kind in ("grpc", "ts-grpc") and case.grpc_client == "aio":
        return asyncio.run(run_grpc_aio(case, spec, x))  # grpc.aio brings its own loop integration
    if case.kind in ("grpc", "ts-grpc"):
        return _run_loop(run_grpc(case, spec, x))
    if case.kind in ("rest-json", "rest-binary"):
        return _run_loop(run_http(case, spec, x))
    raise SystemExit(f"unknown kind {case.kind!r}")


def _run_loop(coro: Awaitable[Stats]) -> Stats:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop comes with ovserve on Linux
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]


def main(argv: list[str]) -> int:
    case = Case(**json.loads(argv[0]))
    stats = run(case)
    signal_line("RESULT " + json.dumps(asdict(stats)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
