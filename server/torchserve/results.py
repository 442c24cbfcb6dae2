"""What a handler's return value and its failures mean, wherever the handler runs.

Shared by the workers that run a handler in the server's process and the worker
processes: the batch's values (one per request, checked), a generator's messages,
TorchServe's encoding of a value (bytes as they are, text in UTF-8, anything else
as JSON), the status a handler set, and an exception as the data that crosses from
a worker process (:func:`failure_doc`) and the error the client gets (:func:`raise_failure`).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from ..errors import (
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
    Unavailable,
    Unsupported,
)


def encode(value: Any) -> bytes:
    """A handler's value as TorchServe sends it: bytes as they are, text in UTF-8, anything else as JSON."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    try:  # orjson writes what json.dumps(indent=2) does for the JSON types, in a tenth of the time
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # what orjson refuses (a subclass of int, an integer past 64 bits) as json.dumps writes it
        return json.dumps(value, indent=2).encode()


def status_error(status: int, phrase: str) -> ServerError:
    """What a handler's ``set_response_status`` of 400 or more answers, by its HTTP meaning."""
    message = phrase or f"the handler answered status {status}"
    if status == 404:
        return NotFound(message)
    if status in (503, 507):
        return Unavailable(message)
    if status in (408, 504):
        return DeadlineExceeded(message)
    if 400 <= status < 500:
        return InvalidInput(message)
    return InternalError(message)


def checked(result: Any, n: int, where: str) -> list[Any]:
    """A handler's return value as the batch's values: a list with one entry per request."""
    if not isinstance(result, (list, tuple)):
        raise InternalError(f"{where}: the handler returned {type(result).__name__}, not a list with one "
                            f"entry per request of the batch ({n})")
    if len(result) != n:
        raise InternalError(f"{where}: the handler returned {len(result)} results for a batch of {n}")
    return list(result)


def drain(gen: Iterator[Any], ids: Sequence[str], send: Callable[[str, Any], None], where: str) -> list[Any]:
    """Every yielded list (one value per request) goes out as an intermediate message; the last is the answer."""
    last: list[Any] | None = None
    for chunk in gen:
        if last is not None:
            for request_id, value in zip(ids, last, strict=True):
                send(request_id, value)
        last = checked(chunk, len(ids), where)
    if last is None:
        raise InternalError(f"{where}: the handler yielded nothing")
    return last


class HandlerFailed(Exception):
    """What a handler raised in a worker process, as the server knows it: the exception's type name, its
    message and TorchServe's ``error_code`` when it had one (a ``PredictionException``)."""

    def __init__(self, type_name: str, message: str, error_code: int | None = None) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.message = message
        self.error_code = error_code


def describe(exc: BaseException) -> tuple[str, str]:
    """An exception's type name and message, as a client is told them."""
    if isinstance(exc, HandlerFailed):
        return exc.type_name, exc.message
    return type(exc).__name__, str(exc)


#: the server's errors that cross from a worker process as themselves (a handler's own, or one the
#: server answered its ``context.model`` call with and the handler let through)
_CROSSING: dict[str, type[ServerError]] = {k.__name__: k for k in (
    InvalidInput, NotFound, Unavailable, PayloadTooLarge, FailedPrecondition, AlreadyExists, PermissionDenied,
    Unsupported, DeadlineExceeded, InternalError, Overloaded)}


def failure_doc(exc: BaseException) -> dict[str, Any]:
    """An exception as data, to cross to the server."""
    if isinstance(exc, ServerError) and type(exc).__name__ in _CROSSING:
        doc: dict[str, Any] = {"error": type(exc).__name__, "message": exc.message}
        if isinstance(exc, Overloaded):
            doc["retry_after_s"] = exc.retry_after_s
        return doc
    code = getattr(exc, "error_code", None)
    type_name, message = describe(exc)
    return {"raised": type_name[:200], "message": str(getattr(exc, "message", "") or message),
            "error_code": code if isinstance(code, int) and not isinstance(code, bool) else None}


def failure(doc: Any) -> Exception:
    """What :func:`failure_doc` wrote, as the exception to raise (anything unreadable: an InternalError)."""
    if not isinstance(doc, Mapping):
        return InternalError("the worker reported a failure it did not describe")
    message = str(doc.get("message", ""))
    klass = _CROSSING.get(str(doc.get("error")))
    if klass is Overloaded:
        retry = doc.get("retry_after_s")
        return Overloaded(message, float(retry) if isinstance(retry, (int, float)) else Overloaded.MIN_RETRY_AFTER_S)
    if klass is not None:
        return klass(message)
    code = doc.get("error_code")
    return HandlerFailed(str(doc.get("raised", "Exception")), message,
                         code if isinstance(code, int) and not isinstance(code, bool) else None)
