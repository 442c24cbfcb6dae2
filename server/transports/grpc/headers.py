"""Malformed requests never become calls (issue 33, item 5): the header fields RFC 9113 §8.2 makes a request
malformed with, refused before any handler runs, on every service of a grpcio listener.

gRPC's C core (grpcio 1.85) refuses some malformed requests itself: upper-case or otherwise invalid field
names, unknown pseudo-headers (``:foo``, ``:protocol``), a ``te`` other than ``trailers``, a second
``:authority``. It passes others on as ordinary metadata, and the call is served: CR, LF or NUL in a field
value, and the connection-specific fields (``connection``, ``proxy-connection``, ``keep-alive``,
``transfer-encoding``, ``upgrade``). :class:`MalformedRequests`, a server interceptor, refuses those from the
call's metadata before the method's handler is even looked up, so the KServe V2 and TorchServe services,
health and reflection all get the same check, in one place.

RFC 9113 answers a malformed request with RST_STREAM PROTOCOL_ERROR. Python cannot reset a stream on
grpcio; the interceptor ends the call INVALID_ARGUMENT, naming the field (cut to a bounded length, never
its value), before the request's body is read. docs/operations.md "The gRPC door" puts the two side by side,
with what the core keeps out of the metadata and so out of reach here (duplicated or misplaced
pseudo-headers).

The same interceptor applies the metadata size limit to the call's metadata as a whole, which the core
applies frame by frame (:class:`MalformedRequests`).

The loop engine sees every field, pseudo-headers too: it checks them with h2's rules and resets a malformed
request's stream, as RFC 9113 asks (counted here: :meth:`MalformedRequests.reset`), and ends a call whose fields
are past the limit with this class's refusal (:meth:`MalformedRequests.too_large`). native relies on its own
HTTP/2's checks.

A refused call is counted (:attr:`MalformedRequests.refused`, by reason: ``ovserve_requests_malformed_total``
when metrics are on) and, with ``--access-log``, logged as any call is: its method, status and client, no model,
and a request id (the client's, if it sent a sane one) that also goes back in its trailing metadata.
"""
from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc

from ...gate import OPEN_GATE, Gate
from ...gate.accesslog import HEADER, Clock, now_iso, request_id

#: Connection-specific fields (RFC 9113 §8.2.2): a request carrying one is malformed. (``te`` is one too
#: unless its value is ``trailers``; grpcio's HPACK parser refuses any other value before the metadata.)
CONNECTION_SPECIFIC = frozenset({"connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade"})
#: A valid field name in HTTP/2: one or more of RFC 9110's token characters, lower-case (RFC 9113 §8.2.1).
_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")
#: What a field value may not hold (RFC 9113 §8.2.1): NUL, CR or LF anywhere, SP or HTAB at either end; and
#: the other control characters RFC 9110 §5.5 leaves out of a field value (HTAB inside a value is allowed).
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]|\A[ \t]|[ \t]\Z")
#: The most characters of a client's field name quoted in a refusal.
QUOTED_NAME = 64


def _quoted(name: str) -> str:
    shown = repr(name[:QUOTED_NAME])
    return shown if len(name) <= QUOTED_NAME else f"{shown}...({len(name)} characters)"


def _bad_name(name: str) -> str | None:
    if name in CONNECTION_SPECIFIC:
        return f"connection-specific header field {name!r} (RFC 9113 §8.2.2)"
    if _NAME.fullmatch(name) is None:
        return f"invalid header field name {_quoted(name)} (RFC 9113 §8.2.1)"
    return None


#: Names found valid (a call's are mostly the same few), kept to skip the check: valid names only, so a client
#: cannot make a malformed one pass, and at most KNOWN_NAMES of them.
_known_names: set[str] = set()
KNOWN_NAMES = 1024


def malformed(metadata: Iterable[tuple[str, Any]]) -> str | None:
    """Why a request with these header fields (a call's invocation metadata, pseudo-headers not among them)
    is malformed, or None."""
    why, _ = _look(metadata)
    return why


def header_bytes(metadata: Iterable[tuple[str, Any]]) -> int:
    """The size of these fields as HPACK counts a header list (RFC 7541 §4.1: name, value and 32 each; a
    binary value as its base64 on the wire)."""
    _, size = _look(metadata)
    return size


def _look(metadata: Iterable[tuple[str, Any]]) -> tuple[str | None, int]:
    """Why these fields are malformed (or None), and their size so far."""
    size = 0
    for name, value in metadata:
        if name not in _known_names:
            why = _bad_name(name)
            if why is not None:
                return why, size
            if len(_known_names) < KNOWN_NAMES:
                _known_names.add(name)
        if isinstance(value, str):
            # the common case at the cost of two method calls: printable ASCII, no space at either end
            if not (value.isprintable() and value[:1] != " " and value[-1:] != " ") \
                    and _BAD_VALUE.search(value) is not None:
                return (f"invalid value of header field {_quoted(name)}: a control character, or white space at "
                        "either end (RFC 9113 §8.2.1)"), size
            size += len(name) + 32 + (len(value) if value.isascii() else len(value.encode()))
        else:
            size += len(name) + 32 + (len(value) + 2) // 3 * 4
    return None, size


#: The reasons a refused call is counted under (``ovserve_requests_malformed_total``'s ``reason``).
MALFORMED, TOO_LARGE = "malformed", "metadata_too_large"
#: The most characters of a refused call's method name in its access-log line.
QUOTED_METHOD = 128


def _method(path: str) -> str:
    """``/inference.GRPCInferenceService/ModelInfer`` -> ``ModelInfer``, as the access log names methods (cut:
    the path is the client's)."""
    return path.rsplit("/", 1)[-1][:QUOTED_METHOD]


def _peer(context: Any) -> str:
    peer = str(context.peer() or "")
    kind, sep, rest = peer.partition(":")
    return rest if sep and kind in ("ipv4", "ipv6") else peer


class MalformedRequests(grpc.aio.ServerInterceptor):
    """Refuses a malformed request (:func:`malformed`), and one whose metadata is past ``max_bytes``
    (:func:`header_bytes`), before its method's handler is looked up.

    gRPC's core (grpcio 1.85.4) applies its own limit (``grpc.max_metadata_size``) to the fields decoded
    from each frame: a header list spread over CONTINUATION frames, or one value split across two frames,
    passed it whole (1 MiB of one value, 200 KB of fields, were served). So the limit is applied here again,
    to the call's metadata as a whole: RESOURCE_EXHAUSTED, as the core says it."""

    def __init__(self, max_bytes: int, listener: str = "grpc", gate: Gate = OPEN_GATE) -> None:
        self.max_bytes = max_bytes
        #: the listener's name and gate (its access log), for the refused calls' lines
        self.listener, self.gate = listener, gate
        #: calls refused so far, by reason (MALFORMED, TOO_LARGE)
        self.refused: dict[str, int] = {MALFORMED: 0, TOO_LARGE: 0}

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        metadata = handler_call_details.invocation_metadata or ()
        why, size = _look(metadata)
        if why is not None:
            return self.refusal(str(handler_call_details.method or ""), metadata, MALFORMED,
                                grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {why}")
        if size > self.max_bytes:
            return self.too_large(str(handler_call_details.method or ""), metadata, size)
        return await continuation(handler_call_details)

    def too_large(self, path: str, metadata: Iterable[tuple[str, Any]], size: int) -> grpc.RpcMethodHandler[Any, Any]:
        """The refusal of a call whose metadata is ``size`` bytes, past :attr:`max_bytes`."""
        return self.refusal(path, metadata, TOO_LARGE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"request metadata of {size} bytes is past the {self.max_bytes} this server takes")

    def reset(self) -> None:
        """A malformed request the engine reset itself (the loop engine: RST_STREAM PROTOCOL_ERROR, never a call,
        so nothing to log): counted."""
        self.refused[MALFORMED] += 1

    def refusal(self, path: str, metadata: Iterable[tuple[str, Any]], reason: str, code: grpc.StatusCode,
                message: str) -> grpc.RpcMethodHandler[Any, Any]:
        """A handler that ends the call to ``path`` at once: request-streaming, so it runs before any of the
        request's body is read, whatever the method's own shape. Counted, and logged when the access log is on."""
        self.refused[reason] += 1
        clock = Clock()
        method = _method(path)
        given = next((v for k, v in metadata if k == HEADER and isinstance(v, str)), None)

        async def refuse(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            if self.gate.access_log is not None:
                rid = request_id(given)
                context.set_trailing_metadata(((HEADER, rid),))
                self.gate.log({
                    "time": now_iso(clock.wall), "listener": self.listener, "method": method, "model": "",
                    "version": "", "status": code.name, "latency_ms": clock.latency_ms(), "bytes_in": 0,
                    "bytes_out": 0, "client": _peer(context), "request_id": rid,
                })
            await context.abort(code, message)

        return grpc.stream_stream_rpc_method_handler(refuse)
