"""Errors that come from the predictor: its status, its message, marked ``predictor: ``.

Each is a subclass of the matching class of the one error hierarchy
(:mod:`ovserve.common.errors`, which the server's transports map), so a
transformer or explainer that lets one through answers its own client with the
HTTP status or gRPC code the predictor gave, without importing this package's
classes or the client importing the server.
"""
from __future__ import annotations

from typing import Any

from ovserve.common.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InternalError,
    InvalidInput,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    PermissionDenied,
    ServerError,
    Unauthenticated,
    Unavailable,
    Unsupported,
    statuses,
)

PREFIX = "predictor: "


class PredictorError(ServerError):
    """Mixin of every error that comes from the predictor; ``status`` is its HTTP status
    (the predictor's own, or the class's row of the error table)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message if message.startswith(PREFIX) else PREFIX + message)
        self.status = status if status is not None else statuses(type(self))[0]


class PredictorInvalidInput(PredictorError, InvalidInput):
    pass


class PredictorNotFound(PredictorError, NotFound):
    pass


class PredictorUnavailable(PredictorError, Unavailable):
    pass


class PredictorPayloadTooLarge(PredictorError, PayloadTooLarge):
    pass


class PredictorOverloaded(PredictorError, Overloaded):
    pass


class PredictorFailedPrecondition(PredictorError, FailedPrecondition):
    pass


class PredictorAlreadyExists(PredictorError, AlreadyExists):
    pass


class PredictorPermissionDenied(PredictorError, PermissionDenied):
    pass


class PredictorUnauthenticated(PredictorError, Unauthenticated):
    pass


class PredictorUnsupported(PredictorError, Unsupported):
    pass


class PredictorTimeout(PredictorError, DeadlineExceeded):
    pass


class PredictorInternal(PredictorError, InternalError):
    pass


_CLASSES: tuple[type[PredictorError], ...] = (
    # PredictorOverloaded before PredictorPayloadTooLarge: both are RESOURCE_EXHAUSTED over gRPC, where
    # the later one wins the code (a request too large was its only meaning before 429 existed)
    PredictorOverloaded, PredictorInvalidInput, PredictorNotFound, PredictorUnavailable, PredictorPayloadTooLarge,
    PredictorFailedPrecondition, PredictorAlreadyExists, PredictorPermissionDenied, PredictorUnauthenticated,
    PredictorUnsupported, PredictorTimeout, PredictorInternal)
#: the predictor's HTTP status or gRPC code -> the class with that row in the error table
_BY_HTTP: dict[int, type[PredictorError]] = {statuses(c)[0]: c for c in _CLASSES}
_BY_GRPC: dict[str, type[PredictorError]] = ({statuses(c)[1]: c for c in _CLASSES}
                                             | {"OUT_OF_RANGE": PredictorInvalidInput})


def error_from_http(status: int, message: str, retry_after: str | None = None) -> PredictorError:
    """The predictor's HTTP error as a ServerError with the same status (the nearest one for others); a
    429's ``Retry-After`` (delay-seconds) stays its retry hint, which a transformer answers in turn."""
    klass = _BY_HTTP.get(status) or (PredictorInvalidInput if 400 <= status < 500 else PredictorInternal)
    err = klass(message, status)
    if isinstance(err, Overloaded) and retry_after and retry_after.strip().isdigit():
        err.retry_after_s = max(Overloaded.MIN_RETRY_AFTER_S, float(retry_after))
    return err


def error_from_grpc(code_name: str, message: str, pushback_ms: str | None = None) -> PredictorError:
    """The predictor's gRPC error as a ServerError of the same code. RESOURCE_EXHAUSTED is a request too
    large unless it carries a retry hint (``grpc-retry-pushback-ms`` or ``retry-after-ms``), which a refusal
    under load does: then an Overloaded (429) with the hint as its retry hint."""
    if code_name == "RESOURCE_EXHAUSTED" and pushback_ms is not None and pushback_ms.isdigit():
        err = PredictorOverloaded(message)
        err.retry_after_s = max(Overloaded.MIN_RETRY_AFTER_S, int(pushback_ms) / 1000)
        return err
    return _BY_GRPC.get(code_name, PredictorInternal)(message)


def http_message(resp: Any) -> str:
    """The message of an HTTP error reply: its JSON ``error``, else its text (at most 500 characters)."""
    try:
        doc = resp.json()
        message = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(message, str):
            return message
    except ValueError:
        pass
    text = resp.text.strip()
    return text[:500] or f"HTTP {resp.status_code}"
