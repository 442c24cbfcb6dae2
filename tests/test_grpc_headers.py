"""What the default gRPC engine refuses as malformed before any handler (server/transports/grpc/headers.py):
the rule itself, in process; tests/test_grpc_door.py sends the same as raw HTTP/2 frames to a real server."""
from __future__ import annotations

import pytest

from ovserve.server.transports.grpc.headers import QUOTED_NAME, header_bytes, malformed
from ovserve.server.transports.grpc.loop import malformed_request

UA = ("user-agent", "grpc-python/1.85.4 grpc-c/50.0.0 (linux; chttp2)")


@pytest.mark.parametrize("fields", [
    [], [UA], [UA, ("authorization", "Bearer abc"), ("x-request-id", "1-2")],
    [("x-tab-inside", "a\tb")], [("x-obs-text", "caf\xe9")], [("x-empty", "")],
    [("x-a-bin", b"\x00\r\n")],  # binary values are bytes, base64 on the wire
    [("!#$%&'*+-.^_`|~09az", "v")],
])
def test_well_formed_fields_pass(fields: list[tuple[str, object]]) -> None:
    assert malformed(fields) is None
    assert malformed(fields) is None  # names remembered as valid stay valid


@pytest.mark.parametrize("field, says", [
    (("connection", "close"), "connection-specific header field 'connection'"),
    (("transfer-encoding", "chunked"), "'transfer-encoding'"),
    (("upgrade", "h2c"), "'upgrade'"), (("keep-alive", "1"), "'keep-alive'"),
    (("proxy-connection", "x"), "'proxy-connection'"),
    (("x-a", "a\rb"), "invalid value of header field 'x-a'"), (("x-a", "a\nb"), "'x-a'"), (("x-a", "\x00"), "'x-a'"),
    (("x-a", " a"), "'x-a'"), (("x-a", "a "), "'x-a'"), (("x-a", "\ta"), "'x-a'"), (("x-a", "a\x7f"), "'x-a'"),
    (("X-A", "a"), "invalid header field name 'X-A'"), (("", "a"), "name ''"), (("x a", "a"), "'x a'"),
    ((":path", "/x"), "':path'"),
])
def test_malformed_fields_are_named(field: tuple[str, str], says: str) -> None:
    why = malformed([UA, field])
    assert why is not None and says in why, why


@pytest.mark.parametrize("name", ["authorization", "connection"])
def test_a_value_is_never_quoted(name: str) -> None:
    why = malformed([(name, "Bearer secret-token\r\n")])
    assert why is not None and "secret" not in why, why


def test_a_long_name_is_cut() -> None:
    why = malformed([("X" * 20_000, "a")])
    assert why is not None and "20000 characters" in why and len(why) < QUOTED_NAME + 200, why


def test_header_bytes_count_as_hpack_does() -> None:
    assert header_bytes([]) == 0
    assert header_bytes([("x-a", "abc")]) == 3 + 3 + 32
    assert header_bytes([("x-a", "é")]) == 3 + 2 + 32  # UTF-8 bytes, not characters
    assert header_bytes([("x-a-bin", b"\x00" * 4)]) == 7 + 8 + 32  # its base64 on the wire
    assert header_bytes([("x-big", "a" * (20 << 10))]) > 16 << 10


REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
           (b":authority", b"ovserve"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
           (b"user-agent", UA[1].encode())]


def test_the_loop_engine_takes_a_well_formed_request() -> None:
    assert malformed_request(REQUEST) is None
    assert malformed_request([*REQUEST, (b"x-a-bin", b"AAEC"), (b"x-obs", b"caf\xe9")]) is None


@pytest.mark.parametrize("fields, says", [
    ([(b":path", b"/x"), *REQUEST], "duplicate pseudo-header field b':path'"),
    ([(b":method", b"GET"), *REQUEST], "duplicate pseudo-header field b':method'"),
    ([(b":scheme", b"https"), *REQUEST], "duplicate pseudo-header field b':scheme'"),
    ([*REQUEST, (b":authority", b"other")], "b':authority'"),
    ([f for f in REQUEST if f[0] != b":authority"] + [(b":authority", b"late")], "b':authority'"),
    ([(b":status", b"200"), *REQUEST], "response-only headers {b':status'}"),
    ([(b":protocol", b"websocket"), *REQUEST], "b':protocol'"),
    ([*REQUEST, (b"te", b"gzip")], "Invalid value for TE header: b'gzip'"),
    ([*REQUEST, (b"connection", b"close")], "Connection-specific header field present: b'connection'"),
    ([*REQUEST, (b"x-a", b"a\r\nb")], "Illegal character"),
    ([*REQUEST, (b"x-a", b" a")], "surrounded by whitespace"),
    ([*REQUEST, (b"X-A", b"a")], "uppercase header name b'X-A'"),
    ([f for f in REQUEST if f[0] != b":path"], "b':path'"),
])
def test_the_loop_engine_finds_a_malformed_request(fields: list[tuple[bytes, bytes]], says: str) -> None:
    """Issue 33, item 5 on the loop engine: h2's rules for a request's fields (RFC 9113 §8.2-8.3), pseudo-headers
    and all, on the raw header list the engine decodes (each such stream is reset, never a call)."""
    why = malformed_request(fields)
    assert why is not None and says in why, why
