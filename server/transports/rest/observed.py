"""Metrics over REST: the routes' request-outcome hook and ``GET /metrics`` (imported only when metrics are on).

With metrics on, the routes OVMS counts (V2 infer, model metadata, model ready; V1 :predict and
model status) are wrapped once, when the app is made, by :func:`observed`, the REST side of the
one request-outcome hook (server/metrics): the model and version come from the path, success is
"answered without raising" (a model that is not ready answers, and counts as a success, as over
gRPC). With metrics off nothing is wrapped and nothing is served.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...metrics import calls
from ...metrics.calls import Call
from ...metrics.exposition import CONTENT_TYPE
from ...metrics.registry import Metrics
from . import v1, v2

Endpoint = Callable[[Request], Awaitable[Response]]

#: the routes counted, by endpoint
COUNTED: dict[Endpoint, Call] = {
    v2.infer: calls.REST_INFER,
    v2.model_metadata: calls.REST_METADATA,
    v2.model_ready: calls.REST_READY,
    v1.predict: calls.REST_PREDICT,
    v1.model_status: calls.REST_STATUS,
}


def observed(endpoint: Endpoint, call: Call, metrics: Metrics) -> Endpoint:
    """``endpoint``, counted and timed under ``call`` for the model its path names."""
    async def counted(request: Request) -> Response:
        started = time.perf_counter()
        ok = False
        try:
            response = await endpoint(request)
            ok = True
            return response
        finally:
            params = request.path_params
            metrics.done(call, params["model"], params.get("version", "") if call.versioned else "", ok, started)
    return counted


def counted_routes(routes: Sequence[BaseRoute], metrics: Metrics | None) -> list[BaseRoute]:
    """``routes`` with the counted ones wrapped, and the exposition at ``metrics.path`` unless it has a
    port of its own; ``routes`` as they are when metrics are off."""
    if metrics is None:
        return list(routes)
    out: list[BaseRoute] = []
    for route in routes:
        call = COUNTED.get(route.endpoint) if isinstance(route, Route) else None
        if call is not None and isinstance(route, Route):
            out.append(Route(route.path, observed(route.endpoint, call, metrics), methods=list(route.methods or ())))
        else:
            out.append(route)
    if metrics.port is None:
        out.append(exposition_route(metrics, metrics.path))
    return out


def exposition_route(metrics: Metrics, path: str) -> Route:
    async def exposition(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)
    return Route(path, exposition, methods=["GET"])
