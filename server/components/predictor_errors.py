"""Errors that come from the predictor: its status, its message, marked ``predictor: ``.

Each is a subclass of the matching class of :mod:`ovserve.server.errors`, so the
transports' one mapping gives the client the same HTTP status or gRPC code the
predictor gave.
"""
from __future__ import annotations

from typing import Any

from ..errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InternalError,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ServerError,
    Unavailable,
    Unsupported,
)

PREFIX = "predictor: "


class PredictorError(ServerError):
    """Mixin of every error that comes from the predictor; ``status`` is its HTTP status."""

    status: int = 500

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message if message.startswith(PREFIX) else PREFIX + message)
        if status is not None:
            self.status = status


class PredictorInvalidInput(PredictorError, InvalidInput):
    status = 400


class PredictorNotFound(PredictorError, NotFound):
    status = 404


class PredictorUnavailable(PredictorError, Unavailable):
    status = 503


class PredictorPayloadTooLarge(PredictorError, PayloadTooLarge):
    status = 413


class PredictorFailedPrecondition(PredictorError, FailedPrecondition):
    status = 412


class PredictorUnsupported(PredictorError, Unsupported):
    status = 501


class PredictorTimeout(PredictorError, DeadlineExceeded):
    status = 504


class PredictorInternal(PredictorError, InternalError):
    status = 500


_BY_HTTP: dict[int, type[PredictorError]] = {
    c.status: c for c in (PredictorInvalidInput, PredictorNotFound, PredictorUnavailable, PredictorPayloadTooLarge,
                          PredictorFailedPrecondition, PredictorUnsupported, PredictorTimeout, PredictorInternal)
}
_BY_GRPC: dict[str, type[PredictorError]] = {
    "INVALID_ARGUMENT": PredictorInvalidInput,
    "OUT_OF_RANGE": PredictorInvalidInput,
    "NOT_FOUND": PredictorNotFound,
    "UNAVAILABLE": PredictorUnavailable,
    "RESOURCE_EXHAUSTED": PredictorPayloadTooLarge,
    "FAILED_PRECONDITION": PredictorFailedPrecondition,
    "UNIMPLEMENTED": PredictorUnsupported,
    "DEADLINE_EXCEEDED": PredictorTimeout,
}


def error_from_http(status: int, message: str) -> PredictorError:
    """The predictor's HTTP error as a ServerError with the same status (the nearest one for others)."""
    klass = _BY_HTTP.get(status) or (PredictorInvalidInput if 400 <= status < 500 else PredictorInternal)
    return klass(message, status)


def error_from_grpc(code_name: str, message: str) -> PredictorError:
    return _BY_GRPC.get(code_name, PredictorInternal)(message)


def _http_message(resp: Any) -> str:
    try:
        doc = resp.json()
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            return doc["error"]
    except ValueError:
        pass
    text = resp.text.strip()
    return text[:500] or f"HTTP {resp.status_code}"
