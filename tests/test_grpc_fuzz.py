"""The gRPC door, fuzzed (issue 33): hypothesis-made HTTP/2 frame sequences against loop (the default engine,
which reads every frame itself) and grpcio (``ENGINES``).

One ``ovserve serve`` per engine, each sent the same examples. Each example opens a raw connection, sends the
client preface (now and then a wrong one) and a sequence of frames drawn from every type (HEADERS, CONTINUATION,
DATA, RST_STREAM, WINDOW_UPDATE, SETTINGS, PING, PRIORITY, GOAWAY, PUSH_PROMISE, an unknown type): valid and
invalid interleavings, stream ids, flags, lengths, window increments and settings values, header blocks that
decode to a gRPC call (well-formed or malformed) or do not decode at all. Then, in bounded time:

- the connection serves or closes: a PING is acknowledged and a well-formed call on a new stream is
  answered (its trailers or a RST_STREAM), or the server sends GOAWAY or closes the connection, within
  ``ANSWER_S``; never a hang;
- the server process is alive, and a well-behaved tritonclient call on a connection of its own succeeds;
- the server's resident memory stays within ``RSS_BOUND`` of what it was after warming up;
- the server's log has no traceback.

CI runs ``CI_EXAMPLES`` examples on each engine from one fixed seed (``CI_SEED``), about 10 s an engine on two
cores; locally ``OVSERVE_FUZZ_EXAMPLES=5000 pytest tests/test_grpc_fuzz.py`` runs more, from a random seed
(hypothesis prints the failing example and a blob to reproduce it).
"""
from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import hpack
import numpy as np
import psutil
import pytest
import tritonclient.grpc as tgrpc
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from . import models
from .h2frames import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_STREAM,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    grpc_message,
    split,
)
from .servers import ServerProcess

# the fuzz tier (tests/tiers.py MODULE_TIERS): pytest -m fuzz

METHOD = "/inference.GRPCInferenceService/ModelInfer"
#: how long the server has to answer (or close) once the sequence is sent
ANSWER_S = 5.0
#: how much the server's RSS may grow over the whole module, from its size after warming up
RSS_BOUND = 64 << 20
#: the engines fuzzed (--grpc-engine): loop, the default, and grpcio (native, an experimental extra, is not:
#: docs/operations.md "The gRPC door")
ENGINES = ["loop", "grpcio"]
#: examples in CI (fixed seed); OVSERVE_FUZZ_EXAMPLES=N runs N from a random seed
CI_EXAMPLES = 2000
_asked = os.environ.get("OVSERVE_FUZZ_EXAMPLES")
FUZZ = settings(max_examples=int(_asked) if _asked else CI_EXAMPLES, derandomize=not _asked,
                database=None if not _asked else settings.default.database, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
#: CI's fixed seed, the same on every engine, so that each is sent the same examples (``derandomize`` alone
#: derives a seed from the test's id, which names the engine)
CI_SEED = 33


def same_examples_on_every_engine(test: Callable[..., None]) -> Callable[..., None]:
    return test if _asked else seed(CI_SEED)(test)


def _message() -> bytes:
    req = pb.ModelInferRequest(model_name="add")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    req.raw_input_contents.append(np.arange(16, dtype=np.float32).tobytes())
    return grpc_message(req.SerializeToString())


MESSAGE = _message()
HEADER_LIST = [(":method", "POST"), (":scheme", "http"), (":path", METHOD), (":authority", "ovserve"),
               ("content-type", "application/grpc"), ("te", "trailers")]


def _block(fields: list[tuple[str, str]]) -> bytes:
    """A header block that indexes nothing (so it decodes the same whatever the server's table holds)."""
    return bytes(hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in fields], huffman=True))


# -- what a sequence is made of ---------------------------------------------------------------------------------

streams = st.one_of(st.sampled_from([1, 3, 5, 7, 9]), st.sampled_from([0, 2, 4]),
                    st.integers(0, MAX_STREAM), st.just(MAX_STREAM),
                    st.integers(1, MAX_STREAM).map(lambda s: s | 1 << 31))
any_flags = st.integers(0, 255)
u32 = st.one_of(st.sampled_from([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]), st.integers(0, 0xFFFFFFFF))

extra_fields = st.lists(st.one_of(
    st.tuples(st.sampled_from(["x-a", "authorization", "grpc-timeout", "grpc-encoding", "x-request-id",
                               "connection", "te", "upgrade", "X-Upper", ":path", ":status", ":foo", "x-bin-bin",
                               "content-length", "host", "grpc-accept-encoding"]),
              st.sampled_from(["", "1S", "gzip", "trailers", "a\r\nb", " x", "\x00", "Bearer t", "/x", "zzz",
                               "a" * 17000, "identity"])),
    st.tuples(st.text("abcxyz-:", min_size=0, max_size=8), st.text(max_size=16))), max_size=3)

header_blocks = st.one_of(
    st.just(HEADER_LIST).map(_block),
    extra_fields.map(lambda extra: _block([*HEADER_LIST, *extra])),
    st.permutations(HEADER_LIST).map(_block),
    st.binary(max_size=64),
)
grpc_bodies = st.one_of(
    st.just(MESSAGE),
    st.binary(max_size=5).map(lambda b: b"\x00" + b + MESSAGE[len(b) + 1:]),  # a prefix gone wrong
    st.sampled_from([b"\x00\xff\xff\xff\xff", b"\x01\x00\x00\x00\x10", b"\x00\x00\x00\x00\x00"]),
    st.binary(max_size=128),
    st.integers(0, 20000).map(lambda n: b"\x00" * n),  # past a window, or past the frame size
)


@st.composite
def padded(draw: st.DrawFn, payload: bytes, flags: int) -> tuple[bytes, int]:
    """``payload``, padded when the flags say so (a pad length that fits, or one that does not)."""
    if not flags & PADDED:
        return payload, flags
    pad = draw(st.integers(0, 300))
    return bytes([pad & 0xFF]) + payload + b"\x00" * draw(st.sampled_from([pad & 0xFF, 0])), flags


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["headers", "continuation", "data", "rst", "window", "settings", "ping",
                                 "priority", "goaway", "push", "unknown"]))
    stream = draw(streams)
    if kind == "headers":
        flags = draw(st.one_of(st.sampled_from([END_HEADERS, END_HEADERS | END_STREAM, 0, END_STREAM]), any_flags))
        block = draw(header_blocks)
        if flags & PRIORITY_FLAG:
            block = struct.pack(">IB", draw(u32), draw(st.integers(0, 255))) + block
        payload, flags = draw(padded(block, flags))
        return frame(HEADERS, flags, stream, payload)
    if kind == "continuation":
        flags = draw(st.one_of(st.sampled_from([END_HEADERS, 0]), any_flags))
        return frame(CONTINUATION, flags, stream, draw(header_blocks))
    if kind == "data":
        flags = draw(st.one_of(st.sampled_from([0, END_STREAM]), any_flags))
        payload, flags = draw(padded(draw(grpc_bodies), flags))
        return frame(DATA, flags, stream, payload)
    if kind == "rst":
        payload = draw(st.one_of(u32.map(lambda c: struct.pack(">I", c)), st.binary(max_size=8)))
        return frame(RST_STREAM, draw(st.sampled_from([0, 0xFF])), stream, payload)
    if kind == "window":
        payload = draw(st.one_of(u32.map(lambda c: struct.pack(">I", c)), st.binary(max_size=8)))
        return frame(WINDOW_UPDATE, 0, draw(st.one_of(st.just(0), streams)), payload)
    if kind == "settings":
        pairs = draw(st.lists(st.tuples(st.integers(0, 10), u32), max_size=4))
        payload = draw(st.one_of(st.just(b"".join(struct.pack(">HI", k, v) for k, v in pairs)), st.binary(max_size=13)))
        return frame(SETTINGS, draw(st.sampled_from([0, ACK, 0xFF])), draw(st.one_of(st.just(0), streams)), payload)
    if kind == "ping":
        payload = draw(st.one_of(st.binary(min_size=8, max_size=8), st.binary(max_size=12)))
        return frame(PING, draw(st.sampled_from([0, ACK])), draw(st.one_of(st.just(0), streams)), payload)
    if kind == "priority":
        payload = draw(st.one_of(st.builds(lambda d, w: struct.pack(">IB", d, w), st.one_of(st.just(stream), u32),
                                           st.integers(0, 255)), st.binary(max_size=8)))
        return frame(PRIORITY, 0, stream, payload)
    if kind == "goaway":
        payload = struct.pack(">II", draw(u32), draw(u32)) + draw(st.binary(max_size=16))
        return frame(GOAWAY, 0, draw(st.one_of(st.just(0), streams)), draw(st.one_of(st.just(payload),
                                                                                     st.binary(max_size=7))))
    if kind == "push":
        return frame(PUSH_PROMISE, END_HEADERS, stream, struct.pack(">I", 2) + _block(HEADER_LIST))
    return frame(draw(st.integers(10, 255)), draw(any_flags), stream, draw(st.binary(max_size=32)))


@st.composite
def well_behaved(draw: st.DrawFn) -> list[bytes]:
    """What a proper client might send: calls on increasing odd stream ids (some left open, some reset, some
    with their messages split or windows updated), SETTINGS, PING and PRIORITY frames with valid values."""
    out: list[bytes] = []
    stream = draw(st.sampled_from([1, 1, 1, 3, 101, MAX_STREAM - 4]))
    for _ in range(draw(st.integers(1, 4))):
        step = draw(st.sampled_from(["call", "call", "open", "reset", "split", "settings", "ping", "priority",
                                     "window"]))
        if step in ("call", "open", "reset", "split"):
            if stream > MAX_STREAM:
                break
            out.append(frame(HEADERS, END_HEADERS | (END_STREAM if draw(st.booleans()) and step == "open" else 0),
                             stream, draw(header_blocks)))
            body = draw(grpc_bodies)
            if step == "split":
                cut = draw(st.integers(0, len(body)))
                out += [frame(DATA, 0, stream, body[:cut]), frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", 1000)),
                        frame(DATA, END_STREAM, stream, body[cut:])]
            elif step == "reset":
                out += [frame(DATA, 0, stream, body), frame(RST_STREAM, 0, stream, struct.pack(">I", 8))]
            else:
                out.append(frame(DATA, END_STREAM if step == "call" else 0, stream, body))
            stream += 2
        elif step == "settings":
            pairs = draw(st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 5, 6]), st.integers(0, 1 << 20)), max_size=3))
            out.append(frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs
                                                      if (k != 2 or v <= 1) and (k != 5 or v >= 16384))))
        elif step == "ping":
            out.append(frame(PING, 0, 0, draw(st.binary(min_size=8, max_size=8))))
        elif step == "priority":
            out.append(frame(PRIORITY, 0, stream, struct.pack(">IB", max(0, stream - 2), draw(st.integers(0, 255)))))
        else:
            out.append(frame(WINDOW_UPDATE, 0, draw(st.sampled_from([0, max(1, stream - 2)])),
                             struct.pack(">I", draw(st.integers(1, 1 << 20)))))
    return out


@dataclass
class Sequence:
    preface: bytes
    frames: list[bytes]
    #: the highest client stream id the sequence names (a new call goes above it)
    top: int = 0


@st.composite
def sequences(draw: st.DrawFn) -> Sequence:
    """Mostly a proper preface, then a well-behaved client's frames with up to three frames of any kind put
    in among them (none, a third of the time), or frames of any kind alone."""
    preface = PREFACE + frame(SETTINGS, 0, 0, b"")
    wrong = draw(st.integers(0, 19))
    if wrong == 0:
        preface = draw(st.one_of(st.just(PREFACE), st.binary(max_size=30), st.just(PREFACE[:-1] + b"X")))
    if draw(st.integers(0, 4)) == 0:
        sent = draw(st.lists(frames(), min_size=1, max_size=12))
    else:
        sent = draw(well_behaved())
        for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
            sent.insert(draw(st.integers(0, len(sent))), draw(frames()))
    top = max((struct.unpack(">I", f[5:9])[0] & MAX_STREAM for f in sent), default=0)
    return Sequence(preface, sent, top)


# -- what the server answers ---------------------------------------------------------------------------------

@dataclass
class Reader:
    """The server's frames on one connection, by type, as they come (a 9-byte header and its payload)."""

    sock: socket.socket
    buffer: bytes = b""
    closed: bool = False
    seen: list[tuple[int, int, int, bytes]] = field(default_factory=list)

    def until(self, done: Callable[[int, int, int, bytes], object], seconds: float) -> bool:
        """Read until ``done(frame)`` is true of a frame (True), the connection ends (True) or ``seconds`` pass
        (False)."""
        deadline = time.monotonic() + seconds
        at = 0
        while True:
            while at < len(self.seen):
                kind, flags, stream, payload = self.seen[at]
                at += 1
                if kind == GOAWAY or done(kind, flags, stream, payload):
                    return True
            if self.closed:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(min(left, 0.5))
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:  # reset
                self.closed = True
                continue
            if not chunk:
                self.closed = True
                continue
            whole, self.buffer = split(self.buffer + chunk)
            self.seen += whole


def _send(sock: socket.socket, data: bytes) -> bool:
    sock.settimeout(2.0)
    try:
        sock.sendall(data)
    except OSError:  # closed by the server, or not reading (which the answer below then tells)
        return False
    return True


@dataclass
class Tally:
    """How the examples ended on one engine, for the last test to look at."""

    served: int = 0
    closed: int = 0
    examples: int = 0


def exchange(server: ServerProcess, seq: Sequence) -> str:
    """Send ``seq`` on a fresh connection, then a PING and a well-formed call above its streams; how the
    connection ended: ``served`` or ``closed``. Fails on a hang."""
    sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5)
    opaque = b"ovserve!"
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # no TIME_WAIT pile
        reader = Reader(sock)
        if not _send(sock, seq.preface + b"".join(seq.frames)) or not _send(sock, frame(PING, 0, 0, opaque)):
            assert reader.until(lambda *f: False, ANSWER_S), "the server neither read the sequence nor closed"
            return "closed"
        acked = reader.until(lambda k, fl, s, p: k == PING and fl & ACK and p == opaque, ANSWER_S)
        assert acked, f"no PING acknowledgement, GOAWAY or close in {ANSWER_S} s; got {_kinds(reader)}"
        if reader.closed or any(k == GOAWAY for k, *_ in reader.seen):
            return "closed"
        stream = (seq.top + 1) | 1 if seq.top + 2 <= MAX_STREAM else 0
        if not stream:
            return "served"  # no stream id left above the sequence's: the PING was the answer
        # the call's reply may need windows the sequence closed: open them to their initial sizes again
        call = (frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65535) + struct.pack(">HI", 5, 16384))
                + frame(HEADERS, END_HEADERS, stream, _block(HEADER_LIST)) + frame(DATA, END_STREAM, stream, MESSAGE))
        if not _send(sock, call):
            assert reader.until(lambda *f: False, ANSWER_S), "the server neither read the call nor closed"
            return "closed"
        answered = reader.until(lambda k, fl, s, p: s == stream and (k == RST_STREAM or (k == HEADERS
                                                                                          and fl & END_STREAM)),
                                ANSWER_S)
        assert answered, (f"the call on stream {stream} was neither answered nor the connection closed in "
                          f"{ANSWER_S} s; got {_kinds(reader)}")
        return "closed" if reader.closed or any(k == GOAWAY for k, *_ in reader.seen) else "served"
    finally:
        sock.close()


def _kinds(reader: Reader) -> list[tuple[int, int, int]]:
    return [(k, fl, s) for k, fl, s, _ in reader.seen[-12:]]


# -- the module's server and its well-behaved client ---------------------------------------------------------

@dataclass
class Target:
    server: ServerProcess
    client: tgrpc.InferenceServerClient
    process: psutil.Process
    rss_start: int
    log_checked: int = 0
    tally: Tally = field(default_factory=Tally)


@pytest.fixture(scope="module", params=ENGINES)
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    repo = tmp_path_factory.mktemp("fuzz")
    models.save(models.add_one(), repo, "add")
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", "--grpc-engine", request.param])
    try:
        proc.wait_ready()
        client = tgrpc.InferenceServerClient(proc.grpc_target)
        process = psutil.Process(proc.pid)
        for _ in range(20):  # warm up: the first calls allocate what every call then reuses
            _well_behaved(client)
        yield Target(proc, client, process, process.memory_info().rss)
        client.close()
    finally:
        proc.stop()


def _well_behaved(client: tgrpc.InferenceServerClient) -> None:
    x = tgrpc.InferInput("x", [1, 16], "FP32")
    x.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
    got = client.infer("add", [x], client_timeout=10).as_numpy("y")
    assert got is not None and np.array_equal(got.ravel(), np.arange(16, dtype=np.float32) + 1), got


@same_examples_on_every_engine
@FUZZ
@given(seq=sequences())
def test_any_frame_sequence_is_served_or_closed_never_hung(target: Target, seq: Sequence) -> None:
    note(f"preface {seq.preface!r}; frames {[f.hex() for f in seq.frames]}")
    ended = exchange(target.server, seq)
    target.tally.examples += 1
    target.tally.served += ended == "served"
    target.tally.closed += ended == "closed"
    assert target.server.alive(), target.server.log[-3000:]
    _well_behaved(target.client)
    rss = target.process.memory_info().rss
    assert rss - target.rss_start <= RSS_BOUND, f"RSS grew by {(rss - target.rss_start) >> 20} MiB"
    log = target.server.log
    assert "Traceback" not in log[target.log_checked:], log[target.log_checked:][-3000:]
    target.log_checked = max(0, len(log) - 20)


def test_the_fuzz_reached_past_the_preface(target: Target) -> None:
    """Not every example was cut off at the door: a fuzz that only ever saw GOAWAY tests little."""
    tally = target.tally
    if tally.examples == 0:
        pytest.skip("the fuzz test did not run")
    grown = target.process.memory_info().rss - target.rss_start
    print(f"\nfuzz: {tally}, RSS grown by {grown / (1 << 20):.1f} MiB")
    assert tally.served >= tally.examples // 5, tally
    assert tally.closed >= 1, tally
