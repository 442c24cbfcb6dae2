"""The gRPC side of the gate (server/gate): tokens checked and the access log written, per call.

The decorators of :mod:`.calls` (``@unary``, ``@streaming``, ``@bidi``) wrap every
method of every ovserve servicer with :func:`gated_unary` or
:func:`gated_stream`, so that the KServe V2 and both TorchServe services make
the same check through :meth:`~ovserve.server.gate.Gate.authorize`. Which token a
method needs is its servicer's to say (``Servicer.access``, by method name, and
``Servicer.default_access``). ``grpc.health.v1`` and reflection are no
servicer of ovserve's and stay open: probes carry no token, and reflection
describes only the public protocols.

A refused call ends UNAUTHENTICATED before it counts in flight. With
``--access-log`` the call's ``x-request-id`` (the client's or a new one) goes
back in its trailing metadata, whatever its status.
"""
from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from ovserve.common import requestids

from ...errors import Unauthenticated
from ...gate import Gate
from ...gate.accesslog import HEADER, Clock, now_iso, request_id

T = TypeVar("T")


def _size(message: Any) -> int:
    try:
        return int(message.ByteSize())
    except AttributeError:  # not a protobuf message (None, bytes)
        return 0


def _peer(context: Any) -> str:
    """``ipv4:127.0.0.1:5000`` -> ``127.0.0.1:5000`` (``ipv6:[::1]:5000`` -> ``[::1]:5000``)."""
    peer = str(context.peer() or "")
    kind, sep, rest = peer.partition(":")
    return rest if sep and kind in ("ipv4", "ipv6") else peer


def _model(message: Any) -> tuple[str, str]:
    """The model and version a request names (KServe's ``model_name``/``name``, TorchServe's ``model_name``)."""
    name = getattr(message, "model_name", None)
    if name is None:
        name = getattr(message, "name", "")
    version = getattr(message, "model_version", None)
    if version is None:
        version = getattr(message, "version", "")
    return str(name), str(version)


class _Call:
    """One call's line of the access log, filled in as it goes."""

    __slots__ = ("bytes_in", "bytes_out", "clock", "model", "rid", "version")

    def __init__(self, rid: str) -> None:
        self.clock = Clock()
        self.rid = rid
        self.model = self.version = ""
        self.bytes_in = self.bytes_out = 0

    def seen(self, message: Any) -> None:
        if not self.model:
            self.model, self.version = _model(message)
        self.bytes_in += _size(message)


async def _admit(servicer: Any, method: str, context: Any) -> _Call | None:
    """Check the call's token (end it UNAUTHENTICATED if refused); its log line when logging."""
    gate: Gate = servicer.gate
    authorization = given_id = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            authorization = value if isinstance(value, str) else None
        elif key == HEADER:
            given_id = value if isinstance(value, str) else None
    call = None
    if gate.access_log is not None:
        call = _Call(request_id(given_id))
        context.set_trailing_metadata(((HEADER, call.rid),))
        # for the calls it makes on (a component's predictor); the call is a task of its own: nothing to reset
        requestids.current.set(call.rid)
    try:
        gate.authorize(servicer.access.get(method, servicer.default_access), authorization)
    except Unauthenticated as exc:
        if call is not None:
            _log(servicer, method, context, call, "UNAUTHENTICATED")
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
    return call


def _code(context: Any, exc: BaseException | None) -> str:
    if exc is None:
        return "OK"
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):  # the client went away
        return "CANCELLED"
    code = context.code() if hasattr(context, "code") else None
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


def _log(servicer: Any, method: str, context: Any, call: _Call, code: str) -> None:
    servicer.gate.log({
        "time": now_iso(call.clock.wall), "listener": servicer.listener, "method": method,
        "model": call.model, "version": call.version, "status": code, "latency_ms": call.clock.latency_ms(),
        "bytes_in": call.bytes_in, "bytes_out": call.bytes_out, "client": _peer(context), "request_id": call.rid,
    })


def gated_unary(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """A unary-response method behind the gate (untouched while the gate is idle)."""
    method = fn.__name__

    @functools.wraps(fn)
    async def call(self: Any, request: Any, context: Any) -> Any:
        if self.gate.idle:
            return await fn(self, request, context)
        line = await _admit(self, method, context)
        if line is None:
            return await fn(self, request, context)
        line.seen(request)
        failure: BaseException | None = None
        try:
            reply = await fn(self, request, context)
            line.bytes_out += _size(reply)
            return reply
        except BaseException as exc:
            failure = exc
            raise
        finally:
            _log(self, method, context, line, _code(context, failure))

    return call


def gated_stream(fn: Callable[..., AsyncIterator[T]],
                 client_streaming: bool = False) -> Callable[..., AsyncIterator[T]]:
    """A response-streaming method behind the gate; ``client_streaming``: its request is a stream of
    messages too (counted, the first one naming the model)."""
    method = fn.__name__

    @functools.wraps(fn)
    async def call(self: Any, request: Any, context: Any) -> AsyncIterator[T]:
        if self.gate.idle:
            async for reply in fn(self, request, context):
                yield reply
            return
        line = await _admit(self, method, context)
        if line is None:
            async for reply in fn(self, request, context):
                yield reply
            return
        if client_streaming:
            request = _counted(request, line)
        else:
            line.seen(request)
        failure: BaseException | None = None
        try:
            async for reply in fn(self, request, context):
                line.bytes_out += _size(reply)
                yield reply
        except BaseException as exc:
            failure = exc
            raise
        finally:
            _log(self, method, context, line, _code(context, failure))

    return call


async def _counted(requests: AsyncIterator[Any], line: _Call) -> AsyncIterator[Any]:
    async for message in requests:
        line.seen(message)
        yield message
