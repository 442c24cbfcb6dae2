"""The ``loop`` gRPC engine's own HTTP/2 (server/transports/grpc/loop.py), the default, against a real server.

The protocol suites run on it through tests/test_grpc_engines.py and tests/test_grpc_stress.py (SIGTERM,
cancellations and deadlines, connections, streams, limits). Here: what only an engine that frames HTTP/2
itself can get wrong, driven from raw sockets where grpcio would never send it (hostile frames, a client
that gives the server a 1000-byte window) and from grpcio where a user would (compression, metadata,
unknown methods, a health Watch cancelled, a stream refused past the limit of streams).
"""
from __future__ import annotations

import shutil
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import hpack
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from . import models
from .clients import curl_grpc
from .h2frames import (
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Frame,
    data_frames,
    frame,
    grpc_message,
    split,
)
from .servers import EXACT, HOST, ServerProcess

TIMEOUT = 20.0
PROTOCOL_ERROR, COMPRESSION_ERROR = 1, 9
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@pytest.fixture(scope="module")
def loop_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    models.save(models.add_one(), repo, "add")
    access = tmp_path_factory.mktemp("log") / "access.log"  # the access log gives each call a request id
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", "--grpc-engine", "loop",
                          "--access-log", str(access), *EXACT])
    try:
        proc.wait_ready()
        assert "gRPC engine: loop (" in proc.wait_log("gRPC engine: ")
        yield proc
    finally:
        proc.stop()


def add_request(rows: int) -> bytes:
    req = pb.ModelInferRequest(model_name="add")
    tensor = req.inputs.add()
    tensor.name, tensor.datatype = "x", "FP32"
    tensor.shape.extend([rows, 16])
    req.raw_input_contents.append(np.arange(rows * 16, dtype=np.float32).tobytes())
    return grpc_message(req.SerializeToString())


def request_headers(path: str = "/inference.GRPCInferenceService/ModelInfer") -> bytes:
    return hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                   (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])


class RawConnection:
    """A bare HTTP/2 client on a socket: frames out as given, frames in as they come."""

    def __init__(self, server: ServerProcess, window: int | None = None, opening: bytes | None = None) -> None:
        """``opening``: the first bytes sent, in place of the preface and a SETTINGS frame (with
        INITIAL_WINDOW_SIZE ``window``, if given)."""
        self.sock = socket.create_connection((HOST, server.grpc_port), timeout=TIMEOUT)
        self.buf = b""
        self.decoder = hpack.Decoder()
        if opening is None:
            settings = b"" if window is None else struct.pack(">HI", 4, window)
            opening = PREFACE + frame(SETTINGS, 0, 0, settings)
        self.sock.sendall(opening)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frames(self, deadline: float) -> Iterator[Frame]:
        """Frames until the connection closes (or the deadline: a failure)."""
        while True:
            for one in split(self.buf)[0]:
                self.buf = self.buf[9 + len(one[3]):]  # taken as it is yielded: a caller may stop at any frame
                yield one
            assert time.monotonic() < deadline, "the server neither answered nor closed"
            try:
                chunk = self.sock.recv(1 << 16)
            except (TimeoutError, ConnectionResetError):
                return
            if not chunk:
                return
            self.buf += chunk

    def goaway(self) -> int:
        """The error code of the GOAWAY the server closes this connection with."""
        codes = [struct.unpack(">II", p[:8])[1] for k, _, _,
                 p in self.frames(time.monotonic() + TIMEOUT) if k == GOAWAY]
        assert codes, "the server closed without a GOAWAY"
        return codes[-1]

    def close(self) -> None:
        self.sock.close()


def assert_serving(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_target, options=OWN_CONNECTION) as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            pb.ModelInferRequest.FromString(add_request(2)[5:]), timeout=TIMEOUT)
    out = np.frombuffer(reply.raw_output_contents[0], np.float32)
    np.testing.assert_array_equal(out, np.arange(32, dtype=np.float32) + 1)


#: what a connection sends after its preface and SETTINGS (or, marked True, from its first byte), and the
#: GOAWAY error code it gets
HOSTILE = {
    "HTTP/1.1 on the gRPC port": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", PROTOCOL_ERROR, True),
    "a first frame that is not SETTINGS": (PREFACE + frame(PING, 0, 0, b"12345678"), PROTOCOL_ERROR, True),
    "HPACK that indexes past the table": (frame(HEADERS, END_HEADERS, 1, b"\xff\xff\x7f"), COMPRESSION_ERROR, False),
    "DATA on stream 0": (frame(DATA, 0, 0, b"x"), PROTOCOL_ERROR, False),
    "a stream with an even id": (frame(HEADERS, END_HEADERS, 2, request_headers()), PROTOCOL_ERROR, False),
    "DATA on a stream never opened": (frame(DATA, 0, 7, b"x"), PROTOCOL_ERROR, False),
    "a PING of 3 bytes": (frame(PING, 0, 0, b"abc"), 6, False),
    "a WINDOW_UPDATE of 0": (frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), PROTOCOL_ERROR, False),
    "padding longer than its frame": (frame(HEADERS, END_HEADERS | 0x8, 1, b"\x09abc"), PROTOCOL_ERROR, False),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_connection_is_closed_with_a_goaway_naming_the_fault_and_the_server_serves_on(
        loop_server: ServerProcess, case: str) -> None:
    data, code, from_first_byte = HOSTILE[case]
    conn = RawConnection(loop_server, opening=data if from_first_byte else None)
    if not from_first_byte:
        conn.send(data)
    try:
        assert conn.goaway() == code, case
    finally:
        conn.close()
    assert_serving(loop_server)


def test_a_client_with_a_1000_byte_window_gets_a_256_kb_reply_whole(loop_server: ServerProcess) -> None:
    """The server sends no more than the client's window and goes on as the client gives it back: 4096x16
    floats (256 KiB) through a 1000-byte stream window, WINDOW_UPDATEs sent for what arrived."""
    conn = RawConnection(loop_server, window=1000)
    try:
        conn.send(frame(HEADERS, END_HEADERS, 1, request_headers()) + frame(DATA, END_STREAM, 1, add_request(4096)))
        body, status, largest = b"", None, 0
        for kind, flags, sid, payload in conn.frames(time.monotonic() + TIMEOUT):
            if kind == DATA and sid == 1:
                body += payload
                largest = max(largest, len(payload))
                conn.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", len(payload)))
                          + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", len(payload))))
            elif kind == HEADERS and sid == 1:
                fields = dict(conn.decoder.decode(payload))
                if flags & END_STREAM:
                    status = fields.get("grpc-status")
                    break
        assert status == "0", status
        assert largest <= 1000, f"a DATA frame of {largest} bytes beyond the 1000-byte window"
        reply = pb.ModelInferResponse.FromString(body[5:])
        np.testing.assert_array_equal(np.frombuffer(reply.raw_output_contents[0], np.float32),
                                      np.arange(4096 * 16, dtype=np.float32) + 1)
    finally:
        conn.close()


@pytest.mark.parametrize("streams", [1024, 1030])
def test_streams_up_to_the_limit_are_answered_and_one_past_it_breaks_the_connection(loop_server: ServerProcess,
                                                                                    streams: int) -> None:
    """The server tells a client it may open 1024 streams at once: 1024 requests opened at once on one connection
    are all answered; a client that opens more has broken its word, and its connection ends with GOAWAY
    PROTOCOL_ERROR (h2's rule; RFC 9113 §5.1.2 and §5.4.1). The server serves on."""
    conn = RawConnection(loop_server)
    try:
        block, body = request_headers(), add_request(1)
        conn.send(b"".join(frame(HEADERS, END_HEADERS, 2 * i + 1, block) for i in range(streams)))
        conn.send(b"".join(frame(DATA, END_STREAM, 2 * i + 1, body) for i in range(streams)))
        ok, goaways = set(), []
        for kind, flags, sid, payload in conn.frames(time.monotonic() + TIMEOUT * 3):
            if kind == GOAWAY:
                goaways.append(struct.unpack(">II", payload[:8])[1])
                break
            if kind == HEADERS and flags & END_STREAM:
                assert dict(conn.decoder.decode(payload)).get("grpc-status") == "0"
                ok.add(sid)
            elif kind == HEADERS:
                conn.decoder.decode(payload)
            elif kind == DATA:
                conn.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", len(payload)))) if payload else None
            if len(ok) == streams:
                break
        if streams <= 1024:
            assert len(ok) == streams and not goaways, (len(ok), goaways)
        else:
            assert goaways == [PROTOCOL_ERROR], (len(ok), goaways)
    finally:
        conn.close()
    assert_serving(loop_server)


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_compressed_requests_are_answered(loop_server: ServerProcess, compression: grpc.Compression) -> None:
    with grpc.insecure_channel(loop_server.grpc_target, options=OWN_CONNECTION, compression=compression) as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            pb.ModelInferRequest.FromString(add_request(64)[5:]), timeout=TIMEOUT)
    np.testing.assert_array_equal(np.frombuffer(reply.raw_output_contents[0], np.float32),
                                  np.arange(64 * 16, dtype=np.float32) + 1)


def test_metadata_and_unknown_methods(loop_server: ServerProcess) -> None:
    """The request id comes back in the trailing metadata; binary metadata is taken; an unknown method is
    UNIMPLEMENTED naming it; a message that is not the method's is INTERNAL; the server serves on."""
    with grpc.insecure_channel(loop_server.grpc_target, options=OWN_CONNECTION) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        reply, call = stub.ModelInfer.with_call(
            pb.ModelInferRequest.FromString(add_request(1)[5:]), timeout=TIMEOUT,
            metadata=(("x-request-id", "abc-123"), ("blob-bin", b"\x00\xff\x10")))
        assert ("x-request-id", "abc-123") in tuple(call.trailing_metadata() or ())
        assert reply.model_name == "add"
        nope = channel.unary_unary("/inference.GRPCInferenceService/Nope")
        with pytest.raises(grpc.RpcError) as err:
            nope(b"", timeout=TIMEOUT)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED and "Nope" in (err.value.details() or "")
        garbage = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as err:
            garbage(b"\xff\xff\xff", timeout=TIMEOUT)
        assert err.value.code() == grpc.StatusCode.INTERNAL, err.value
    assert_serving(loop_server)


def test_a_health_watch_streams_until_the_client_cancels_it(loop_server: ServerProcess) -> None:
    with grpc.insecure_channel(loop_server.grpc_target, options=OWN_CONNECTION) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        with pytest.raises(grpc.RpcError) as err:
            next(watch)
        assert err.value.code() == grpc.StatusCode.CANCELLED
    assert_serving(loop_server)


@pytest.mark.timing  # a bound on time (tests/tiers.py): run alone
def test_a_deadline_shorter_than_the_call_ends_it_deadline_exceeded(tmp_path: Path) -> None:
    """grpc-timeout is the server's too: a handler still running at the deadline is cancelled and the call
    ends DEADLINE_EXCEEDED from the server (a raw client, which keeps no deadline of its own, reads it)."""
    repo = tmp_path / "repo"
    models.put_version(models.slow(4), repo / "s", 1)
    server = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", "--grpc-engine", "loop", *EXACT])
    try:
        server.wait_ready()
        conn = RawConnection(server)
        req = pb.ModelInferRequest(model_name="s")
        tensor = req.inputs.add()
        tensor.name, tensor.datatype = "x", "FP32"
        tensor.shape.extend([256, models.SLOW_K])
        req.raw_input_contents.append(np.ones((256, models.SLOW_K), np.float32).tobytes())
        body = req.SerializeToString()
        headers = hpack.Encoder().encode([
            (":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
            (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", "50m")])
        started = time.monotonic()
        conn.send(frame(HEADERS, END_HEADERS, 1, headers) + data_frames(1, grpc_message(body)))
        status = message = None
        for kind, flags, sid, payload in conn.frames(time.monotonic() + TIMEOUT):
            if kind == HEADERS and sid == 1 and flags & END_STREAM:
                fields = dict(conn.decoder.decode(payload))
                status, message = fields.get("grpc-status"), fields.get("grpc-message")
                break
        took = time.monotonic() - started
        conn.close()
        assert status == str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0]) and message == "Deadline Exceeded", status
        assert took < 5, took
    finally:
        server.stop()


def test_a_client_reset_cancels_its_call(loop_server: ServerProcess) -> None:
    """RST_STREAM mid-call: nothing more is sent on that stream, and the connection serves the next one."""
    conn = RawConnection(loop_server)
    try:
        conn.send(frame(HEADERS, END_HEADERS, 1, request_headers()) + frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))
        conn.send(frame(HEADERS, END_HEADERS, 3, request_headers()) + frame(DATA, END_STREAM, 3, add_request(1)))
        for kind, flags, sid, payload in conn.frames(time.monotonic() + TIMEOUT):
            assert sid != 1 or kind not in (HEADERS, DATA), "a reply on a stream the client reset"
            if kind == HEADERS:
                fields = dict(conn.decoder.decode(payload))
                if sid == 3 and flags & END_STREAM:
                    assert fields.get("grpc-status") == "0"
                    break
    finally:
        conn.close()



def test_requests_that_are_not_grpc_get_an_answer_saying_so(loop_server: ServerProcess) -> None:
    """On one connection: a JSON content type is answered HTTP 415; a GET is reset PROTOCOL_ERROR; a message
    compressed in an encoding the server does not take is UNIMPLEMENTED naming it; the next call is answered."""
    enc = hpack.Encoder()
    base = [(":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"), (":authority", "x")]
    conn = RawConnection(loop_server)
    try:
        conn.send(frame(HEADERS, END_HEADERS | END_STREAM, 1,
                        enc.encode([(":method", "POST"), *base, ("content-type", "application/json")])))
        conn.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, enc.encode([(":method", "GET"), *base])))
        body = add_request(1)
        conn.send(frame(HEADERS, END_HEADERS, 5, enc.encode([(":method", "POST"), *base, ("te", "trailers"),
                                                             ("content-type", "application/grpc"),
                                                             ("grpc-encoding", "snappy")]))
                  + frame(DATA, END_STREAM, 5, b"\x01" + body[1:]))
        conn.send(frame(HEADERS, END_HEADERS, 7, request_headers()) + frame(DATA, END_STREAM, 7, add_request(1)))
        seen: dict[int, Any] = {}
        for kind, flags, sid, payload in conn.frames(time.monotonic() + TIMEOUT):
            if kind == HEADERS:
                fields = dict(conn.decoder.decode(payload))
                if flags & END_STREAM:
                    seen[sid] = fields
            elif kind == RST_STREAM and sid == 3:
                seen[3] = struct.unpack(">I", payload)[0]
            if {1, 3, 5, 7} <= set(seen):
                break
        assert seen[1].get(":status") == "415", seen[1]
        assert seen[3] == PROTOCOL_ERROR
        assert seen[5].get("grpc-status") == str(grpc.StatusCode.UNIMPLEMENTED.value[0]), seen[5]
        assert "snappy" in seen[5].get("grpc-message", ""), seen[5]
        assert seen[7].get("grpc-status") == "0", seen[7]
    finally:
        conn.close()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_over_http2_is_answered_with_trailers(loop_server: ServerProcess, tmp_path: Path) -> None:
    """curl with HTTP/2 prior knowledge (h2c): a ModelInfer answered, and a call to a model that is not
    there answered NOT_FOUND in the trailers, as grpcio clients get them."""
    url = f"http://{HOST}:{loop_server.grpc_port}/inference.GRPCInferenceService/ModelInfer"
    fields, reply = curl_grpc(url, add_request(1), tmp_path, "--http2-prior-knowledge")
    assert fields.get("grpc-status") == "0" and fields.get("content-type") == "application/grpc", fields
    n = struct.unpack(">I", reply[1:5])[0]
    assert reply[0] == 0 and len(reply) == 5 + n
    out = pb.ModelInferResponse.FromString(reply[5:])
    np.testing.assert_array_equal(np.frombuffer(out.raw_output_contents[0], np.float32),
                                  np.arange(16, dtype=np.float32) + 1)
    missing = pb.ModelInferRequest(model_name="nope").SerializeToString()
    fields, reply = curl_grpc(url, b"\x00" + struct.pack(">I", len(missing)) + missing, tmp_path,
                               "--http2-prior-knowledge")
    assert fields.get("grpc-status") == str(grpc.StatusCode.NOT_FOUND.value[0]) and not reply, fields
    assert "nope" in fields.get("grpc-message", ""), fields


def test_a_second_message_on_a_unary_call_ends_it_at_once(loop_server: ServerProcess) -> None:
    """A unary method takes one request message, and its window is given back as it arrives (issue 33, item 8):
    so a byte past that message ends the call UNIMPLEMENTED then and there, before the client ends its stream,
    and a client cannot make one call hold message after message. The connection serves its next call."""
    conn = RawConnection(loop_server)
    try:
        body = add_request(1)
        conn.send(frame(HEADERS, END_HEADERS, 1, request_headers()) + frame(DATA, 0, 1, body + body[:7]))
        status = None
        for kind, flags, sid, payload in conn.frames(time.monotonic() + TIMEOUT):
            if kind == HEADERS and sid == 1 and flags & END_STREAM:
                fields = dict(conn.decoder.decode(payload))
                status, message = fields.get("grpc-status"), fields.get("grpc-message", "")
                break
        assert status == str(grpc.StatusCode.UNIMPLEMENTED.value[0]), status
        assert "one request message" in message, message
        conn.send(frame(HEADERS, END_HEADERS, 3, request_headers()) + frame(DATA, END_STREAM, 3, body))
        for kind, flags, sid, payload in conn.frames(time.monotonic() + TIMEOUT):
            if kind == HEADERS and sid == 3 and flags & END_STREAM:
                assert dict(conn.decoder.decode(payload)).get("grpc-status") == "0"
                break
            if kind == HEADERS:
                conn.decoder.decode(payload)
    finally:
        conn.close()
