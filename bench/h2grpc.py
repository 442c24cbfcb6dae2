"""A minimal gRPC unary client over HTTP/2 on a raw asyncio connection.

grpcio's Python client spends about as much CPU per call as the server it
measures; this one writes pre-built frames and costs a fraction of that, so
the load generator stays out of the way (docs/performance.md "How the
numbers are made").

What it does, and no more: the connection preface and SETTINGS (a 2^31-1
receive window, so the server never waits for us), one stream per call with
a stateless HPACK header block built once (literals without indexing),
DATA split by the peer's frame size and send windows, PING and SETTINGS
acknowledgements, connection WINDOW_UPDATEs for what we receive, and
``grpc-status``/``grpc-message`` read from the response headers with the
``hpack`` decoder (every block that can change its dynamic table is decoded).
"""
from __future__ import annotations

import asyncio
import struct

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY = 0x4, 0x8, 0x20
SET_ENABLE_PUSH, SET_INITIAL_WINDOW, SET_MAX_FRAME = 2, 4, 5
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW, DEFAULT_FRAME = 65535, 16384
RECV_UPDATE_AT = 1 << 24  # bytes received before we top up the connection window
CANCEL = 8


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, kind, flags, stream) + payload


def _string(s: str) -> bytes:
    raw = s.encode()
    assert len(raw) < 127
    return bytes([len(raw)]) + raw


def request_block(path: str, authority: str) -> bytes:
    """HPACK for a gRPC POST, using no dynamic table: reusable for every stream."""
    return (
        b"\x83"  # :method POST (static 3)
         b"\x86"  # :scheme http (static 6)
         b"\x04" + _string(path)  # :path, literal without indexing, name static 4
        + b"\x01" + _string(authority)  # :authority, name static 1
        + b"\x0f\x10" + _string("application/grpc")  # content-type, name static 31
        + b"\x00" + _string("te") + _string("trailers")
    )


def data_frames(sid: int, message: bytes, max_frame: int) -> bytes:
    """``message`` as DATA frames of at most ``max_frame`` bytes, the last one ending the stream."""
    if len(message) <= max_frame:
        return frame(DATA, END_STREAM, sid, message)
    view, parts = memoryview(message), []
    for at in range(0, len(message), max_frame):
        chunk = view[at:at + max_frame]
        last = at + max_frame >= len(message)
        n = len(chunk)
        parts += [struct.pack(">BHBBI", n >> 16, n & 0xFFFF, DATA, END_STREAM if last else 0, sid), chunk]
    return b"".join(parts)


def grpc_message(payload: bytes) -> bytes:
    """Length-prefixed, uncompressed gRPC message."""
    return b"\x00" + struct.pack(">I", len(payload)) + payload


class _Stream:
    __slots__ = ("body", "future", "message", "status", "window")

    def __init__(self, future: asyncio.Future, window: int) -> None:
        self.future = future
        self.body: list[bytes] = []
        self.status = -1
        self.message = ""
        self.window = window


class GrpcH2Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.decoder = hpack.Decoder()
        self.known: dict[bytes, list] = {}
        self.streams: dict[int, _Stream] = {}
        self.next_id = 1
        self.send_window = DEFAULT_WINDOW
        self.peer_initial = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_FRAME
        self.received = 0
        self.window_changed: asyncio.Event = asyncio.Event()
        self.partial: tuple[int, int, bytearray] | None = None  # HEADERS awaiting CONTINUATION
        self.closed: Exception | None = None

    # -- connection --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        settings = struct.pack(">HIHI", SET_ENABLE_PUSH, 0, SET_INITIAL_WINDOW, MAX_WINDOW)
        self.transport.write(PREFACE + frame(SETTINGS, 0, 0, settings)
                             + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW)))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(ConnectionError(f"connection lost: {exc}"))

    def _fail_all(self, exc: Exception) -> None:
        self.closed = exc
        streams, self.streams = self.streams, {}
        for s in streams.values():
            if not s.future.done():
                s.future.set_exception(exc)
        self.window_changed.set()

    @property
    def usable(self) -> bool:
        return self.closed is None and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- frames in -----------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 9:
            length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
            if end - pos < 9 + length:
                break
            kind, flags = buf[pos + 3], buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            payload = bytes(buf[pos + 9 : pos + 9 + length])
            pos += 9 + length
            self._frame(kind, flags, sid, payload)
        del buf[:pos]

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == DATA:
            self._data(flags, sid, payload)
        elif kind == HEADERS:
            self._headers(flags, sid, payload)
        elif kind == CONTINUATION and self.partial is not None:
            hflags, hsid, block = self.partial
            block += payload
            if flags & END_HEADERS:
                self.partial = None
                self._header_block(hflags, hsid, bytes(block))
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
        elif kind == PING:
            if not flags & ACK:
                self._write(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            inc = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if sid == 0:
                self.send_window += inc
            elif sid in self.streams:
                self.streams[sid].window += inc
            self.window_changed.set()
        elif kind == RST_STREAM:
            s = self.streams.pop(sid, None)
            if s is not None and not s.future.done():
                code = int.from_bytes(payload, "big")
                s.future.set_exception(ConnectionError(f"stream reset by the server (code {code})"))
        elif kind == GOAWAY:
            self._fail_all(ConnectionError("the server sent GOAWAY"))
            self.close()

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        self.received += len(payload)
        if self.received >= RECV_UPDATE_AT:
            self._write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.received)))
            self.received = 0
        s = self.streams.get(sid)
        if s is None:
            return
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        s.body.append(payload)
        if flags & END_STREAM:
            self._finish(sid)

    def _headers(self, flags: int, sid: int, payload: bytes) -> None:
        start, stop = 0, len(payload)
        if flags & PADDED:
            start, stop = 1, stop - payload[0]
        if flags & PRIORITY:
            start += 5
        block = payload[start:stop]
        if flags & END_HEADERS:
            self._header_block(flags, sid, block)
        else:
            self.partial = (flags, sid, bytearray(block))

    def _header_block(self, flags: int, sid: int, block: bytes) -> None:
        headers = self._decode(block)
        s = self.streams.get(sid)
        if s is None:
            return
        for name, value in headers:
            if name == b"grpc-status":
                s.status = int(value)
            elif name == b"grpc-message":
                s.message = value.decode(errors="replace")
        if flags & END_STREAM:
            self._finish(sid)

    def _decode(self, block: bytes) -> list:
        """HPACK-decode ``block``; a block of only 1-byte indexed fields cannot change the
        dynamic table, so its answer is remembered until a block that can change it."""
        if block and min(block) >= 0x80:
            headers = self.known.get(block)
            if headers is None:
                headers = self.known[block] = self.decoder.decode(block, raw=True)
            return headers
        self.known.clear()
        return self.decoder.decode(block, raw=True)

    def _settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == SET_INITIAL_WINDOW:
                delta, self.peer_initial = value - self.peer_initial, value
                for s in self.streams.values():
                    s.window += delta
            elif key == SET_MAX_FRAME:
                self.peer_max_frame = value
        self._write(frame(SETTINGS, ACK, 0))
        self.window_changed.set()

    def _finish(self, sid: int) -> None:
        s = self.streams.pop(sid, None)
        if s is not None and not s.future.done():
            s.future.set_result((s.status, s.message, b"".join(s.body)[5:]))

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # -- calls -----------------------------------------------------------------------
    async def call(self, block: bytes, message: bytes, timeout: float) -> tuple[int, str, bytes]:
        """One unary call: (grpc status, grpc message, response message bytes)."""
        if self.closed is not None:
            raise self.closed
        loop = asyncio.get_running_loop()
        sid, self.next_id = self.next_id, self.next_id + 2
        fut = loop.create_future()
        s = self.streams[sid] = _Stream(fut, self.peer_initial)
        timer = loop.call_later(timeout, self._expire, sid)
        try:
            head = frame(HEADERS, END_HEADERS, sid, block)
            n = len(message)
            if n <= self.send_window and n <= s.window:
                # the windows allow it all: every frame in one write (one syscall, not two per frame)
                self.send_window -= n
                s.window -= n
                self.transport.write(head + data_frames(sid, message, self.peer_max_frame))  # type: ignore[union-attr]
            else:
                self.transport.write(head)  # type: ignore[union-attr]
                await self._send_data(sid, s, memoryview(message))
            return await fut
        finally:
            timer.cancel()

    async def _send_data(self, sid: int, s: _Stream, view: memoryview) -> None:
        while len(view):
            size = min(len(view), self.peer_max_frame, self.send_window, s.window)
            if size <= 0:
                self.window_changed.clear()
                await self.window_changed.wait()
                if self.closed is not None or s.future.done():
                    return
                continue
            self.send_window -= size
            s.window -= size
            last = size == len(view)
            n = size
            self.transport.write(struct.pack(">BHBBI", n >> 16, n & 0xFFFF, DATA, END_STREAM if last else 0, sid))  # type: ignore[union-attr]
            self.transport.write(view[:size])  # type: ignore[union-attr]
            view = view[size:]

    def _expire(self, sid: int) -> None:
        s = self.streams.pop(sid, None)
        if s is not None and not s.future.done():
            self._write(frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL)))
            s.future.set_exception(TimeoutError("no answer in time"))


async def connect(host: str, port: int) -> GrpcH2Connection:
    _, conn = await asyncio.get_running_loop().create_connection(GrpcH2Connection, host, port)
    return conn
