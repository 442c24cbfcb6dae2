"""Calls in flight, and the one place gRPC errors are mapped.

Every unary method of every ovserve servicer is wrapped by :func:`unary` (and
every response-streaming one by :func:`streaming`): a
:class:`~ovserve.server.errors.ServerError` ends the call with its status from
the error table (:func:`~ovserve.server.errors.grpc_status`), an Overloaded's retry hint in
``retry-after-ms`` and, where the engine can send it, ``grpc-retry-pushback-ms`` (:func:`abort`);
anything else is
logged once and ends it INTERNAL, with no traceback for the client. A stream
that answers errors in-band (KServe's ModelStreamInfer) takes its message from
:func:`in_band`, through the same table.

The same decorators are the gRPC side of the one request-outcome hook of the
metrics (server/metrics): a method a servicer lists in ``observed`` is counted,
and timed, under its :class:`~ovserve.server.metrics.calls.Call` for the model its
request names, once it has ended, well or not.

A decorator rather than a grpc.aio interceptor: the native engine runs a
server with interceptors through its slower grpc.aio fallback.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import grpc

from ... import tracing
from ...errors import (
    PUSHBACK_METADATA,
    RETRY_AFTER_METADATA,
    Overloaded,
    ServerError,
    Unavailable,
    bounded,
    grpc_status,
)
from ...gate import INFERENCE, OPEN_GATE, Access, Gate
from ...metrics.calls import Call
from .gate import gated_stream, gated_unary

if TYPE_CHECKING:  # loaded only when metrics are on
    from ...metrics.registry import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")


class Metadata(Mapping[str, str]):
    """A call's invocation metadata as the ``headers`` a data plane may read (read on first use:
    the model server never asks)."""

    __slots__ = ("_context", "_items")

    def __init__(self, context: Any) -> None:
        self._context = context
        self._items: dict[str, str] | None = None

    def _dict(self) -> dict[str, str]:
        if self._items is None:
            self._items = {k: v for k, v in (self._context.invocation_metadata() or ()) if isinstance(v, str)}
        return self._items

    def __getitem__(self, key: str) -> str:
        return self._dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())


def status_of(exc: ServerError) -> grpc.StatusCode:
    return grpc.StatusCode[grpc_status(exc)]


async def abort(context: Any, exc: ServerError, pushback: bool = True) -> None:
    """End the call with the error's status and message; a refusal under load (Overloaded) also says when
    to come back, in the trailing metadata beside what is there (the access log's x-request-id):
    ``retry-after-ms`` always, ``grpc-retry-pushback-ms`` (which a retry policy obeys) unless the engine
    cannot send it (``pushback`` False: see :attr:`Servicer.pushback`)."""
    if isinstance(exc, Overloaded):
        ms = exc.pushback_ms()
        hints = ((RETRY_AFTER_METADATA, ms), (PUSHBACK_METADATA, ms)) if pushback else ((RETRY_AFTER_METADATA, ms),)
        context.set_trailing_metadata((*tuple(context.trailing_metadata() or ()), *hints))
    if tracing.enabled:
        _traced_status(grpc_status(exc), exc.message)
    # cut as a ServerError's own message is, whatever set it: a grpc-message past the 16 KiB of headers a
    # gRPC client takes reaches it as its own RESOURCE_EXHAUSTED instead of this error
    await context.abort(status_of(exc), bounded(exc.message))


class InFlight:
    """The calls being served on one gRPC server, and the switch that refuses new ones once
    shutdown begins (grpc.aio drains by itself; the native engine needs it done first)."""

    def __init__(self) -> None:
        self.count = 0
        self.closing = False
        self.last_done = float("-inf")  # loop time the last call ended
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        if self.closing:
            raise Unavailable("the server is shutting down")
        self.count += 1
        self._idle.clear()

    def leave(self) -> None:
        self.count -= 1
        self.last_done = asyncio.get_running_loop().time()
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the calls in flight to end. True if none is left."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


class Observed:
    """How one method's requests count in the metrics: its call, and the request's fields that name
    the model and the version (no version field: a call OVMS counts per model)."""

    __slots__ = ("call", "name", "version")

    def __init__(self, call: Call, name: str = "model_name", version: str = "model_version") -> None:
        self.call, self.name, self.version = call, name, version

    def done(self, metrics: Metrics, request: Any, ok: bool, started: float) -> None:
        version = getattr(request, self.version) if self.call.versioned else ""
        metrics.done(self.call, getattr(request, self.name), version, ok, started)


class Servicer:
    """Base of ovserve's servicers: the listener that registers one gives it its server's calls in
    flight (every service on one port drains together), its gate and its name.

    ``access`` names the methods that need other than ``default_access``'s token (server/gate/auth.py):
    health methods ``open``, management methods ``management``."""

    access: ClassVar[Mapping[str, Access]] = {}
    default_access: ClassVar[Access] = INFERENCE
    #: the service's full name (``inference.GRPCInferenceService``): its calls' span names with tracing on
    service_name: ClassVar[str] = ""
    #: the methods whose requests the metrics count, by name
    observed: ClassVar[Mapping[str, Observed]] = {}

    def __init__(self) -> None:
        #: the process's metrics when they are on (a servicer takes its data plane's)
        self.metrics: Metrics | None = None
        self.in_flight = InFlight()
        self.gate: Gate = OPEN_GATE
        self.listener = ""
        #: whether a refusal under load may carry grpc-retry-pushback-ms: not on pygrpc-native 0.5, which
        #: takes metadata keys starting "grpc-" for reserved ones and then never ends the call (the client
        #: waits out its deadline); set by the listener from its engine
        self.pushback = True


async def enter(in_flight: InFlight, context: Any) -> None:
    """Count a call in flight, or end it UNAVAILABLE once the server is shutting down. A method that
    manages its own call (a bidirectional stream answering in-band) pairs it with ``in_flight.leave()``."""
    try:
        in_flight.enter()
    except ServerError as exc:
        await abort(context, exc)


async def _abort(context: Any, exc: BaseException, method: str, pushback: bool) -> None:
    if isinstance(exc, ServerError):
        await abort(context, exc, pushback)
    log.error("unexpected error in %s", method, exc_info=exc)
    if tracing.enabled:
        _traced_status("INTERNAL", type(exc).__name__)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")


def _traced_status(code: str, message: str) -> None:
    """The status a call ends with, on its span (tracing on): the status code, an error but for the codes a
    client's request caused (OpenTelemetry's semantic conventions for a gRPC server)."""
    tracing.annotate({"rpc.grpc.status_code": grpc.StatusCode[code].value[0], "rpc.grpc.status": code},
                     error=message if code in _SERVER_FAULTS else None)


_OK = {"rpc.grpc.status_code": 0, "rpc.grpc.status": "OK"}

#: the probes' methods, which make no span (a kubelet's every few seconds would drown the traces)
UNTRACED = frozenset({"ServerLive", "ServerReady", "Ping"})

#: the codes a gRPC server's span counts as its error (OpenTelemetry's semantic conventions)
_SERVER_FAULTS = frozenset({"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE",
                            "DATA_LOSS"})


def _call_span(servicer: Servicer, method: str, request: Any, context: Any) -> Any:
    """The span of one call (tracing on): its parent the trace context of the call's metadata; named as
    OpenTelemetry names an RPC, with the model the request names."""
    attributes: dict[str, Any] = {"rpc.system": "grpc", "rpc.service": servicer.service_name,
                                  "rpc.method": method, "ovserve.listener": servicer.listener}
    name = getattr(request, "model_name", None)
    if isinstance(name, str) and name:
        attributes["ovserve.model.name"] = name
        version = getattr(request, "model_version", "")
        if isinstance(version, str) and version:
            attributes["ovserve.model.version"] = version
    return tracing.server_span(f"{servicer.service_name}/{method}", Metadata(context), attributes)


async def _begin(servicer: Servicer, method: str, context: Any) -> tuple[Observed | None, float]:
    """A counted call begins (:func:`enter`): what observes it in the metrics (None: nothing) and when."""
    await enter(servicer.in_flight, context)
    observed = servicer.observed.get(method) if servicer.metrics is not None else None
    return observed, (time.perf_counter() if observed is not None else 0.0)


def _end(servicer: Servicer, request: Any, observed: Observed | None, ok: bool, started: float) -> None:
    """The call :func:`_begin` counted has ended, ``ok`` or not."""
    servicer.in_flight.leave()
    if observed is not None and servicer.metrics is not None:
        observed.done(servicer.metrics, request, ok, started)


def unary(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """A unary-response method: behind the gate (tokens, access log), counted in flight, its errors
    mapped to a status."""

    method = fn.__name__

    @functools.wraps(fn)
    def call(self: Servicer, request: Any, context: Any) -> Awaitable[Any]:
        # a plain function: with tracing off, the call costs one attribute read and no frame of its own
        if tracing.enabled and method not in UNTRACED:
            return traced(self, request, context)
        return served(self, request, context)

    async def traced(self: Servicer, request: Any, context: Any) -> Any:
        with _call_span(self, method, request, context):
            reply = await served(self, request, context)  # a failure's status is set where it is mapped
            tracing.annotate(_OK)
            return reply

    async def served(self: Servicer, request: Any, context: Any) -> Any:
        observed, started = await _begin(self, method, context)
        ok = False
        try:
            reply = await fn(self, request, context)
            ok = True
            return reply
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            await _abort(context, exc, method, self.pushback)
        finally:
            _end(self, request, observed, ok, started)

    return gated_unary(call)


def streaming(fn: Callable[..., AsyncIterator[T]]) -> Callable[..., AsyncIterator[T]]:
    """A response-streaming method (an async generator): behind the gate, the whole stream counts as one
    call in flight; an error that escapes it ends the stream with a status."""

    method = fn.__name__

    @functools.wraps(fn)
    def call(self: Servicer, request: Any, context: Any) -> AsyncIterator[T]:
        # a plain function: with tracing off, the stream costs one attribute read and no generator of its own
        return traced(self, request, context) if tracing.enabled else served(self, request, context)

    async def traced(self: Servicer, request: Any, context: Any) -> AsyncIterator[T]:
        with _call_span(self, method, request, context):
            async for reply in served(self, request, context):
                yield reply
            tracing.annotate(_OK)

    async def served(self: Servicer, request: Any, context: Any) -> AsyncIterator[T]:
        observed, started = await _begin(self, method, context)
        ok = False
        try:
            async for reply in fn(self, request, context):
                yield reply
            ok = True
        except (asyncio.CancelledError, grpc.aio.AbortError, GeneratorExit):
            raise
        except Exception as exc:
            await _abort(context, exc, method, self.pushback)
        finally:
            _end(self, request, observed, ok, started)

    return gated_stream(call)


def bidi(fn: Callable[..., AsyncIterator[T]]) -> Callable[..., AsyncIterator[T]]:
    """A bidirectional stream (it counts itself in flight with :func:`enter`): behind the gate; with tracing
    on, the whole stream is one span, each message's inference a child of it."""
    method = fn.__name__

    @functools.wraps(fn)
    def call(self: Servicer, requests: Any, context: Any) -> AsyncIterator[T]:
        return traced(self, requests, context) if tracing.enabled else fn(self, requests, context)

    async def traced(self: Servicer, requests: Any, context: Any) -> AsyncIterator[T]:
        with _call_span(self, method, None, context):
            async for reply in fn(self, requests, context):
                yield reply
            tracing.annotate(_OK)

    return gated_stream(call, client_streaming=True)


def in_band(exc: Exception, method: str) -> str:
    """The message a stream answers in-band for one failed message (the unexpected logged once)."""
    if isinstance(exc, ServerError):
        return bounded(exc.message)
    log.error("unexpected error in %s", method, exc_info=exc)
    return f"internal error: {type(exc).__name__}"
