"""The server's errors: the one hierarchy and status table of :mod:`ovserve.common.errors`.

Defined there because the codecs the client shares raise them and the predictor
client's errors derive from them; the server's modules import them from here.
"""
from __future__ import annotations

from ovserve.common.errors import (
    GRPC_STATUS,
    HTTP_STATUS,
    PUSHBACK_METADATA,
    RETRY_AFTER_HEADER,
    RETRY_AFTER_METADATA,
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
    bounded,
    grpc_status,
    http_status,
    statuses,
)

__all__ = ["ServerError", "InvalidInput", "NotFound", "Unavailable", "PayloadTooLarge", "FailedPrecondition",
           "AlreadyExists", "PermissionDenied", "Unauthenticated", "Overloaded",
           "Unsupported", "DeadlineExceeded", "InternalError", "HTTP_STATUS", "GRPC_STATUS", "statuses",
           "http_status", "grpc_status", "RETRY_AFTER_HEADER", "PUSHBACK_METADATA",
           "RETRY_AFTER_METADATA", "bounded"]
