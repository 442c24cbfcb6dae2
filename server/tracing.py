"""OpenTelemetry tracing: the one module of the server that imports OpenTelemetry (docs/operations.md "Tracing").

Off by default, and free when off: :data:`enabled` is a module attribute every hook reads first (a global
lookup), and nothing of OpenTelemetry is imported until :func:`configure` turns tracing on. On, the process
gets an SDK tracer provider that samples ``ParentBased(TraceIdRatioBased(ratio))`` and exports in batches
over OTLP/HTTP (``opentelemetry-exporter-otlp-proto-http``: the ``tracing`` extra, which the server image
carries), to ``--trace-endpoint`` or wherever the standard ``OTEL_EXPORTER_OTLP_*`` variables say.

What the transports and the data planes call (each only behind ``if tracing.enabled``):

- :func:`server_span`: the request's span, its parent the W3C ``traceparent``/``tracestate`` the client sent
  (REST headers, gRPC metadata), current for everything the request runs;
- :func:`span`: a child span around a step (``inference``), and :func:`record`: a finished child span from
  two ``time.perf_counter()`` readings the code already takes (``queue``, ``image_decode``);
- the predictor client's outgoing calls carry the current context: :func:`configure` registers
  :func:`inject` with :mod:`ovserve.common.outgoing`, which the client reads, so the client itself never
  imports OpenTelemetry.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ovserve.common import outgoing

from .errors import InvalidInput

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("ovserve")

#: whether this process traces; read by every hook before anything else
enabled = False
#: the instrumentation scope's name on every span
SCOPE = "ovserve"
#: the service name when OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES' service.name) says none
DEFAULT_SERVICE = "ovserve"

_tracer: Tracer | None = None
_provider: Any = None


def wanted(endpoint: str | None, env: Mapping[str, str] = os.environ) -> bool:
    """Whether the settings turn tracing on: ``--trace-endpoint``, or an OTLP endpoint variable with the
    traces exporter not set to ``none`` and the SDK not disabled (OTEL_SDK_DISABLED)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if endpoint:
        return True
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def sample_ratio(ratio: float | None, env: Mapping[str, str] = os.environ) -> float:
    """``--trace-sample-ratio``, else OTEL_TRACES_SAMPLER_ARG, else 1 (every trace a client did not decide)."""
    if ratio is None:
        text = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
        try:
            ratio = float(text) if text else 1.0
        except ValueError:
            raise InvalidInput(f"OTEL_TRACES_SAMPLER_ARG {text!r} is not a number") from None
    if not 0.0 <= ratio <= 1.0:
        raise InvalidInput(f"the trace sample ratio {ratio:g} is not between 0 and 1")
    return ratio


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of ``--trace-endpoint``: a base URL gets ``/v1/traces``, as
    OTEL_EXPORTER_OTLP_ENDPOINT does; a URL with a path is taken as it is."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise InvalidInput(f"--trace-endpoint {endpoint!r} is not an http(s):// URL (OTLP/HTTP)")
    _, slash, path = rest.partition("/")
    return endpoint if slash and path.strip("/") else endpoint.rstrip("/") + "/v1/traces"


def configure(endpoint: str | None = None, ratio: float | None = None) -> bool:
    """Turn tracing on for this process when the settings say so (:func:`wanted`); True if on.

    An invalid setting, or the extra not installed while tracing is asked for, is an :class:`InvalidInput`
    (``cannot start: ...``)."""
    global enabled, _tracer, _provider
    if not wanted(endpoint):
        return False
    chosen = sample_ratio(ratio)
    url = traces_url(endpoint) if endpoint else None
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise InvalidInput(f"tracing needs OpenTelemetry's SDK and OTLP exporter: pip install 'ovserve[tracing]' "
                           f"({exc.name} is missing)") from None
    from .version import __version__

    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by Resource.create and win over the default
    attributes: dict[str, Any] = {"service.version": __version__}
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if not named:
        attributes[SERVICE_NAME] = DEFAULT_SERVICE
    provider = TracerProvider(resource=Resource.create(attributes), sampler=ParentBased(TraceIdRatioBased(chosen)))
    # the exporter reads OTEL_EXPORTER_OTLP_* (headers, timeout, certificate, compression) for what is not given
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url) if url else OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer(SCOPE, __version__)
    outgoing.injectors.append(inject)
    enabled = True
    log.info("tracing on: OTLP/HTTP to %s, sample ratio %g", url or _env_endpoint(), chosen)
    return True


def _env_endpoint() -> str:
    return (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "") + " (OTEL_EXPORTER_OTLP_ENDPOINT)")


def shutdown() -> None:
    """Export what is left and stop the exporter's thread (at the process's end; nothing when off)."""
    global enabled, _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    enabled = False
    if inject in outgoing.injectors:
        outgoing.injectors.remove(inject)
    if provider is not None:
        provider.shutdown()


@contextmanager
def server_span(name: str, carrier: Mapping[str, str], attributes: Mapping[str, Any] | None = None) -> Iterator[Span]:
    """The span of one request a listener serves, its parent the context ``carrier`` (the request's headers or
    metadata, keys lower-case) propagates, current until it ends. Its status is the
    transport's to set (:func:`annotate`, :func:`mark_error`), from the status it answers."""
    from opentelemetry import propagate, trace

    assert _tracer is not None
    parent = propagate.extract(carrier)
    # the transport sets the status from the one it answers (a client's 4xx / INVALID_ARGUMENT is no error
    # of the server's): an exception through the span (a gRPC abort) does not
    with _tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER, attributes=attributes,
                                       record_exception=False, set_status_on_exception=False) as current:
        yield current


@contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Span]:
    """A child of the current span around a step, current within it; an exception marks it an error."""
    assert _tracer is not None
    with _tracer.start_as_current_span(name, attributes=attributes) as current:
        yield current


def _epoch_ns(perf: float, now_perf: float, now_ns: int) -> int:
    return now_ns - int((now_perf - perf) * 1e9)


def record(name: str, started: float, ended: float, attributes: Mapping[str, Any] | None = None) -> None:
    """A finished child of the current span, from ``time.perf_counter()`` readings (a wait measured anyway)."""
    assert _tracer is not None
    now_perf, now_ns = time.perf_counter(), time.time_ns()
    child = _tracer.start_span(name, attributes=attributes, start_time=_epoch_ns(started, now_perf, now_ns))
    child.end(end_time=_epoch_ns(ended, now_perf, now_ns))


def current_context() -> Any:
    """The current OpenTelemetry context, for work another task does on a request's behalf (a batch)."""
    from opentelemetry import context

    return context.get_current()


def record_in(parent: Any, name: str, started: float, ended: float,
              attributes: Mapping[str, Any] | None = None) -> None:
    """:func:`record` as a child of ``parent`` (a :func:`current_context`) rather than of the current span."""
    from opentelemetry import context

    token = context.attach(parent)
    try:
        record(name, started, ended, attributes)
    finally:
        context.detach(token)


def inject(carrier: MutableMapping[str, str]) -> None:
    """The current context, as ``traceparent`` (and ``tracestate``), into an outgoing call's headers."""
    from opentelemetry import propagate

    propagate.inject(carrier)


def set_attributes(target: Span, attributes: Mapping[str, Any]) -> None:
    """Attributes known only at the end (the version that served, the status)."""
    target.set_attributes({k: v for k, v in attributes.items() if v is not None and v != ""})


def mark_error(target: Span, description: str) -> None:
    """A request that failed without an exception through the span (an error status answered)."""
    from opentelemetry.trace import Status, StatusCode

    target.set_status(Status(StatusCode.ERROR, description))


def annotate(attributes: Mapping[str, Any], error: str | None = None) -> None:
    """Attributes on the current span, and an error status when ``error`` says what went wrong."""
    from opentelemetry import trace

    current = trace.get_current_span()
    set_attributes(current, attributes)
    if error is not None:
        mark_error(current, error)
