"""The REST side of the gate (server/gate): bearer tokens checked and the access log written, per request.

An ASGI middleware rather than a check in each route, so that every path is
covered, an unknown one included (it answers 401 before 404, naming no
route to a client without a token). Which token a request needs is read from
the same decoded path Starlette routes on (:func:`access_of`). Installed
only when the gate has something to do: the default costs nothing.
"""
from __future__ import annotations

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ovserve.common import requestids

from ...errors import Unauthenticated
from ...gate import INFERENCE, MANAGEMENT, OPEN, Access, Gate
from ...gate.accesslog import HEADER, Clock, now_iso, request_id
from .http import error_response

#: Paths a kubelet probe asks without a token.
OPEN_PATHS = frozenset({"/", "/v2/health/live", "/v2/health/ready"})
#: Prefix of the model repository API (management tokens).
MANAGEMENT_PREFIX = "/v2/repository/"
_HEADER = HEADER.encode("ascii")


def access_of(method: str, path: str) -> Access:
    """The kind of token a request needs (server/gate/auth.py)."""
    if method in ("GET", "HEAD") and path in OPEN_PATHS:
        return OPEN
    if path.startswith(MANAGEMENT_PREFIX):
        return MANAGEMENT
    return INFERENCE


class GateMiddleware:
    """Tokens (a 401 with ``WWW-Authenticate: Bearer`` when refused) and, with ``--access-log``, one line
    per request and its ``x-request-id`` header."""

    def __init__(self, app: ASGIApp, gate: Gate, listener: str) -> None:
        self.app = app
        self.gate = gate
        self.listener = listener

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        authorization = given_id = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value.decode("latin-1")
            elif key == _HEADER:
                given_id = value.decode("latin-1")
        logging = self.gate.access_log is not None
        if not logging:
            try:
                self.gate.authorize(access_of(scope["method"], scope["path"]), authorization)
            except Unauthenticated as exc:
                await _refused(exc)(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        clock = Clock()
        rid = request_id(given_id)
        if rid != given_id:  # the data plane (a transformer's handler) sees the id too
            scope["headers"] = [*((k, v) for k, v in scope["headers"] if k != _HEADER), (_HEADER, rid.encode())]
        status = 0
        sizes = [0, 0]  # bytes in, bytes out

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                sizes[0] += len(message.get("body", b""))
            return message

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (_HEADER, rid.encode())]
            elif message["type"] == "http.response.body":
                sizes[1] += len(message.get("body", b""))
            await send(message)

        forwarded = requestids.current.set(rid)  # for the calls the request makes on (a component's predictor)
        try:
            try:
                self.gate.authorize(access_of(scope["method"], scope["path"]), authorization)
            except Unauthenticated as exc:
                await _refused(exc)(scope, receive, sending)
            else:
                await self.app(scope, receiving, sending)
        finally:
            requestids.current.reset(forwarded)
            params = scope.get("path_params") or {}  # set by the route that matched
            client = scope.get("client")
            self.gate.log({
                "time": now_iso(clock.wall), "listener": self.listener, "method": scope["method"],
                "path": scope["path"], "model": params.get("model", ""), "version": params.get("version", ""),
                # nothing sent: the app raised past every handler, or the client left first
                "status": status or 500, "latency_ms": clock.latency_ms(), "bytes_in": sizes[0],
                "bytes_out": sizes[1], "client": f"{client[0]}:{client[1]}" if client else "", "request_id": rid,
            })


def _refused(exc: Unauthenticated) -> Response:
    response = error_response(401, exc.message)
    response.headers["www-authenticate"] = 'Bearer realm="ovserve"'  # RFC 6750: the scheme a client must use
    return response
