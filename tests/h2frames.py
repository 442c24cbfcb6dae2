"""HTTP/2 frames as the gRPC tests write and read them by hand (RFC 9113 §4.1: a 9-byte header, then the
payload), and a gRPC message as it travels in DATA frames.

Nothing here checks a frame: a test sends what no client library would (a PING of 3 bytes, DATA on stream 0,
a stream id with its reserved bit set, a length its payload does not have), which hyperframe refuses to
build. Where a test needs well-formed frames only, hyperframe builds them (tests/test_grpc_door.py).
"""
from __future__ import annotations

import struct

import hyperframe.frame

#: the client connection preface (RFC 9113 §3.4)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# frame types (RFC 9113 §6) and flags
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
#: the largest stream id (31 bits; the 32nd is reserved)
MAX_STREAM = (1 << 31) - 1

Frame = tuple[int, int, int, bytes]
"""A frame read: its type, flags, stream id (without the reserved bit) and payload."""


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame, its length taken from ``payload``; ``stream`` as given, reserved bit and all."""
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, kind, flags, stream) + payload


def data_frames(stream: int, payload: bytes, end_stream: bool = True, size: int = 16384) -> bytes:
    """``payload`` as DATA frames of at most ``size`` bytes (HTTP/2's default largest frame), the last with
    END_STREAM when ``end_stream``."""
    cuts = range(0, max(len(payload), 1), size)
    return b"".join(frame(0x0, 0x1 if end_stream and at + size >= len(payload) else 0, stream, payload[at:at + size])
                    for at in cuts)


def split(data: bytes) -> tuple[list[Frame], bytes]:
    """The whole frames at the start of ``data``, and the bytes after them (a frame not yet whole)."""
    frames, pos = [], 0
    while pos + 9 <= len(data):
        n = int.from_bytes(data[pos:pos + 3], "big")
        if pos + 9 + n > len(data):
            break
        stream = int.from_bytes(data[pos + 5:pos + 9], "big") & MAX_STREAM
        frames.append((data[pos + 3], data[pos + 4], stream, data[pos + 9:pos + 9 + n]))
        pos += 9 + n
    return frames, data[pos:]


def parsed(data: bytes) -> tuple[list[hyperframe.frame.Frame], int]:
    """The whole frames at the start of ``data`` as hyperframe parses them, and how many bytes they took."""
    out, at = [], 0
    while at + 9 <= len(data):
        parsed_frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(data[at:at + 9]))
        if at + 9 + length > len(data):
            break
        parsed_frame.parse_body(memoryview(data[at + 9:at + 9 + length]))
        out.append(parsed_frame)
        at += 9 + length
    return out, at


def grpc_message(body: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed): a zero byte, the length in four bytes, the body."""
    return struct.pack(">BI", 0, len(body)) + body
