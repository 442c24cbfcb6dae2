"""What a call made on a request's behalf carries besides its own headers (a transformer's or an explainer's
call to its predictor): each function here adds its headers to the outgoing call's.

Empty unless the process put something here: the server's tracing (``ovserve.server.tracing``), when on,
adds the W3C ``traceparent``/``tracestate`` of the current span, so one trace goes on to the predictor. The
predictor client (:mod:`ovserve.client`) calls them on every call while the list is not empty; neither it nor
this module imports OpenTelemetry.
"""
from __future__ import annotations

from collections.abc import Callable, MutableMapping

#: functions that add headers (lower-case names) to an outgoing call's
injectors: list[Callable[[MutableMapping[str, str]], None]] = []


def headers() -> dict[str, str]:
    """The headers the injectors add for the current request (empty: none, or nothing to carry)."""
    carrier: dict[str, str] = {}
    for inject in injectors:
        inject(carrier)
    return carrier
