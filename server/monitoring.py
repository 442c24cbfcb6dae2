"""Metrics for ``ovserve serve``: what the flags and config.json's ``monitoring`` block turn on.

OVMS reads ``monitoring.metrics`` (``enable``, ``metrics_list``, ``endpoint_path``) from its
config.json at start; so does ovserve (a later edit of the block takes a restart, as in OVMS). A
flag wins over the file. With metrics off nothing of the metrics is imported (the idle server's
memory is a measured target).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .app import Listener
from .config import Settings
from .dataplane import DataPlane
from .repository.document import decode_config, load_document, read_config_file

if TYPE_CHECKING:
    from .metrics.registry import Metrics


def _monitoring(settings: Settings) -> Any:
    if settings.config is None:
        return None
    doc = load_document(decode_config(read_config_file(settings.config)))
    return doc.get("monitoring") if isinstance(doc, dict) else None


def metrics(settings: Settings) -> Metrics | None:
    """The process's metrics, or None when they are off (InvalidInput for a setting that cannot be used)."""
    monitoring = _monitoring(settings)
    if not (settings.metrics_enable or settings.metrics_list or settings.metrics_port is not None
            or monitoring is not None):
        return None  # nothing asks for them
    from .metrics import calls
    from .metrics.config import configure
    from .metrics.families import parse_list
    from .metrics.registry import Metrics

    config = configure(settings.metrics_enable, parse_list(settings.metrics_list), settings.metrics_port, monitoring)
    if config is None:
        return None
    counted = list(calls.REST_CALLS)  # made at 0 for each model version, for the listeners this process has
    if settings.grpc_port is not None:
        counted += calls.GRPC_CALLS
    if settings.ts_inference_port is not None:
        counted += calls.TORCHSERVE_CALLS
    made = Metrics(config.families, counted)
    made.path, made.port = config.path, config.port
    return made


def add_listeners(listeners: list[tuple[Listener, int]], dataplane: DataPlane, settings: Settings) -> None:
    """The metrics listener when the metrics have a port of their own, and every listener's requests in
    flight (``ovserve_requests_in_flight``)."""
    from .transports.rest.metrics import MetricsListener

    made = dataplane.metrics
    assert made is not None
    counters = [(listener.name, listener) for listener, _ in listeners]

    def in_flight() -> list[tuple[tuple[str | None, ...], int]]:
        return [((name, ), _in_flight(listener)) for name, listener in counters]

    made.collect("ovserve_requests_in_flight", in_flight)

    def malformed() -> list[tuple[tuple[str | None, ...], int]]:
        return [((name, reason), count) for name, listener in counters
                for reason, count in _refused(listener).items()]

    made.collect("ovserve_requests_malformed_total", malformed)
    if made.port is not None:
        listeners.append((MetricsListener(dataplane, made.path, settings.max_header_bytes), made.port))


def _refused(listener: Any) -> dict[str, int]:
    """A gRPC listener's calls refused at its door, by reason (none on REST, whose parser refuses before)."""
    door = getattr(listener, "door", None)
    return dict(door.refused) if door is not None else {}


def _in_flight(listener: Any) -> int:
    count = getattr(listener, "requests_in_flight", None)  # the REST listener
    if count is not None:
        return int(count())
    calls = getattr(listener, "in_flight", None)  # a gRPC listener's calls in flight (every service on it)
    return int(calls.count) if calls is not None else 0
