"""The ``loop`` gRPC engine: HTTP/2 read and written by the event loop itself.

The native engine (pygrpc-native) reads its sockets on a Rust I/O thread and hands each call to a
Python dispatch thread, which hands it to the loop; the reply goes back the same way. With both
cores busy with inference, each hand-off waits for a CPU (docs/performance.md, "A gRPC engine on
the loop"). Here, as uvicorn does for REST, an :class:`asyncio.Protocol` per connection parses the
frames where they arrive and runs the call's handler as a task on the same loop.

What it serves: the surface of ``grpc.aio.Server`` that ovserve's listener uses (generic and
registered method handlers, an insecure port, start, stop with a grace period), every method
shape (unary and streaming requests and responses; a response-streaming handler may yield or call
``context.write``), invocation and trailing metadata (``-bin`` keys base64), ``grpc-timeout``
deadlines (DEADLINE_EXCEEDED), client cancellation (RST_STREAM cancels the handler's task), gzip
and deflate compressed requests, the receive limit (RESOURCE_EXHAUSTED naming both sizes), flow
control both ways (a stream's window is given back as its messages are consumed) and write
back-pressure, GOAWAY at stop, and TLS (an ``ssl.SSLContext`` offering ``h2`` by ALPN, the
listener's reloading one, server/tls.py) with the client's certificate in the auth context.

HTTP/2 (RFC 9113) is kept to what gRPC uses: no server push, no priorities (PRIORITY frames are
read and ignored), HPACK decoded with the ``hpack`` package and encoded without the dynamic table
(literals without indexing, built once for the fixed fields). A connection error is a GOAWAY with
its code, then the connection is closed; a stream error is a RST_STREAM.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import socket
import ssl
import struct
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
import hpack
import hpack.exceptions

from .headers import malformed

log = logging.getLogger("ovserve")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# frame types
DATA, HEADERS, PRIORITY_FRAME, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY = 0x4, 0x8, 0x20
# settings
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = \
    range(1, 7)
# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 6, 7, 8, 9

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW, DEFAULT_FRAME = 65535, 16384
#: what this server offers: a stream takes a 150 KB image in one round trip, and whole requests in
#: one frame (fewer frames to parse); the connection's window is given back as data arrives
STREAM_WINDOW = 16 << 20
CONNECTION_WINDOW = 1 << 30
LOCAL_MAX_FRAME = (1 << 24) - 1
#: streams open at once on one connection (grpcio sets no limit; a client past it is refused the stream)
MAX_STREAMS = 1024
#: the most header bytes (HPACK-decoded, RFC 9113 sizes) a request may send: grpcio's hard limit
MAX_HEADER_LIST = 16 << 10
#: bytes queued past which they are sent at once (see _Connection.write)
FLUSH_AT = 64 << 10
#: header blocks a connection remembers, and the longest remembered (see _Connection._decode): a block of
#: references is tens of bytes
MAX_BLOCKS, MAX_BLOCK = 32, 1024
#: the longest a whole reply is held for the others its read started (see _Connection.data_received)
HOLD_S = 0.001

_FRAME = struct.Struct(">BHBBI")
_PREFIX = struct.Struct(">BI")
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")
#: the pseudo-headers a request may carry, each at most once and before every regular field (RFC 9113 §8.3)
_REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
#: request headers that are HTTP/2 or gRPC's own, not the call's metadata (as grpcio leaves them out)
_NOT_METADATA = frozenset({b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding",
                           b"grpc-message-type", b"grpc-previous-rpc-attempts"})
_TIMEOUT_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}
#: grpc-message is percent-encoded outside printable ASCII (and '%' itself)
_PLAIN = frozenset(range(0x20, 0x7F)) - {ord("%")}


def malformed_request(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a request with these header fields is malformed (RFC 9113 §8.2-8.3), or None: a pseudo-header other
    than a request's, twice, or after a regular field; a ``te`` other than ``trailers``; and what
    :func:`.headers.malformed` refuses on grpcio (invalid names, connection-specific fields, control characters
    or white space at either end of a value). Issue 33, item 5: grpcio's core and ovserve's interceptor refuse
    these there; this engine sees every field, pseudo-headers too."""
    seen: set[bytes] = set()
    regular: list[tuple[str, str]] = []
    for name, value in headers:
        if name[:1] == b":":
            if regular:
                return f"pseudo-header {name[:64]!r} after a regular field"
            if name not in _REQUEST_PSEUDO or name in seen:
                return f"pseudo-header {name[:64]!r} unknown or repeated"
            seen.add(name)
        elif name == b"te" and value != b"trailers":
            return "te other than trailers"
        else:
            regular.append((name.decode("latin-1"), value.decode("latin-1")))
    return malformed(regular)


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _FRAME.pack(n >> 16, n & 0xFFFF, kind, flags, sid) + payload


def _hpack_length(n: int, prefix_bits: int = 7) -> bytes:
    """HPACK's integer with a ``prefix_bits`` prefix (RFC 7541 5.1), Huffman flag clear."""
    limit = (1 << prefix_bits) - 1
    if n < limit:
        return bytes([n])
    out = [limit]
    n -= limit
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """One header as an HPACK literal without indexing, with a new name: no dynamic table is touched."""
    return b"\x00" + _hpack_length(len(name)) + name + _hpack_length(len(value)) + value


#: ":status 200" (static table 8) and content-type application/grpc (a literal, name from static 31)
RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + _hpack_length(16) + b"application/grpc"


#: each status's grpc-status field
_STATUS = {code: literal(b"grpc-status", str(code.value[0]).encode()) for code in grpc.StatusCode}


def percent_encode(message: str) -> bytes:
    raw = message.encode()
    if all(b in _PLAIN for b in raw):
        return raw
    return b"".join(bytes([b]) if b in _PLAIN else b"%%%02X" % b for b in raw)


def parse_timeout(value: bytes) -> float | None:
    """grpc-timeout (1-8 digits and a unit) in seconds; None if it is not one."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1])
    return None if unit is None else int(value[:-1]) * unit


def _metadata_value(key: str, value: Any) -> bytes:
    if key.endswith("-bin"):
        raw = value if isinstance(value, bytes) else str(value).encode()
        return base64.b64encode(raw).rstrip(b"=")
    return value.encode() if isinstance(value, str) else bytes(value)


def _metadata_block(metadata: Iterable[tuple[str, Any]]) -> bytes:
    if not metadata:  # most calls (an empty list or tuple)
        return b""
    return b"".join(literal(k.lower().encode(), _metadata_value(k.lower(), v)) for k, v in metadata)


class _Aborted(grpc.aio.AbortError):
    """What ``context.abort`` raises: the call ends with the status it set."""


class _Refused(Exception):
    """A request message this server cannot take: the call ends with ``code``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class _ConnectionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Context:
    """The ``grpc.aio.ServicerContext`` a handler gets (the methods ovserve's servicers, grpc's health and
    reflection servicers use)."""

    def __init__(self, call: _Call) -> None:
        self._call = call
        self._metadata: tuple[tuple[str, Any], ...] | None = None
        self._trailing: tuple[tuple[str, Any], ...] = ()
        self._initial: tuple[tuple[str, Any], ...] = ()
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._callbacks: list[Callable[[Any], None]] = []

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        if self._metadata is None:
            items: list[tuple[str, Any]] = []
            for k, v in self._call.headers:
                if k[:1] == b":" or k in _NOT_METADATA:
                    continue
                key = k.decode("latin-1")
                if key.endswith("-bin"):
                    try:
                        items.append((key, base64.b64decode(v + b"=" * (-len(v) % 4))))
                    except ValueError:
                        continue
                else:
                    items.append((key, v.decode("latin-1")))
            self._metadata = tuple(items)
        return self._metadata

    def peer(self) -> str:
        return self._call.conn.peer

    def peer_identities(self) -> list[bytes] | None:
        """As grpcio: the names a client certificate was verified for (its subject alternative names,
        else its common name); None without one."""
        key = self.peer_identity_key()
        return None if key is None else self.auth_context()[key]

    def peer_identity_key(self) -> str | None:
        auth = self.auth_context()
        for key in ("x509_subject_alternative_name", "x509_common_name"):
            if auth.get(key):
                return key
        return None

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._call.conn.auth()

    def time_remaining(self) -> float | None:
        deadline = self._call.deadline_at
        return None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())

    def cancelled(self) -> bool:
        return self._call.reset

    def done(self) -> bool:
        return self._call.finished

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._callbacks.append(callback)

    def set_trailing_metadata(self, metadata: Iterable[tuple[str, Any]]) -> None:
        self._trailing = tuple(metadata)

    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._trailing

    async def send_initial_metadata(self, metadata: Iterable[tuple[str, Any]]) -> None:
        self._initial = tuple(metadata)
        self._call.send_headers()

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_details(self, details: str) -> None:
        self._details = details

    def details(self) -> str:
        return self._details

    def set_compression(self, compression: Any) -> None:
        pass  # replies go out uncompressed

    def disable_next_message_compression(self) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Iterable[tuple[str, Any]] = ()) -> None:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort() with OK")
        self._code, self._details = code, details
        trailing = tuple(trailing_metadata)
        if trailing:
            self._trailing = trailing
        raise _Aborted()

    async def write(self, message: Any) -> None:
        await self._call.send_message(self._call.serialize(message))

    async def read(self) -> Any:
        return await self._call.next_request()


class _Call:
    """One stream: its request's headers and messages, its handler's task, its reply."""

    def __init__(self, conn: _Connection, sid: int, headers: list[tuple[bytes, bytes]], path: bytes,
                 handler: Any, timeout: bytes | None = None, encoding: bytes = b"identity") -> None:
        self.conn, self.sid, self.headers, self.path, self.handler = conn, sid, headers, path, handler
        self.inbox = bytearray()
        self.messages: deque[tuple[bytes | memoryview, int]] = deque()  # (message, its bytes on the wire)
        self.arrived: asyncio.Event | None = None  # set when a message or the end arrives (streaming requests)
        self.batch = 0  # the connection's read that started the handler (see _Connection.data_received)
        self.remote_done = False  # END_STREAM received
        self.reset = False  # RST_STREAM received, or the connection is gone
        self.finished = False  # trailers sent
        self.headers_sent = False
        self.window = conn.peer_initial_window  # what we may still send on it
        self.unacked = 0  # bytes received and not yet given back to the stream's window
        self.consumed = 0  # of them, bytes whose messages the handler has taken
        self.task: asyncio.Task[None] | None = None
        self.deadline_at: float | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.deadline_hit = False
        self.encoding = encoding
        self.context = Context(self)
        # as grpcio: a handler without a (de)serializer takes and gives the message's bytes
        self.deserialize: Callable[[Any], Any] = (handler and handler.request_deserializer) or bytes
        self.serialize: Callable[[Any], bytes] = (handler and handler.response_serializer) or bytes
        seconds = None if timeout is None else parse_timeout(timeout)
        if seconds is not None:
            self.deadline_at = conn.loop.time() + seconds
            self.deadline = conn.loop.call_at(self.deadline_at, self._expire)

    # -- requests ----------------------------------------------------------------
    def received(self, data: bytes) -> None:
        """DATA for this stream, cut into messages. A message over the limit, or one that cannot be
        decompressed, ends the call."""
        if self.finished:
            return
        inbox = self.inbox
        limit = self.conn.server.max_receive
        if not inbox and len(data) >= 5:  # the usual unary request: one whole message in one frame
            flag, n = _PREFIX.unpack_from(data)
            if len(data) == 5 + n and not flag and (limit < 0 or n <= limit):
                self.messages.append((memoryview(data)[5:], 5 + n))
                if self.arrived is not None:
                    self.arrived.set()
                return
        inbox += data
        while len(inbox) >= 5:
            flag, n = _PREFIX.unpack_from(inbox)
            if limit >= 0 and n > limit:
                self.refuse(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"Received message larger than max ({n} vs. {limit})")
                return
            if len(inbox) < 5 + n:
                break
            body = bytes(inbox[5:5 + n])
            del inbox[:5 + n]
            if flag:
                try:
                    body = self._decompress(body, limit)
                except _Refused as exc:
                    self.refuse(exc.code, exc.message)
                    return
            self.messages.append((body, 5 + n))
        if self.arrived is not None:
            self.arrived.set()

    def _decompress(self, body: bytes, limit: int) -> bytes:
        encoding = self.encoding
        if encoding == b"gzip":
            wbits = 16 + zlib.MAX_WBITS
        elif encoding == b"deflate":
            wbits = zlib.MAX_WBITS
        else:
            raise _Refused(grpc.StatusCode.UNIMPLEMENTED,
                           f"a compressed message in grpc-encoding {encoding.decode('latin-1')!r}, which this server "
                           "does not take (gzip, deflate)")
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(body, limit + 1 if limit >= 0 else 0)
        except zlib.error as exc:
            raise _Refused(grpc.StatusCode.INTERNAL, f"cannot decompress the message: {exc}") from None
        if limit >= 0 and len(out) > limit:
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"Received message larger than max ({len(out)}+ vs. {limit}) once decompressed")
        return out

    def ended(self) -> None:
        self.remote_done = True
        if self.arrived is not None:
            self.arrived.set()

    async def next_request(self) -> Any:
        """The next request message (a streaming request), or grpc.aio.EOF once the client is done."""
        while not self.messages:
            if self.reset:
                raise asyncio.CancelledError()
            if self.remote_done:
                if self.inbox:
                    await self.context.abort(grpc.StatusCode.INTERNAL, "the request ended inside a message")
                return grpc.aio.EOF
            assert self.arrived is not None
            self.arrived.clear()
            await self.arrived.wait()
        body, wire = self.messages.popleft()
        self.conn.consumed(self, wire)
        try:
            return self.deserialize(body)
        except Exception as exc:
            await self.context.abort(grpc.StatusCode.INTERNAL, f"cannot parse the request message: {exc}")

    async def requests(self) -> AsyncIterator[Any]:
        while True:
            message = await self.next_request()
            if message is grpc.aio.EOF:
                return
            yield message

    def cancel(self) -> None:
        """The client reset the stream, or the connection is gone: the handler is cancelled, nothing is sent."""
        self.reset = True
        if self.arrived is not None:
            self.arrived.set()
        if self.task is not None:
            self.task.cancel()
        elif self.deadline is not None:
            self.deadline.cancel()

    # -- the handler ---------------------------------------------------------------
    def start(self) -> None:
        self.batch = self.conn.started = self.conn.reads  # calls start only while a read's frames are handled
        self.task = self.conn.loop.create_task(self.run())

    async def run(self) -> None:
        handler, context = self.handler, self.context
        code, details = grpc.StatusCode.OK, ""
        try:
            try:
                if handler.request_streaming:
                    request: Any = self.requests()
                else:
                    request = self.single_request()
                    if request is None:
                        return
                if handler.response_streaming:
                    fn = handler.unary_stream or handler.stream_stream
                    replies = fn(request, context)
                    if hasattr(replies, "__aiter__"):
                        try:
                            async for reply in replies:
                                await self.send_message(self.serialize(reply))
                        finally:  # its own finally (the call counted in flight) runs now, not at collection
                            aclose = getattr(replies, "aclose", None)
                            if aclose is not None:
                                await aclose()
                    else:  # a coroutine that writes with context.write (grpc's health Watch)
                        await replies
                else:
                    fn = handler.unary_unary or handler.stream_unary
                    reply = fn(request, context)
                    if hasattr(reply, "__await__"):
                        reply = await reply
                    if context._code in (None, grpc.StatusCode.OK):
                        await self.send_message(self.serialize(reply))
                code, details = context._code or grpc.StatusCode.OK, context._details
            except grpc.aio.AbortError:
                code, details = context._code or grpc.StatusCode.UNKNOWN, context._details
            except asyncio.CancelledError:
                if not self.deadline_hit:
                    raise  # the client reset the stream or the connection went: nobody to answer
                code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
            except Exception as exc:
                log.error("gRPC %s: unexpected error", self.path.decode("latin-1"), exc_info=exc)
                code, details = grpc.StatusCode.UNKNOWN, f"Unexpected error: {type(exc).__name__}"
            self.finish(code, details, context._trailing)
        except asyncio.CancelledError:
            pass
        finally:
            if self.deadline is not None:
                self.deadline.cancel()
            for callback in context._callbacks:
                try:
                    callback(context)
                except Exception:
                    log.exception("gRPC done callback failed")
            self.conn.forget(self)

    def single_request(self) -> Any:
        """The one message of a unary request, deserialized; None if the call was already answered here."""
        if self.inbox:
            self.refuse(grpc.StatusCode.INTERNAL, "the request ended inside a message")
            return None
        if len(self.messages) != 1:
            self.refuse(grpc.StatusCode.UNIMPLEMENTED if self.messages else grpc.StatusCode.INTERNAL,
                        f"a unary method takes one request message, not {len(self.messages)}")
            return None
        body, _ = self.messages.popleft()
        try:
            return self.deserialize(body)
        except Exception as exc:
            self.refuse(grpc.StatusCode.INTERNAL, f"cannot parse the request message: {exc}")
            return None

    def _expire(self) -> None:
        self.deadline = None
        if self.finished or self.reset:
            return
        self.deadline_hit = True
        if self.task is not None and not self.task.done():
            self.task.cancel()
        else:
            self.refuse(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    # -- the reply -------------------------------------------------------------------
    def send_headers(self) -> None:
        if not self.headers_sent:
            self.headers_sent = True
            block = RESPONSE_HEADERS + _metadata_block(self.context._initial)
            self.conn.write(frame(HEADERS, END_HEADERS, self.sid, block))

    async def send_message(self, body: bytes) -> None:
        if self.finished or self.reset:
            raise asyncio.CancelledError()
        self.send_headers()
        await self.conn.send_data(self, _PREFIX.pack(0, len(body)) + body)
        if self.handler.response_streaming:  # each message of a stream goes now; a unary reply with its trailers
            self.conn.flush()

    def finish(self, code: grpc.StatusCode, details: str, trailing: Iterable[tuple[str, Any]]) -> None:
        """Trailers (with the headers, if none went out: trailers-only), and the stream is done."""
        if self.finished or self.reset:
            return
        self.finished = True
        parts = [] if self.headers_sent else [RESPONSE_HEADERS]
        self.headers_sent = True
        parts.append(_STATUS[code])
        if details:
            parts.append(literal(b"grpc-message", percent_encode(details)))
        parts.append(_metadata_block(trailing))
        out = frame(HEADERS, END_HEADERS | END_STREAM, self.sid, b"".join(parts))
        if not self.remote_done:  # answered before the request ended: the client may stop sending
            out += frame(RST_STREAM, 0, self.sid, _U32.pack(NO_ERROR))
        conn = self.conn
        conn.write(out)
        if not self.batch or self.batch != conn.held:
            conn.flush()  # the reply is whole: sent now, not a turn of the loop later
        elif conn.held_since is None:  # it goes with the others its read started (_Connection.data_received)
            conn.held_since = time.perf_counter()
        elif time.perf_counter() - conn.held_since >= HOLD_S:  # those held go: the others take too long
            conn.flush()

    def refuse(self, code: grpc.StatusCode, details: str) -> None:
        """End the call from here (not its handler's): a limit, a bad message, a deadline before the start."""
        self.finish(code, details, ())
        if self.task is not None and not self.task.done():
            self.task.cancel()
        elif self.task is None:
            self.conn.forget(self)


class _Connection(asyncio.Protocol):
    """One client connection: frames in, the calls' frames out."""

    def __init__(self, server: LoopServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.buffer = bytearray()
        self.preface_seen = False
        self.settings_seen = False
        self.decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        #: header blocks that left the HPACK table as it was, and their fields, while it stays so (_decode)
        self.blocks: dict[bytes, tuple[list[tuple[bytes, bytes]], dict[bytes, bytes], str | None]] = {}
        self.calls: dict[int, _Call] = {}
        self.last_sid = 0
        self.headers_pending: tuple[int, int, bytearray] | None = None  # HEADERS waiting for CONTINUATION
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_FRAME
        self.recv_unacked = 0
        self.window_open = asyncio.Event()  # set whenever a send window may have grown
        self.writable = asyncio.Event()
        self.writable.set()
        self.going_away = False  # GOAWAY sent or received: no new streams
        self.closed = False
        self._auth: dict[str, list[bytes]] | None = None
        #: frames queued, sent together by :meth:`flush` (see :meth:`write`)
        self.out: list[bytes | memoryview] = []
        self.out_bytes = 0
        #: reads so far (each a batch of frames), and the one whose calls' replies are held (0: none)
        self.reads = 0
        self.started = 0  # the last read that started a call's handler
        self.held = 0
        self.held_since: float | None = None  # when the oldest reply queued was held

    # -- asyncio.Protocol ----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            host = str(peer[0])
            if host.startswith("::ffff:") and "." in host:  # an IPv4 client of a dual-stack socket
                host = host[7:]
            self.peer = f"ipv6:[{host}]:{peer[1]}" if ":" in host else f"ipv4:{host}:{peer[1]}"
        else:
            self.peer = f"unix:{peer}"
        settings = b"".join(_SETTING.pack(k, v) for k, v in (
            (ENABLE_PUSH, 0), (MAX_CONCURRENT_STREAMS, MAX_STREAMS), (INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (MAX_FRAME_SIZE, LOCAL_MAX_FRAME), (MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST)))
        self.write(frame(SETTINGS, 0, 0, settings)
                   + frame(WINDOW_UPDATE, 0, 0, _U32.pack(CONNECTION_WINDOW - DEFAULT_WINDOW)))
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.cancel()
        self.window_open.set()
        self.writable.set()
        self.server.changed()

    def auth(self) -> dict[str, list[bytes]]:
        """The connection's auth context: empty in plain text; over TLS the transport, and a verified client
        certificate's names under grpcio's keys."""
        if self._auth is None:
            ssl_object = None if self.transport is None else self.transport.get_extra_info("ssl_object")
            auth: dict[str, list[bytes]] = {}
            if ssl_object is not None:
                auth["transport_security_type"] = [b"ssl"]
                auth["security_level"] = [b"TSI_PRIVACY_AND_INTEGRITY"]
                cert = ssl_object.getpeercert() or {}
                names = [v.encode() for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"]
                alt = [v.encode() for k, v in cert.get("subjectAltName", ()) if k in ("DNS", "IP Address", "URI",
                                                                                      "email")]
                if names:
                    auth["x509_common_name"] = names
                if alt:
                    auth["x509_subject_alternative_name"] = alt
            self._auth = auth
        return self._auth

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        """A read's frames. The calls it completes start their handlers, which run in this order at the next
        turn of the loop; their replies are held until each has run to its first wait (:meth:`_release`,
        queued behind them now), so that the replies of calls that answer at once (a model inferred inline,
        a refusal) leave in one send. Nothing else waits in between: what the loop had queued before runs
        before the handlers, and what it queues after runs after the release."""
        self.reads += 1
        try:
            self._frames(data)
            if self.started == self.reads:  # this read started handlers
                self.held = self.reads
                self.loop.call_soon(self._release, self.reads)
            self.flush()  # what reading these frames wrote (SETTINGS and PING acknowledgements, refusals, ...)
        except _ConnectionError as exc:
            self.fail(exc.code, str(exc))
        except hpack.exceptions.OversizedHeaderListError:
            self.fail(PROTOCOL_ERROR, "header list too large")
        except hpack.exceptions.HPACKError as exc:
            self.fail(COMPRESSION_ERROR, f"HPACK: {exc}")
        except Exception as exc:  # a defect here: the connection goes, the server stays
            log.error("gRPC connection from %s: unexpected error", self.peer, exc_info=exc)
            self.fail(INTERNAL_ERROR, "internal error")

    def write(self, data: bytes | memoryview) -> None:
        """Queue ``data``; :meth:`flush` sends what is queued in one send (one TLS record): a unary reply's
        HEADERS, DATA and trailers when the call finishes (or, for calls one read started that answer at once,
        together once their handlers have each run to a wait, at most HOLD_S after the first: see
        :meth:`data_received`), a stream's message when it is written, what reading a batch of frames wrote
        when the batch is read, and anything else at the next turn of the loop. A reply is never held for the
        rest of a turn: under load a turn of the loop takes milliseconds."""
        if not self.closed and self.transport is not None:
            if not self.out:
                self.loop.call_soon(self.flush)
            self.out.append(data)
            self.out_bytes += len(data)
            if self.out_bytes >= FLUSH_AT:  # large replies go at once, so the transport's back-pressure holds
                self.flush()

    def flush(self) -> None:
        out, self.out, self.out_bytes, self.held_since = self.out, [], 0, None
        if out and not self.closed and self.transport is not None:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _release(self, read: int) -> None:
        """The handlers ``read`` started have each run to their first wait: what they answered goes now."""
        if self.held == read:
            self.held = 0
        self.flush()

    def fail(self, code: int, message: str) -> None:
        """A connection error: GOAWAY saying why, then the connection is closed."""
        log.debug("gRPC connection from %s closed: %s", self.peer, message)
        self.write(frame(GOAWAY, 0, 0, _U32.pack(self.last_sid) + _U32.pack(code) + message.encode()[:256]))
        self.flush()
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    # -- frames in -------------------------------------------------------------------
    def _frames(self, data: bytes) -> None:
        if self.closed:
            return
        buf = self.buffer
        buf += data
        pos = 0
        if not self.preface_seen:
            if len(buf) < len(PREFACE):
                if not PREFACE.startswith(bytes(buf)):
                    raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface (is this gRPC?)")
                return
            if buf[:len(PREFACE)] != PREFACE:
                raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface (is this gRPC?)")
            self.preface_seen = True
            pos = len(PREFACE)
        end = len(buf)
        view = memoryview(buf)  # each payload copied out once (a bytearray slice would copy twice)
        try:
            # a frame's 24-bit length cannot pass LOCAL_MAX_FRAME (2^24-1), the most HTTP/2 allows
            while end - pos >= 9 and not self.closed:
                length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
                if end - pos < 9 + length:
                    break
                kind, flags = buf[pos + 3], buf[pos + 4]
                sid = _U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
                payload = view[pos + 9:pos + 9 + length].tobytes()
                pos += 9 + length
                self._frame(kind, flags, sid, payload)
        finally:
            view.release()
            del buf[:pos]

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if not self.settings_seen and kind != SETTINGS:
            raise _ConnectionError(PROTOCOL_ERROR, "the first frame must be SETTINGS")
        if self.headers_pending is not None and kind != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block interrupted before its END_HEADERS")
        if kind == DATA:
            self._data(flags, sid, payload)
        elif kind == HEADERS:
            if sid == 0:
                raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
            payload = self._unpad(flags, payload)
            if flags & PRIORITY:
                if len(payload) < 5:
                    raise _ConnectionError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
                payload = payload[5:]
            if flags & END_HEADERS:
                self._headers(sid, flags, payload)
            else:
                self.headers_pending = (sid, flags, bytearray(payload))
        elif kind == CONTINUATION:
            pending = self.headers_pending
            if pending is None or pending[0] != sid:
                raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            pending[2].extend(payload)
            if len(pending[2]) > 2 * MAX_HEADER_LIST:
                raise _ConnectionError(PROTOCOL_ERROR, "header block too large")
            if flags & END_HEADERS:
                self.headers_pending = None
                self._headers(sid, pending[1], bytes(pending[2]))
        elif kind == SETTINGS:
            self._settings(flags, sid, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif kind == PING:
            if sid != 0 or len(payload) != 8:
                raise _ConnectionError(PROTOCOL_ERROR if sid else FRAME_SIZE_ERROR, "malformed PING")
            if not flags & ACK:
                self.write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            if sid == 0 or len(payload) != 4:
                raise _ConnectionError(PROTOCOL_ERROR, "malformed RST_STREAM")
            call = self.calls.pop(sid, None)
            if call is not None:
                self._reset(call)
        elif kind == GOAWAY:
            self.going_away = True
            self.server.changed()
        elif kind == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "a client cannot push")
        elif kind == PRIORITY_FRAME and len(payload) != 5:
            raise _ConnectionError(FRAME_SIZE_ERROR, "PRIORITY of the wrong size")
        # PRIORITY and unknown frame types are ignored

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise _ConnectionError(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[1:len(payload) - payload[0]]

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)  # flow control counts the padding too
        self.recv_unacked += size
        if self.recv_unacked >= CONNECTION_WINDOW // 2:
            self.write(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.recv_unacked)))
            self.recv_unacked = 0
        data = self._unpad(flags, payload)
        call = self.calls.get(sid)
        if call is None:
            if sid > self.last_sid:
                raise _ConnectionError(PROTOCOL_ERROR, f"DATA on stream {sid}, never opened")
            return  # a stream already answered, reset or refused: what was in flight is dropped
        if call.remote_done:
            self._stream_error(call, "DATA after the end of the stream")
            return
        call.unacked += size
        if call.unacked > STREAM_WINDOW:
            self._stream_error(call, "DATA beyond the stream's window")
            return
        # a unary request is bounded by the receive limit: its bytes are given back as they come; a stream's
        # as its handler takes its messages (and the padding at once)
        self.consumed(call, size if not call.handler.request_streaming else size - len(data))
        call.received(data)
        if flags & END_STREAM:
            self._ended(call)

    def consumed(self, call: _Call, size: int) -> None:
        """Give ``size`` bytes back to the stream's window once half of it is used up."""
        call.consumed += size
        if call.consumed >= STREAM_WINDOW // 2 and not call.remote_done and not call.finished:
            self.write(frame(WINDOW_UPDATE, 0, call.sid, _U32.pack(call.consumed)))
            call.unacked -= call.consumed
            call.consumed = 0

    def _ended(self, call: _Call) -> None:
        call.ended()
        if call.finished:
            self.forget(call)
        elif call.task is None:
            call.start()

    def _headers(self, sid: int, flags: int, block: bytes) -> None:
        call = self.calls.get(sid)
        if call is not None or sid <= self.last_sid:  # trailers, or headers on a stream already gone
            self._decode(block)  # keeps the HPACK table in step
            if call is None:
                return
            if not flags & END_STREAM:
                self._stream_error(call, "a second header block without END_STREAM")
                return
            self._ended(call)
            return
        if sid % 2 == 0:
            raise _ConnectionError(PROTOCOL_ERROR, f"a client-initiated stream with an even id ({sid})")
        self.last_sid = sid
        headers, named, why = self._decode(block)
        if self.going_away or len(self.calls) >= MAX_STREAMS:
            self.write(frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM)))
            return
        if why is not None:  # never a call (RFC 9113 §8.1.1)
            log.debug("gRPC stream %d from %s reset: malformed request: %s", sid, self.peer, why)
            self.write(frame(RST_STREAM, 0, sid, _U32.pack(PROTOCOL_ERROR)))
            return
        path = named.get(b":path", b"")
        if named.get(b":method") != b"POST" or not path:
            self.write(frame(RST_STREAM, 0, sid, _U32.pack(PROTOCOL_ERROR)))
            return
        if not named.get(b"content-type", b"").startswith(b"application/grpc"):
            self.write(frame(HEADERS, END_HEADERS | END_STREAM, sid, b"\x08\x03415"  # :status 415 (name static 8)
                             + literal(b"content-type", b"text/plain")))
            self.write(frame(RST_STREAM, 0, sid, _U32.pack(NO_ERROR)))
            return
        handler = self.server.handler(path)
        call = _Call(self, sid, headers, path, handler, named.get(b"grpc-timeout"),
                     named.get(b"grpc-encoding", b"identity"))
        self.calls[sid] = call
        if handler is None:
            call.refuse(grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path.decode('latin-1')}")
        elif handler.request_streaming:
            call.arrived = asyncio.Event()
            call.start()
        if flags & END_STREAM and sid in self.calls:
            self._ended(call)

    def _decode(self, block: bytes) -> tuple[list[tuple[bytes, bytes]], dict[bytes, bytes], str | None]:
        """A header block's fields, the same as a dict (for the fields read here and by the call), and why a
        request with them is malformed (:func:`malformed_request`), or None.

        A client's calls after its first send the same block, each field a reference into the HPACK tables
        (grpcio: path, content-type, user agent, te, ...); such a block leaves the dynamic table as it was,
        so while the table is unchanged it decodes as it did before: from :attr:`blocks`, not through the
        hpack package's Python (~60 us a block, with a debug log call per field)."""
        known = self.blocks.get(block)
        if known is not None:
            return known
        table = self.decoder.header_table
        entries = table.dynamic_entries
        newest, count, size = entries[0] if entries else None, len(entries), table.maxsize
        headers: list[tuple[bytes, bytes]] = list(self.decoder.decode(block, raw=True))
        decoded = headers, dict(headers), malformed_request(headers)  # checked once per block remembered
        entries = table.dynamic_entries
        if len(entries) == count and (entries[0] if entries else None) is newest and table.maxsize == size:
            if len(self.blocks) < MAX_BLOCKS and len(block) <= MAX_BLOCK:
                self.blocks[block] = decoded
        else:  # the table changed: what was known decodes differently now
            self.blocks.clear()
        return decoded

    def _stream_error(self, call: _Call, message: str) -> None:
        log.debug("gRPC stream %d from %s reset: %s", call.sid, self.peer, message)
        self.calls.pop(call.sid, None)
        self.write(frame(RST_STREAM, 0, call.sid, _U32.pack(PROTOCOL_ERROR)))
        self._reset(call)

    def _reset(self, call: _Call) -> None:
        call.cancel()
        self.window_open.set()
        self.server.changed()

    def _settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS of a length not a multiple of 6")
        self.settings_seen = True
        for at in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, at)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE above 2^31-1")
                delta, self.peer_initial_window = value - self.peer_initial_window, value
                for call in self.calls.values():
                    call.window += delta
                self.window_open.set()
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= LOCAL_MAX_FRAME:
                    raise _ConnectionError(PROTOCOL_ERROR, f"MAX_FRAME_SIZE {value} out of range")
                self.peer_max_frame = value
            elif key == ENABLE_PUSH and value > 1:
                raise _ConnectionError(PROTOCOL_ERROR, "ENABLE_PUSH neither 0 nor 1")
        self.write(frame(SETTINGS, ACK, 0))

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise _ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "connection window above 2^31-1")
        else:
            call = self.calls.get(sid)
            if call is None:
                return
            if increment == 0 or call.window + increment > MAX_WINDOW:
                self._stream_error(call, "a bad WINDOW_UPDATE")
                return
            call.window += increment
        self.window_open.set()

    # -- frames out ------------------------------------------------------------------
    async def send_data(self, call: _Call, message: bytes) -> None:
        """``message`` as DATA frames within the peer's windows and frame size, waiting for room."""
        view = memoryview(message)
        while view:
            if call.reset or self.closed:
                raise asyncio.CancelledError()
            room = min(self.send_window, call.window, self.peer_max_frame, len(view))
            if room <= 0:
                self.flush()  # what fitted goes now: the client gives window back for what it has read
                self.window_open.clear()
                await self.window_open.wait()
                continue
            n = room
            self.send_window -= n
            call.window -= n
            self.write(_FRAME.pack(n >> 16, n & 0xFFFF, DATA, 0, call.sid))
            self.write(view[:n])
            view = view[n:]
            if not self.writable.is_set():
                await self.writable.wait()

    def forget(self, call: _Call) -> None:
        if self.calls.get(call.sid) is call and (call.remote_done or call.reset or call.finished):
            del self.calls[call.sid]
            self.server.changed()

    def go_away(self) -> None:
        """Say no new streams will be taken (those already open finish)."""
        if not self.going_away:
            self.going_away = True
            self.write(frame(GOAWAY, 0, 0, _U32.pack(self.last_sid) + _U32.pack(NO_ERROR)))

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.flush()
            self.transport.close()


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


class LoopServer:
    """What ovserve's listener uses of ``grpc.aio.Server``, served by :class:`_Connection` on the running loop.

    ``options``: grpc's server options; ``grpc.max_receive_message_length`` is read (-1: no limit)."""

    def __init__(self, options: Iterable[tuple[str, Any]] = ()) -> None:
        opts = dict(options)
        self.max_receive = int(opts.get("grpc.max_receive_message_length", 4 << 20))
        self._generic: list[Any] = []
        self._methods: dict[bytes, Any] = {}
        self._sockets: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        self._servers: list[asyncio.AbstractServer] = []
        self.connections: set[_Connection] = set()
        self._changed: asyncio.Event | None = None

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        for name, handler in handlers.items():
            self._methods[f"/{service}/{name}".encode()] = handler

    def handler(self, path: bytes) -> Any:
        found = self._methods.get(path)
        if found is not None:
            return found
        details = _Details(path.decode("latin-1"))
        for generic in self._generic:
            found = generic.service(details)
            if found is not None:
                return found
        return None

    def add_insecure_port(self, address: str) -> int:
        return self._bind(address, None)

    def add_secure_port(self, address: str, credentials: Any) -> int:
        """``credentials``: an ``ssl.SSLContext`` offering ``h2`` by ALPN (grpc's credentials are grpcio's
        own objects, which this engine cannot read)."""
        if not isinstance(credentials, ssl.SSLContext):
            raise TypeError("the loop engine serves TLS from an ssl.SSLContext, not grpc's server credentials")
        return self._bind(address, credentials)

    def _bind(self, address: str, context: ssl.SSLContext | None) -> int:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, where = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(where)
        except OSError:
            sock.close()
            raise RuntimeError(f"cannot bind {address}") from None
        self._sockets.append((sock, context))
        return int(sock.getsockname()[1])

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        for sock, context in self._sockets:
            sock.listen(1024)
            sock.setblocking(False)
            self._servers.append(await loop.create_server(lambda: _Connection(self), sock=sock, ssl=context))

    def changed(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def stop(self, grace: float | None) -> None:
        """No new connections or calls; the calls open finish within ``grace`` s, then everything closes."""
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.go_away()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (grace or 0.0)
        while self._changed is not None and any(c.calls for c in self.connections):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                break
        for conn in list(self.connections):
            conn.close()
        for server in self._servers:
            await server.wait_closed()
        self._servers = []
