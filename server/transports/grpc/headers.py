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

Only grpcio runs interceptors at no extra cost; the experimental engines (loop, native) are not covered.
"""
from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc

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
    for name, value in metadata:
        if name not in _known_names:
            why = _bad_name(name)
            if why is not None:
                return why
            if len(_known_names) < KNOWN_NAMES:
                _known_names.add(name)
        # the common case at the cost of a method call: printable, no space at either end
        if (isinstance(value, str) and not (value.isprintable() and value[:1] != " " and value[-1:] != " ")
                and _BAD_VALUE.search(value) is not None):
            return (f"invalid value of header field {_quoted(name)}: a control character, or white space at "
                    "either end (RFC 9113 §8.2.1)")
    return None


def _refusal(why: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that ends the call INVALID_ARGUMENT at once: request-streaming, so it runs before any of the
    request's body is read, whatever the method's own shape."""

    async def refuse(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {why}")

    return grpc.stream_stream_rpc_method_handler(refuse)


class MalformedRequests(grpc.aio.ServerInterceptor):
    """Refuses a malformed request (:func:`malformed`) before its method's handler is looked up."""

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        why = malformed(handler_call_details.invocation_metadata or ())
        if why is not None:
            return _refusal(why)
        return await continuation(handler_call_details)
