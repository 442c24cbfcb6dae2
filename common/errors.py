"""The one error hierarchy of ovserve, and its two status tables.

gRPC codes are named by their ``grpc.StatusCode`` member name so that this
module imports no transport. Everything below the server's transports raises these; each transport maps
them once (REST in ``transports/rest/app.py``, gRPC through ``transports/grpc/calls.py``)
through :data:`HTTP_STATUS` and :data:`GRPC_STATUS`. The tables sit side by side
so that a test can pin every pair. The hierarchy lives in :mod:`ovserve.common` because the shared
codecs raise it and the client's predictor errors derive from it, so that a component re-raising a
predictor's error answers with the predictor's status; :mod:`ovserve.server.errors` re-exports it.
"""
from __future__ import annotations

import math
import re

#: The longest run of characters without a space that an error message quotes whole: a client's model name,
#: input name or value of 20,000 characters was echoed whole, and a gRPC reply's ``grpc-message`` past the
#: 16 KiB of headers gRPC clients accept reached its client as that client's own RESOURCE_EXHAUSTED instead
#: of the error (issue 33, item 10). A longer run keeps its first half of this and says how long it was.
LONGEST_QUOTED = 256
#: The longest message an error carries, whatever it quotes (the rest is cut, saying how much).
LONGEST_MESSAGE = 2048
_LONG_RUN = re.compile(rf"\S{{{LONGEST_QUOTED + 1},}}")


def _shorter(run: re.Match[str]) -> str:
    text = run.group()
    return f"{text[:LONGEST_QUOTED // 2]}...({len(text)} characters)"


def bounded(message: str) -> str:
    """``message`` with every run of more than LONGEST_QUOTED characters without a space cut, and at most
    LONGEST_MESSAGE characters in all: what an error may say to a client."""
    if len(message) <= LONGEST_QUOTED:
        return message
    message = _LONG_RUN.sub(_shorter, message)
    if len(message) > LONGEST_MESSAGE:
        message = f"{message[:LONGEST_MESSAGE]}...({len(message) - LONGEST_MESSAGE} characters cut)"
    return message


class ServerError(Exception):
    """Base of every error a client may see. ``str(err)`` is the client message."""

    #: set by the layer that already logged this error (it knew more, e.g. which model
    #: failed), so that a transport does not log it a second time
    logged: bool = False

    def __init__(self, message: str) -> None:
        message = bounded(message)  # names and values quoted from a request are cut here, once for every transport
        super().__init__(message)
        self.message = message


class InvalidInput(ServerError):
    """The request is malformed or does not fit the model."""


class NotFound(ServerError):
    """Unknown model, version or route."""


class Unavailable(ServerError):
    """The model (or server) exists but cannot serve now: loading, failed, unloading."""


class PayloadTooLarge(ServerError):
    """The request is larger than the configured limit."""


#: where each transport carries an Overloaded's retry hint: REST's header (RFC 9110), gRPC's trailing metadata
#: (gRFC A6's server pushback, which a client's retry policy obeys) ...
RETRY_AFTER_HEADER = "Retry-After"
PUSHBACK_METADATA = "grpc-retry-pushback-ms"
#: ... and, on every gRPC engine, the same milliseconds under a key of ovserve's own: pygrpc-native (the
#: default engine without TLS) cannot send a ``grpc-`` key, and a RESOURCE_EXHAUSTED with no hint at all
#: reads as a request too large (ovserve's predictor client reads either)
RETRY_AFTER_METADATA = "retry-after-ms"


class Overloaded(ServerError):
    """The model has as many requests queued as it may (``--max-queued-requests``): refused at once rather
    than queued behind them; the client may retry later.

    ``retry_after_s`` is when: about how long the requests ahead of it take to be served. Each transport
    maps it where it maps the status: REST's ``Retry-After`` header, gRPC's ``grpc-retry-pushback-ms``
    trailing metadata, which a client's retry policy obeys."""

    #: the default hint, and the least one: a client told to come back at once would only be refused again
    MIN_RETRY_AFTER_S = 1.0

    def __init__(self, message: str, retry_after_s: float = MIN_RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = max(self.MIN_RETRY_AFTER_S, retry_after_s)

    def retry_after_header(self) -> str:
        """REST's ``Retry-After``: whole seconds (RFC 9110's delay-seconds), rounded up."""
        return str(math.ceil(self.retry_after_s))

    def pushback_ms(self) -> str:
        """gRPC's ``grpc-retry-pushback-ms`` (gRFC A6): milliseconds, a signed 32-bit integer in ASCII."""
        return str(min(2**31 - 1, math.ceil(self.retry_after_s * 1000)))


class FailedPrecondition(ServerError):
    """The request is valid but the model cannot honour it (e.g. compile failure)."""


class AlreadyExists(ServerError):
    """What the request would create exists already (a model name and version registered twice)."""


class Unauthenticated(ServerError):
    """The request carries no valid credentials (a bearer token missing or wrong: the message never
    says which)."""


class PermissionDenied(ServerError):
    """The server is configured not to allow this (registration without --ts-model-api, a URL outside
    the allow-list)."""


class Unsupported(ServerError):
    """A feature ovserve does not implement."""


class DeadlineExceeded(ServerError):
    """The work did not finish within its deadline (e.g. an explanation's predictor calls)."""


class InternalError(ServerError):
    """A bug or a runtime failure; the message is safe to show."""


#                        REST status  gRPC status
_TABLE: dict[type[ServerError], tuple[int, str]] = {
    InvalidInput: (400, "INVALID_ARGUMENT"),
    NotFound: (404, "NOT_FOUND"),
    Unavailable: (503, "UNAVAILABLE"),
    PayloadTooLarge: (413, "RESOURCE_EXHAUSTED"),
    Overloaded: (429, "RESOURCE_EXHAUSTED"),
    FailedPrecondition: (412, "FAILED_PRECONDITION"),
    AlreadyExists: (409, "ALREADY_EXISTS"),
    Unauthenticated: (401, "UNAUTHENTICATED"),
    PermissionDenied: (403, "PERMISSION_DENIED"),
    Unsupported: (501, "UNIMPLEMENTED"),
    DeadlineExceeded: (504, "DEADLINE_EXCEEDED"),
    InternalError: (500, "INTERNAL"),
    ServerError: (500, "INTERNAL"),
}

HTTP_STATUS: dict[type[ServerError], int] = {k: v[0] for k, v in _TABLE.items()}
GRPC_STATUS: dict[type[ServerError], str] = {k: v[1] for k, v in _TABLE.items()}


def statuses(klass: type[ServerError]) -> tuple[int, str]:
    """(REST status, gRPC code name) of an error class: its own row, or its nearest base's."""
    for base in klass.__mro__:
        if base in _TABLE:
            return _TABLE[base]
    return _TABLE[ServerError]


def http_status(err: ServerError) -> int:
    return statuses(type(err))[0]


def grpc_status(err: ServerError) -> str:
    return statuses(type(err))[1]
