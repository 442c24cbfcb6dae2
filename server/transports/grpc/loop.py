"""The ``loop`` gRPC engine: gRPC served by the event loop itself, over the ``h2`` package's HTTP/2.

The native engine (pygrpc-native) reads its sockets on a Rust I/O thread and hands each call to a
Python dispatch thread, which hands it to the loop; the reply goes back the same way. With both
cores busy with inference, each hand-off waits for a CPU (docs/performance.md, "A gRPC engine on
the loop"). Here, as uvicorn does for REST, an :class:`asyncio.Protocol` per connection feeds what
arrives to an ``h2`` connection (the HTTP/2 state machine hypercorn and httpx use: frames, HPACK, stream
states, flow control, protocol errors) and runs each call's handler as a task on the same loop. This
module adds gRPC on top, and what h2 leaves to its user at a server's front door (issue 33): the request
fields checked per stream with h2's rules, budgets for resets, SETTINGS and PINGs, reading paused while a
peer does not read, and header blocks and frames refused from their size before they are buffered.

What it serves: the surface of ``grpc.aio.Server`` that ovserve's listener uses (generic and
registered method handlers, an insecure port, start, stop with a grace period), every method
shape (unary and streaming requests and responses; a response-streaming handler may yield or call
``context.write``), invocation and trailing metadata (``-bin`` keys base64), ``grpc-timeout``
deadlines (DEADLINE_EXCEEDED), client cancellation (RST_STREAM cancels the handler's task), gzip
and deflate compressed requests, the receive limit (RESOURCE_EXHAUSTED naming both sizes, from a
message's length prefix), flow control both ways (a stream's window is given back as its messages are
consumed) and write back-pressure, GOAWAY at stop, and TLS (an ``ssl.SSLContext`` offering ``h2`` by ALPN,
the listener's reloading one, server/tls.py) with the client's certificate in the auth context.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import random
import socket
import ssl
import struct
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h2.utilities
import hpack
import hpack.exceptions
from h2.exceptions import FrameTooLargeError
from h2.frame_buffer import FrameBuffer
from hyperframe.frame import DataFrame, Frame, GoAwayFrame

from ...errors import bounded
from .headers import MalformedRequests

log = logging.getLogger("ovserve")

# frame types read before h2 parses a frame (_Frames)
HEADERS, SETTINGS, CONTINUATION = 0x1, 0x4, 0x9
# error codes (RFC 9113 §7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x0, 0x1, 0x2, 0x7, 0xB

DEFAULT_WINDOW = 65535
#: what this server offers: a stream takes a 150 KB image in one round trip; the connection's window is given
#: back as data is consumed
STREAM_WINDOW = 16 << 20
CONNECTION_WINDOW = 1 << 30
#: the largest frame a peer may send: a 4 MiB tensor in four frames (not the protocol's 16 MiB, item 4)
LOCAL_MAX_FRAME = 1 << 20
#: streams open at once on one connection (grpcio sets no limit): a client past what it was told breaks its
#: connection (GOAWAY PROTOCOL_ERROR, h2's TooManyStreamsError; RFC 9113 §5.1.2 and §5.4.1)
MAX_STREAMS = 1024
#: header blocks a connection remembers, and the longest remembered (see _Decoder): a block of references is
#: tens of bytes
MAX_BLOCKS, MAX_BLOCK = 32, 1024
#: the most bytes (RFC 9113 §6.5.2's measure) a call's metadata may hold, as grpcio, unless the listener's door
#: says otherwise: past it the call is refused RESOURCE_EXHAUSTED
MAX_HEADER_LIST = 16 << 10
#: past these (decoded, and as encoded before decoding) a header block breaks the connection (GOAWAY
#: ENHANCE_YOUR_CALM); below them, a call whose metadata is past MAX_HEADER_LIST is refused RESOURCE_EXHAUSTED.
#: Decoding is the cost (HPACK's Huffman code in Python: about 28 ms for 256 KiB), so a connection may send at
#: most MAX_OVERSIZED such calls in OVERSIZED_S
MAX_DECODED_HEADERS, MAX_HEADER_BLOCK = 256 << 10, 256 << 10
MAX_OVERSIZED, OVERSIZED_S = 16, 10.0
#: a connection whose peer resets (or makes this server reset) more streams than this in RESETS_S is sent
#: away (items 1: rapid reset; MadeYouReset)
MAX_RESETS, RESETS_S = 1000, 10.0
#: SETTINGS frames a peer may send in SETTINGS_S
MAX_SETTINGS, SETTINGS_S = 100, 10.0
#: PINGs closer than this, with nothing sent in between, are strikes; past MAX_PING_STRIKES the peer is sent away
PING_INTERVAL_S, MAX_PING_STRIKES = 1.0, 2
#: bytes a connection may have waiting in its transport before this server stops reading from it
WRITE_HIGH = 1 << 20
#: how long a peer may read nothing while bytes wait for it, before its connection is closed
STALL_S = 20.0
#: how long a closed connection's last bytes (a GOAWAY, TLS's close_notify) may wait for a peer to read them
CLOSE_S = 2.0
#: bytes queued past which they are sent at once (see _Connection.send_data)
FLUSH_AT = 64 << 10
#: the longest a whole reply is held for the others its read started (see _Connection.data_received)
HOLD_S = 0.001
#: the PING sent after a GOAWAY of this server's (see _Connection.go_away)
_GOAWAY_PING = b"goaway!!"

_PREFIX = struct.Struct(">BI")
#: request headers that are HTTP/2 or gRPC's own, not the call's metadata (as grpcio leaves them out)
_NOT_METADATA = frozenset({b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding",
                           b"grpc-message-type", b"grpc-previous-rpc-attempts"})
_TIMEOUT_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}
#: grpc-message is percent-encoded outside printable ASCII (and '%' itself)
_PLAIN = frozenset(range(0x20, 0x7F)) - {ord("%")}

RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))
#: each status's grpc-status field
_STATUS = {code: (b"grpc-status", str(code.value[0]).encode()) for code in grpc.StatusCode}


def _data_body_repr(self: DataFrame) -> str:
    """What hyperframe's ``DataFrame._body_repr`` returns (the serialized body's first 10 bytes in hex, "..." when
    there are more), from those 10 bytes alone. h2 formats ``repr(frame)`` for every frame it receives, for a trace
    log call, whether or not anything is logged; hyperframe builds that from the whole payload, serialized again
    and hex-encoded: about 300 µs for a 150 KB request (issue 33's benchmark: the most of loop's cost on MobileNetV2
    beside grpcio's C core). Installed on hyperframe's class at import, the same text for a fraction of the work
    (tests/test_grpc_loop_flush.py compares the two)."""
    padded = "PADDED" in self.flags
    pad = self.pad_length if padded else 0
    data = self.data
    size = (1 if padded else 0) + len(data) + pad
    if not size:
        return "None"
    head = (bytes([pad]) if padded else b"") + bytes(data[:10])
    head = (head + b"\0" * 10)[:min(size, 10)]
    return "<hex:" + head.hex() + ("..." if size > 10 else "") + ">"


DataFrame._body_repr = _data_body_repr  # type: ignore[method-assign,assignment]


def malformed_request(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a request with these header fields is malformed (RFC 9113 §8.2-8.3: h2's rules for a request's fields,
    pseudo-headers and all), or None. Issue 33, item 5: such a request's stream is reset, never a call."""
    try:
        for _ in h2.utilities.validate_headers(headers, _VALIDATION):
            pass
    except h2.exceptions.ProtocolError as exc:
        return str(exc)[:200]
    return None


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


def _metadata_fields(metadata: Iterable[tuple[str, Any]]) -> list[tuple[bytes, bytes]]:
    if not metadata:  # most calls (an empty list or tuple)
        return []
    return [(k.lower().encode(), _metadata_value(k.lower(), v)) for k, v in metadata]


class _Aborted(grpc.aio.AbortError):
    """What ``context.abort`` raises: the call ends with the status it set."""


class _Refused(Exception):
    """A request message this server cannot take: the call ends with ``code``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


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
        self.task: asyncio.Task[None] | None = None
        self.deadline_at: float | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.deadline_hit = False
        self.encoding = encoding
        self.context = Context(self)
        self.deserialize: Callable[[Any], Any] = bytes
        self.serialize: Callable[[Any], bytes] = bytes
        self.bind(handler)
        seconds = None if timeout is None else parse_timeout(timeout)
        if seconds is not None:
            self.deadline_at = conn.loop.time() + seconds
            self.deadline = conn.loop.call_at(self.deadline_at, self._expire)

    def bind(self, handler: Any) -> None:
        """The method's handler (None: not found). As grpcio, a handler without a (de)serializer takes and gives
        the message's bytes."""
        self.handler = handler
        self.deserialize = (handler and handler.request_deserializer) or bytes
        self.serialize = (handler and handler.response_serializer) or bytes

    # -- requests ----------------------------------------------------------------
    def received(self, data: bytes) -> None:
        """DATA for this stream, cut into messages. A message over the limit, one that cannot be decompressed,
        or a byte past a unary method's one message (whose window is given back as it comes, so the sum a call
        holds stays within one message: issue 33, item 8), ends the call."""
        if self.finished:
            return
        unary = not self.handler.request_streaming
        if unary and self.messages:
            self.refuse(grpc.StatusCode.UNIMPLEMENTED, "a unary method takes one request message, not more")
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
            if unary and inbox:
                self.refuse(grpc.StatusCode.UNIMPLEMENTED, "a unary method takes one request message, not more")
                return
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
            self.conn.send_headers(self.sid, [*RESPONSE_HEADERS, *_metadata_fields(self.context._initial)])

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
        fields = [] if self.headers_sent else [*RESPONSE_HEADERS]
        self.headers_sent = True
        fields.append(_STATUS[code])
        if details:
            fields.append((b"grpc-message", percent_encode(details)))
        fields += _metadata_fields(trailing)
        conn = self.conn
        conn.send_headers(self.sid, fields, end_stream=True)
        if not self.remote_done:  # answered before the request ended: the client may stop sending
            conn.reset(self.sid, NO_ERROR)
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


class _Frames(FrameBuffer):
    """h2's frame buffer, with refusals made from a frame's 9-byte header, before its payload is buffered or
    decoded (issue 33, item 4): a frame past the size this server advertised, and a header block (a HEADERS
    frame and its CONTINUATIONs) past ``MAX_HEADER_BLOCK`` bytes as encoded; and, which h2 does not check, a
    first frame other than SETTINGS (RFC 9113 §3.4)."""

    def __init__(self) -> None:
        super().__init__(server=True)
        self.settings_seen = False

    def __next__(self) -> Frame:
        data = self._data
        if len(data) >= 9:
            if not self.settings_seen:
                if data[3] != SETTINGS:
                    raise h2.exceptions.ProtocolError("the first frame must be SETTINGS")
                self.settings_seen = True
            length = (data[0] << 16) | (data[1] << 8) | data[2]
            if length > self.max_frame_size:
                raise FrameTooLargeError(f"a frame of {length} bytes, past the {self.max_frame_size} advertised")
            if data[3] == HEADERS or data[3] == CONTINUATION:
                block = length + sum(len(f.data) for f in self._headers_buffer)
                if block > MAX_HEADER_BLOCK:
                    raise _BlockTooLarge(f"a header block of {block}+ bytes is past the {MAX_HEADER_BLOCK} this "
                                         "server takes")
        return super().__next__()


class _BlockTooLarge(Exception):
    """A header block past ``MAX_HEADER_BLOCK``, seen from its frames' headers: the connection ends with a GOAWAY
    saying so (raised past h2, which would send its own GOAWAY without a reason)."""


class _CompressionError(h2.exceptions.ProtocolError):
    """A header block HPACK cannot decode: a connection error of type COMPRESSION_ERROR (RFC 9113 §4.3; h2 says
    PROTOCOL_ERROR)."""

    error_code = h2.errors.ErrorCodes.COMPRESSION_ERROR


class _Decoder(hpack.Decoder):
    """HPACK's decoder as h2 uses it, remembering blocks that leave its table as it was.

    A client's calls after its first send the same block, each field a reference into the HPACK tables
    (grpcio: path, content-type, user agent, te, ...); such a block leaves the dynamic table as it was, so while
    the table is unchanged it decodes as it did before: from :attr:`blocks`, not through the hpack package's
    Python (about 60 us a block)."""

    def __init__(self, max_header_list_size: int) -> None:
        super().__init__(max_header_list_size=max_header_list_size)
        self.remembered = _Remembered()

    def decode(self, data: bytes, raw: bool = False) -> Any:
        block = bytes(data)
        state = _TableState(self.header_table)
        known = self.remembered.get(block, state)
        if known is not None:
            return known
        try:
            headers: Any = super().decode(block, raw=raw)
        except hpack.exceptions.OversizedHeaderListError:
            raise  # h2's DenialOfServiceError
        except hpack.exceptions.HPACKError as exc:
            raise _CompressionError(f"HPACK: {exc}") from None
        self.remembered.keep(block, headers, state, _TableState(self.header_table), len(block))
        return headers


class _Encoder(hpack.Encoder):
    """HPACK's encoder as h2 uses it, remembering the header lists whose encoding left its table as it was.

    A connection's replies after the first send the same fields (``:status 200``, ``content-type``, ``grpc-status
    0``), each a reference into the tables once the first reply has indexed them; while the table is unchanged
    such a list encodes as it did before: from :attr:`blocks` (about 45 µs a block through the hpack package)."""

    def __init__(self) -> None:
        super().__init__()
        self.remembered = _Remembered()

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        if not isinstance(headers, (list, tuple)) or not huffman or self.table_size_changes:
            self.remembered.forget()
            return super().encode(headers, huffman)
        key = tuple(headers)
        state = _TableState(self.header_table)
        known: bytes | None = self.remembered.get(key, state)
        if known is not None:
            return known
        block = super().encode(headers, huffman)
        self.remembered.keep(key, block, state, _TableState(self.header_table), len(block))
        return block


class _Remembered:
    """Header blocks decoded (or lists encoded) while an HPACK table was in one state, and what they came to: valid
    while the table stays in that state. At most MAX_BLOCKS, of at most MAX_BLOCK bytes each."""

    def __init__(self) -> None:
        self.blocks: dict[Any, Any] = {}
        self.state: _TableState | None = None  # the table they were made with

    def get(self, key: Any, state: _TableState) -> Any:
        return self.blocks.get(key) if state == self.state else None

    def keep(self, key: Any, value: Any, before: _TableState, after: _TableState, size: int) -> None:
        """Remember ``value`` for ``key`` if making it left the table as it was (else what was known is stale)."""
        if after != before:
            self.forget()
        elif size <= MAX_BLOCK:
            if before != self.state or len(self.blocks) >= MAX_BLOCKS:
                self.forget()
                self.state = before
            self.blocks[key] = value

    def forget(self) -> None:
        self.blocks.clear()
        self.state = None


class _TableState:
    """What an HPACK table's blocks depend on: its size, its entries' count and its newest entry, held (entries
    are only ever added at the front, so the newest entry object changes whenever the table does)."""

    __slots__ = ("count", "maxsize", "newest")

    def __init__(self, table: Any) -> None:
        entries = table.dynamic_entries
        self.maxsize, self.count, self.newest = table.maxsize, len(entries), entries[0] if entries else None

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _TableState) and self.newest is other.newest and self.count == other.count
                and self.maxsize == other.maxsize)

    __hash__ = None  # type: ignore[assignment]


class _Budget:
    """At most ``limit`` events in any ``seconds``-long stretch, counted in whole stretches."""

    def __init__(self, limit: int, seconds: float) -> None:
        self.limit, self.seconds = limit, seconds
        self.count, self.since = 0, 0.0

    def spend(self, now: float) -> bool:
        """Count one event at ``now``: False once past the limit."""
        if now - self.since > self.seconds:
            self.count, self.since = 0, now
        self.count += 1
        return self.count <= self.limit


_CONFIG = h2.config.H2Configuration(
    client_side=False, header_encoding=None,  # fields stay bytes
    # request fields are checked per stream (_Connection._malformed: a stream error, not the connection's);
    # replies are built here
    validate_inbound_headers=False, normalize_inbound_headers=False,
    validate_outbound_headers=False, normalize_outbound_headers=False)
_VALIDATION = h2.utilities.HeaderValidationFlags(is_client=False, is_trailer=False, is_response_header=False,
                                                  is_push_promise=False)


class _Connection(asyncio.Protocol):
    """One client connection: bytes in through h2's state machine, its events to the calls, the calls' replies
    out through it."""

    def __init__(self, server: LoopServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        h2c = self.h2 = h2.connection.H2Connection(config=_CONFIG)
        h2c.incoming_buffer = _Frames()
        h2c.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            h2.settings.SettingCodes.MAX_FRAME_SIZE: LOCAL_MAX_FRAME})
        h2c.max_inbound_frame_size = LOCAL_MAX_FRAME
        h2c.decoder = _Decoder(MAX_DECODED_HEADERS)
        h2c.encoder = _Encoder()
        #: why requests with these fields are malformed, or None, for the last few field lists seen
        self.verdicts: dict[tuple[tuple[bytes, bytes], ...], str | None] = {}
        self.calls: dict[int, _Call] = {}
        self.last_sid = 0  # the newest stream this connection took as a call (or answered)
        self.window_open = asyncio.Event()  # set whenever a send window may have grown
        self.writable = asyncio.Event()
        self.writable.set()
        self.stalled: asyncio.TimerHandle | None = None
        self.going_away = False  # GOAWAY sent or received: no new streams
        self.closed = False
        self._auth: dict[str, list[bytes]] | None = None
        self.queued = 0  # bytes of DATA queued in h2 since the last flush
        self.flush_soon = False
        #: reads so far (each a batch of frames), and the one whose calls' replies are held (0: none)
        self.reads = 0
        self.started = 0  # the last read that started a call's handler
        self.held = 0
        self.held_since: float | None = None  # when the oldest reply queued was held
        # what a peer may make this server do for nothing (items 1 and 2)
        self.resets = _Budget(MAX_RESETS, RESETS_S)
        self.settings = _Budget(MAX_SETTINGS, SETTINGS_S)
        self.oversized = _Budget(MAX_OVERSIZED, OVERSIZED_S)
        self.ping_strikes = 0
        self.last_ping = -PING_INTERVAL_S
        self.answered_since_ping = True
        self.dispatch: dict[type, Callable[[Any], None]] = {
            h2.events.RequestReceived: self._request, h2.events.DataReceived: self._data,
            h2.events.StreamEnded: self._stream_ended, h2.events.StreamReset: self._stream_reset,
            h2.events.WindowUpdated: self._window, h2.events.RemoteSettingsChanged: self._remote_settings,
            h2.events.PingReceived: self._ping, h2.events.ConnectionTerminated: self._terminated,
            h2.events.PingAckReceived: self._ping_ack}
        #: --grpc-max-connection-age: when this connection is told to go (see _aged), and whether it was
        self.aging: asyncio.TimerHandle | None = None
        self.aged = False
        self.goaway_read = False  # the client answered the PING sent after the GOAWAY

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
        transport.set_write_buffer_limits(high=WRITE_HIGH)  # type: ignore[attr-defined]
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(CONNECTION_WINDOW - DEFAULT_WINDOW)
        self.flush()
        self.server.connections.add(self)
        if self.server.max_age > 0:  # jittered as gRPC's core does (+-10%), so a fleet's clients do not move at once
            self.aging = self.loop.call_later(self.server.max_age * random.uniform(0.9, 1.1), self._aged)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self.stalled is not None:
            self.stalled.cancel()
        if self.aging is not None:
            self.aging.cancel()
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
        """The peer reads slower than this server writes to it: nothing more is read from it until it catches
        up (so replies and control frames owed to it stay bounded: items 2 and 3), and if it has not within
        ``STALL_S``, the connection is closed."""
        self.writable.clear()
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()
            self.stalled = self.loop.call_later(STALL_S, self._stall)

    def resume_writing(self) -> None:
        self.writable.set()
        if self.stalled is not None:
            self.stalled.cancel()
            self.stalled = None
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def _stall(self) -> None:
        log.debug("gRPC connection from %s closed: it read nothing for %s s", self.peer, STALL_S)
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        """A read's frames. The calls it completes start their handlers, which run in this order at the next
        turn of the loop; their replies are held until each has run to its first wait (:meth:`_release`,
        queued behind them now), so that the replies of calls that answer at once (a model inferred inline,
        a refusal) leave in one send. Nothing else waits in between: what the loop had queued before runs
        before the handlers, and what it queues after runs after the release."""
        if self._gone():
            return
        self.reads += 1
        try:
            events = self.h2.receive_data(data)
        except _BlockTooLarge as exc:
            self._calm(str(exc))
            return
        except h2.exceptions.ProtocolError as exc:  # h2 has queued its GOAWAY naming the error (not for a preface)
            if self.h2.state_machine.state is not h2.connection.ConnectionState.CLOSED:
                self.h2.close_connection(PROTOCOL_ERROR, b"not an HTTP/2 connection preface (is this gRPC?)")
            self._close(f"{type(exc).__name__}: {exc}")
            return
        try:
            dispatch = self.dispatch
            for event in events:
                handle = dispatch.get(type(event))
                if handle is not None:
                    handle(event)
                if self.closed:
                    return
            if self.started == self.reads:  # this read started handlers
                self.held = self.reads
                self.loop.call_soon(self._release, self.reads)
            self.flush()  # what reading these frames wrote (SETTINGS and PING acknowledgements, refusals, ...)
        except Exception as exc:  # a defect here: the connection goes, the server stays
            log.error("gRPC connection from %s: unexpected error", self.peer, exc_info=exc)
            self.fail(INTERNAL_ERROR, "internal error")

    def _gone(self) -> bool:
        return self.closed

    # -- frames out ------------------------------------------------------------------
    def _queued(self) -> None:
        """h2 has frames to send: they go at the next flush, at the latest at the next turn of the loop."""
        if not self.flush_soon:
            self.flush_soon = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_soon, self.queued, self.held_since = False, 0, None
        if not self.closed and self.transport is not None:
            out = self.h2.data_to_send()
            if out:
                self.transport.write(out)

    def _release(self, read: int) -> None:
        """The handlers ``read`` started have each run to their first wait: what they answered goes now."""
        if self.held == read:
            self.held = 0
        self.flush()

    def send_headers(self, sid: int, fields: list[tuple[bytes, bytes]], end_stream: bool = False) -> None:
        if self.closed:
            return
        try:
            self.h2.send_headers(sid, fields, end_stream=end_stream)
        except h2.exceptions.ProtocolError:  # the stream or the connection is gone meanwhile: nobody to answer
            return
        self.answered_since_ping = True
        self._queued()

    def reset(self, sid: int, code: int) -> None:
        if self.closed:
            return
        try:
            self.h2.reset_stream(sid, code)
        except h2.exceptions.ProtocolError:
            return
        self._queued()

    async def send_data(self, call: _Call, message: bytes) -> None:
        """``message`` as DATA frames within the peer's windows and frame size, waiting for room."""
        h2c, sid = self.h2, call.sid
        sent, total = 0, len(message)
        while sent < total:
            if call.reset or self.closed:
                raise asyncio.CancelledError()
            try:
                room = min(h2c.local_flow_control_window(sid), h2c.max_outbound_frame_size, total - sent)
            except h2.exceptions.ProtocolError:  # the stream is gone
                raise asyncio.CancelledError() from None
            if room <= 0:
                self.flush()  # what fitted goes now: the client gives window back for what it has read
                self.window_open.clear()
                await self.window_open.wait()
                continue
            h2c.send_data(sid, message if room == total else message[sent:sent + room])
            sent += room
            self.answered_since_ping = True
            self.queued += room
            if self.queued >= FLUSH_AT:  # large replies go at once, so the transport's back-pressure holds
                self.flush()
            else:
                self._queued()
            if not self.writable.is_set():
                await self.writable.wait()

    def fail(self, code: int, message: str) -> None:
        """A connection error found here: GOAWAY saying why, then the connection is closed."""
        with contextlib.suppress(h2.exceptions.ProtocolError):  # h2 is closing already
            self.h2.close_connection(code, message.encode()[:256], last_stream_id=self.last_sid)
        self._close(message)

    def _close(self, why: str) -> None:
        """What h2 queued (its GOAWAY) goes, then the connection is closed: over TLS too (a peer that does not
        read its close_notify is cut off after ``CLOSE_S``)."""
        log.debug("gRPC connection from %s closed: %s", self.peer, why)
        self.flush()
        self.closed = True
        transport = self.transport
        if transport is not None:
            transport.close()
            self.loop.call_later(CLOSE_S, transport.abort)
        calls, self.calls = self.calls, {}
        for call in calls.values():
            call.cancel()
        self.server.changed()

    def forget(self, call: _Call) -> None:
        if self.calls.get(call.sid) is call and (call.remote_done or call.reset or call.finished):
            del self.calls[call.sid]
            self.server.changed()
            if self.aged and self.idle():
                self.close()

    def go_away(self) -> None:
        """Say no new streams will be taken (those already open finish), then PING: once the client has answered
        it, it has read the GOAWAY (frames are read in order), so every stream it opened before is here and none
        will come: :meth:`idle` can be true. Streams opened after the GOAWAY are refused REFUSED_STREAM, which gRPC
        clients retry on a new connection. The GOAWAY is written beside h2, whose state machine allows nothing
        after a GOAWAY it sends itself."""
        if not self.going_away and not self.closed and self.transport is not None:
            self.going_away = True
            self.flush()
            self.transport.write(GoAwayFrame(0, last_stream_id=self.last_sid, error_code=NO_ERROR).serialize())
            self.h2.ping(_GOAWAY_PING)
            self.flush()

    def idle(self) -> bool:
        """Told to go, and nothing left to do: the client has read the GOAWAY, and no call is open."""
        return self.going_away and self.goaway_read and not self.calls

    def _aged(self) -> None:
        """``--grpc-max-connection-age``: the connection has lived long enough; its client is told to open another
        (the calls in flight finish here), and it closes once idle."""
        self.aging, self.aged = None, True
        self.go_away()
        if self.idle():
            self.close()

    def _ping_ack(self, event: h2.events.PingAckReceived) -> None:
        if event.ping_data == _GOAWAY_PING and self.going_away:
            self.goaway_read = True
            self.server.changed()
            if self.aged and self.idle():
                self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.flush()
            self.transport.close()

    # -- events in -------------------------------------------------------------------
    def _request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        headers: list[tuple[bytes, bytes]] = event.headers
        if self.going_away:  # gRPC clients retry a refused stream elsewhere
            self.reset(sid, REFUSED_STREAM)
            return
        self.last_sid = sid
        why = self._malformed(headers)
        if why is not None:  # never a call (RFC 9113 §8.1.1)
            log.debug("gRPC stream %d from %s reset: malformed request: %s", sid, self.peer, why)
            self.server.door.reset()
            self._stream_error(sid, PROTOCOL_ERROR)
            return
        named = dict(headers)
        if named.get(b":method") != b"POST":
            self._stream_error(sid, PROTOCOL_ERROR)
            return
        if not named.get(b"content-type", b"").startswith(b"application/grpc"):
            self.send_headers(sid, [(b":status", b"415"), (b"content-type", b"text/plain")], end_stream=True)
            if not event.stream_ended:
                self.reset(sid, NO_ERROR)
            return
        path = named[b":path"]
        call = _Call(self, sid, headers, path, None, named.get(b"grpc-timeout"),
                     named.get(b"grpc-encoding", b"identity"))
        size = sum(len(k) + len(v) + 32 for k, v in headers if k[:1] != b":" and k not in _NOT_METADATA)
        if size > self.server.door.max_bytes:  # the metadata, as grpcio counts it: ended by the door's refusal
            if not self.oversized.spend(self.loop.time()):
                self._calm("too_many_oversized_headers")
                return
            handler: Any = self.server.door.too_large(path.decode("latin-1"), call.context.invocation_metadata(),
                                                      size)
        else:
            handler = self.server.handler(path)
        call.bind(handler)
        self.calls[sid] = call
        if handler is None:
            call.refuse(grpc.StatusCode.UNIMPLEMENTED, bounded(f"Method not found: {path.decode('latin-1')}"))
        elif handler.request_streaming:
            call.arrived = asyncio.Event()
            call.start()

    def _malformed(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """:func:`malformed_request`, remembered for the last few field lists (a client's calls repeat theirs)."""
        key = tuple(headers)
        if key in self.verdicts:
            return self.verdicts[key]
        why = malformed_request(headers)
        if len(self.verdicts) >= MAX_BLOCKS:
            self.verdicts.clear()
        self.verdicts[key] = why
        return why

    def _data(self, event: h2.events.DataReceived) -> None:
        sid, size = event.stream_id, event.flow_controlled_length
        call = self.calls.get(sid)
        if call is None or call.finished or call.reset:  # answered, reset or refused: dropped, the window given back
            self.h2.acknowledge_received_data(size, sid)
            return
        data = event.data
        # a unary request is bounded by the receive limit, checked on each message's length prefix: its bytes
        # are given back as they come; a stream's as its handler takes its messages (and the padding at once)
        given = size if not call.handler.request_streaming else size - len(data)
        if given:
            self.h2.acknowledge_received_data(given, sid)
        call.received(data)

    def consumed(self, call: _Call, size: int) -> None:
        """The handler took a message of ``size`` bytes on the wire: its window goes back (h2 sends the
        WINDOW_UPDATE once enough is owed)."""
        if not call.remote_done and not call.finished and not self.closed:
            try:
                self.h2.acknowledge_received_data(size, call.sid)
            except h2.exceptions.ProtocolError:
                return
            self._queued()

    def _stream_ended(self, event: h2.events.StreamEnded) -> None:
        call = self.calls.get(event.stream_id)
        if call is None:
            return
        call.ended()
        if call.finished:
            self.forget(call)
        elif call.task is None:
            call.start()

    def _calm(self, why: str) -> None:
        """The peer asks too much for nothing (a flood, a header block past the bound): what it is owed and not yet
        sent (the acknowledgements h2 queued for the read) is dropped, and the GOAWAY goes at once,
        ENHANCE_YOUR_CALM naming ``why``."""
        self.h2.clear_outbound_data_buffer()
        self.fail(ENHANCE_YOUR_CALM, why)

    def _stream_reset(self, event: h2.events.StreamReset) -> None:
        if not self.resets.spend(self.loop.time()):
            self._calm("too_many_resets")
            return
        call = self.calls.pop(event.stream_id, None)
        if call is not None:
            call.cancel()
            self.window_open.set()
            self.server.changed()

    def _stream_error(self, sid: int, code: int) -> None:
        """Reset a stream for the client's fault; such resets count with the client's own (item 1,
        "MadeYouReset")."""
        if not self.resets.spend(self.loop.time()):
            self._calm("too_many_resets")
            return
        call = self.calls.pop(sid, None)
        self.reset(sid, code)
        if call is not None:
            call.cancel()
            self.window_open.set()
            self.server.changed()

    def _window(self, event: h2.events.WindowUpdated) -> None:
        self.window_open.set()

    def _remote_settings(self, event: h2.events.RemoteSettingsChanged) -> None:
        if not self.settings.spend(self.loop.time()):
            self._calm("too_many_settings")
            return
        self.window_open.set()

    def _ping(self, event: h2.events.PingReceived) -> None:
        """As gRPC's core: a PING sooner than ``PING_INTERVAL_S`` after another, with nothing sent meanwhile,
        is a strike; past ``MAX_PING_STRIKES``, GOAWAY ENHANCE_YOUR_CALM "too_many_pings" (which gRPC clients
        read as: ping less often)."""
        now = self.loop.time()
        if not self.answered_since_ping and now - self.last_ping < PING_INTERVAL_S:
            self.ping_strikes += 1
            if self.ping_strikes > MAX_PING_STRIKES:
                self._calm("too_many_pings")
                return
        else:
            self.ping_strikes = 0
        self.last_ping, self.answered_since_ping = now, False

    def _terminated(self, event: h2.events.ConnectionTerminated) -> None:
        """The client's GOAWAY: h2 takes nothing more on this connection, so it is done."""
        self.going_away = True
        self._close(f"the client's GOAWAY ({event.error_code})")


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


class LoopServer:
    """What ovserve's listener uses of ``grpc.aio.Server``, served by :class:`_Connection` on the running loop.

    ``options``: grpc's server options; ``grpc.max_receive_message_length`` (-1: no limit) and
    ``grpc.max_connection_age_ms`` are read. ``door``:
    what counts the malformed requests reset and refuses (and logs) calls whose metadata is past its limit."""

    def __init__(self, options: Iterable[tuple[str, Any]] = (), door: MalformedRequests | None = None) -> None:
        self.door = door or MalformedRequests(MAX_HEADER_LIST)
        opts = dict(options)
        self.max_receive = int(opts.get("grpc.max_receive_message_length", 4 << 20))
        #: seconds a connection lives before its client is told to open another (0: for ever)
        self.max_age = int(opts.get("grpc.max_connection_age_ms", 0)) / 1000
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
        while self._changed is not None and not all(c.idle() for c in self.connections):
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
