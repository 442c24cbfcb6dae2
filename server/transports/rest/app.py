"""The REST application: V2 and V1 routes on one Starlette app.

Errors are mapped here, once: a :class:`ServerError` becomes its HTTP status
with ``{"error": message}``; anything unexpected becomes a 500 with no
traceback (the traceback goes to the log).
"""
from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ...dataplane import DataPlane
from ...errors import ServerError, http_status
from . import v1, v2
from .http import error_response

log = logging.getLogger(__name__)


async def _on_server_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServerError)
    status = http_status(exc)
    if status >= 500 and status != 503:
        log.error("%s %s: %s", request.method, request.url.path, exc.message)
    return error_response(status, exc.message)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(404, f"no route for {request.method} {request.url.path}")
    if exc.status_code == 405:
        return error_response(405, f"method {request.method} is not allowed on {request.url.path}")
    return error_response(exc.status_code, str(exc.detail))


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(500, f"internal error: {type(exc).__name__}")


def create_app(dataplane: DataPlane, max_request_bytes: int) -> Starlette:
    app = Starlette(
        routes=v2.routes() + v1.routes(),
        exception_handlers={
            ServerError: _on_server_error,
            HTTPException: _on_http_error,
            Exception: _on_unexpected,
        },
    )
    app.state.dataplane = dataplane
    app.state.max_request_bytes = max_request_bytes
    return app
