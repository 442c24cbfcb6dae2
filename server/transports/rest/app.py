"""The REST application: V2 and V1 routes on one Starlette app.

Errors are mapped here, once: a :class:`ServerError` becomes its HTTP status
with ``{"error": message}`` (an Overloaded with its ``Retry-After``); anything unexpected becomes a 500 with no
traceback (the traceback goes to the log, once). A client that goes away
before its request is read is no error of the server's: one INFO line.
"""
from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ... import tracing
from ...dataplane import DataPlane
from ...errors import RETRY_AFTER_HEADER, Overloaded, ServerError, http_status
from ...gate import OPEN_GATE, Gate
from . import v1, v2
from .gate import GateMiddleware
from .http import error_response

log = logging.getLogger(__name__)


async def _on_server_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServerError)
    status = http_status(exc)
    if status >= 500 and status != 503 and not exc.logged:
        log.error("%s %s: %s", request.method, request.url.path, exc.message)
    if isinstance(exc, Overloaded):  # a refusal under load says when to come back (RFC 9110 Retry-After)
        return error_response(status, exc.message, {RETRY_AFTER_HEADER: exc.retry_after_header()})
    return error_response(status, exc.message)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(404, f"no route for {request.method} {request.url.path}")
    if exc.status_code == 405:
        return error_response(405, f"method {request.method} is not allowed on {request.url.path}")
    return error_response(exc.status_code, str(exc.detail))


async def _on_disconnect(request: Request, exc: Exception) -> Response:
    # Starlette raises ClientDisconnect from the body stream when the client hung
    # up mid-upload. The answer goes nowhere (uvicorn drops what is sent to a
    # closed connection); 499 is what nginx logs for it.
    log.info("client went away during %s %s", request.method, request.url.path)
    return error_response(499, "client closed the connection")


class LastResort:
    """Anything the handlers did not map: logged once with its traceback, answered 500 without it.

    Starlette's own last resort (``ServerErrorMiddleware``, given an ``Exception``
    handler) answers and then re-raises, so uvicorn logged every unexpected error
    a second time; this sits inside it and does not re-raise.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if not started:  # else the client gets a cut-short answer, as from any failed stream
                await error_response(500, f"internal error: {type(exc).__name__}")(scope, receive, send)


def _routes(dataplane: DataPlane) -> list[BaseRoute]:
    """V2 and V1; with metrics on (server/metrics), the counted ones wrapped and the exposition added."""
    # Starlette tries the routes in order, a regular expression each (~4 us): inference first. No other
    # route takes their paths (a model's name holds no "/"; GET /v1/models/m:predict still finds the status).
    routes: list[BaseRoute] = [*v2.inference_routes(), *v1.inference_routes(), *v2.routes(), *v1.routes()]
    if dataplane.metrics is None:
        return routes
    from .observed import counted_routes  # imported only when metrics are on

    return counted_routes(routes, dataplane.metrics)


def create_app(dataplane: DataPlane, max_request_bytes: int, gate: Gate = OPEN_GATE,
               listener: str = "rest") -> Starlette:
    """The app; ``gate``'s tokens and access log (server/gate) in front of everything, installed only when
    it has something to do."""
    gated = [] if gate.idle else [Middleware(GateMiddleware, gate=gate, listener=listener)]
    if tracing.enabled:  # the request's span, outside the gate (server/tracing.py); no middleware when off
        from .traced import TraceMiddleware

        gated.insert(0, Middleware(TraceMiddleware, listener=listener))
    app = Starlette(
        routes=_routes(dataplane),
        middleware=[*gated, Middleware(LastResort)],
        exception_handlers={
            ServerError: _on_server_error,
            HTTPException: _on_http_error,
            ClientDisconnect: _on_disconnect,
        },
    )
    app.state.dataplane = dataplane
    app.state.max_request_bytes = max_request_bytes
    return app
