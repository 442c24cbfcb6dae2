"""The REST side of tracing (server/tracing.py): one server span per request, its parent the W3C
``traceparent``/``tracestate`` headers the client sent. An ASGI middleware installed only with tracing on
(the default app has none), outside the gate, so a refused request is traced too; the probes' paths
make no span."""
from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ... import tracing

#: paths a kubelet asks every few seconds: no span (they would drown the traces)
UNTRACED = frozenset({"/", "/v2/health/live", "/v2/health/ready", "/metrics"})
_CARRIED = (b"traceparent", b"tracestate")


class TraceMiddleware:
    def __init__(self, app: ASGIApp, listener: str) -> None:
        self.app = app
        self.listener = listener

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNTRACED:
            await self.app(scope, receive, send)
            return
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _CARRIED}
        method = scope["method"]
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        attributes = {"http.request.method": method, "url.path": scope["path"], "ovserve.listener": self.listener}
        with tracing.server_span(f"{method}", carrier, attributes) as span:
            try:
                await self.app(scope, receive, sending)
            finally:
                params: dict[str, Any] = scope.get("path_params") or {}  # set by the route that matched
                template = getattr(scope.get("route"), "path", None)  # the route that matched (Starlette)
                span.update_name(f"{method} {template if isinstance(template, str) else _route(scope['path'], params)}")
                tracing.set_attributes(span, {"http.response.status_code": status or 500,
                                              "ovserve.model.name": params.get("model"),
                                              "ovserve.model.version": params.get("version")})
                if (status or 500) >= 500:  # a server span's error (OpenTelemetry's HTTP conventions)
                    tracing.mark_error(span, f"HTTP {status or 500}")


def _route(path: str, params: dict[str, Any]) -> str:
    """Where Starlette names no route (none matched): the path with the route's parameters named, not
    valued (a span name of bounded cardinality): ``/v2/models/{model}/infer``."""
    for key in ("version", "model"):
        value = params.get(key)
        if isinstance(value, str) and value:
            path = path.replace(f"/{value}/", f"/{{{key}}}/", 1) if f"/{value}/" in path else path
            if path.endswith(f"/{value}"):
                path = path[: -len(value)] + f"{{{key}}}"
            elif f"/{value}:" in path:  # V1's /v1/models/m:predict
                path = path.replace(f"/{value}:", f"/{{{key}}}:", 1)
    return path
