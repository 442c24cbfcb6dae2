"""The errors of the public client API, under the names KServe's users know.

KServe's client raises its own ``InvalidInput`` (a ValueError) for a malformed
request, ``InferenceError`` when a numpy array does not fit its tensor,
``UnsupportedProtocol`` for a protocol a call does not speak, and httpx's
``HTTPStatusError``, ``ConnectError`` and ``TimeoutException`` on REST. ovserve's
REST client speaks aiohttp, not httpx, so those three are classes of this module
with httpx's names and the attributes code reads from them (``response``,
``request``). gRPC errors are grpc's own ``RpcError``, re-raised as KServe does.

:class:`InvalidInput` is also the one hierarchy's
:class:`ovserve.common.errors.InvalidInput`, so code that catches either catches
it. This module imports nothing beyond the standard library and
:mod:`ovserve.common.errors`: the REST transport and the types both raise from it.
"""
from __future__ import annotations

from typing import Any

from ovserve.common import errors as common


class InvalidInput(common.InvalidInput, ValueError):
    """A malformed request or response (KServe's ``kserve.errors.InvalidInput``); ``reason`` is the message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)

    @property
    def reason(self) -> str:
        return self.message


class InferenceError(RuntimeError):
    """A tensor's data does not fit it, or a stream answered an error (KServe's ``InferenceError``).

    ``str()`` is ``[status] reason`` when a status is known, as KServe prints it.
    """

    def __init__(self, reason: str, status: str | None = None, debug_details: Any = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.debug_details = debug_details

    def __str__(self) -> str:
        return self.reason if self.status is None else f"[{self.status}] {self.reason}"


class UnsupportedProtocol(Exception):
    """The REST client's protocol does not have the call (``explain`` on v2, ``is_server_ready`` on v1)."""

    def __init__(self, protocol_version: Any = None) -> None:
        self.reason = f"Unsupported protocol {protocol_version}."
        super().__init__(self.reason)

    def __str__(self) -> str:
        return self.reason


class Request:
    """What an HTTP error was an answer to: ``method`` and ``url`` (httpx's ``Request``, the parts code reads)."""

    __slots__ = ("method", "url")

    def __init__(self, method: str, url: str) -> None:
        self.method, self.url = method, url

    def __repr__(self) -> str:
        return f"<Request({self.method!r}, {self.url!r})>"


class HTTPStatusError(Exception):
    """A REST reply with a status other than 2xx (httpx's ``HTTPStatusError``, which KServe's client raises).

    ``response`` has ``status_code``, ``reason_phrase``, ``headers``, ``content``, ``text`` and
    ``json()``; ``request`` has ``method`` and ``url``. The message is KServe's:
    ``"<server's error>, '<status> <reason>' for url '<url>'"``.
    """

    def __init__(self, message: str, *, request: Request, response: Any) -> None:
        super().__init__(message)
        self.request = request
        self.response = response


class InvalidURL(ValueError):
    """A ``base_url`` that is not an absolute http:// or https:// URL (httpx's ``InvalidURL``)."""


class ConnectError(ConnectionError):
    """The server could not be reached, after the configured retries (httpx's ``ConnectError``)."""


class TimeoutException(TimeoutError):
    """No complete answer within the timeout (httpx's ``TimeoutException``)."""


__all__ = ["InvalidInput", "InferenceError", "UnsupportedProtocol", "HTTPStatusError", "Request", "InvalidURL",
           "ConnectError", "TimeoutException"]
