"""KServe V1 REST endpoints: liveness, list, model status, :predict and :explain."""
from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...errors import Unsupported
from .http import dataplane, error_response, json_response, read_body
from .codec import parse_json, v1_instances_to_request, v1_predictions


async def live(request: Request) -> Response:
    """KServe's V1 liveness at the root; the kserve SDK's V1 client reads ``status``."""
    if not dataplane(request).server_live():
        return error_response(503, "server is not live")
    return json_response({"status": "alive"})


async def list_models(request: Request) -> Response:
    return json_response({"models": dataplane(request).model_names()})


async def model_status(request: Request) -> Response:
    dp = dataplane(request)
    name = request.path_params["model"]
    if name.endswith((":predict", ":explain")):  # the {model} pattern also matches "m:predict"
        raise HTTPException(405)
    versions = dp.model_status(name)
    ready = dp.model_ready(name)
    # KServe answers 503 for a model that is not ready; the body still says why.
    return json_response({"name": name, "ready": ready, "versions": versions}, 200 if ready else 503)


async def predict(request: Request) -> Response:
    dp = dataplane(request)
    name = request.path_params["model"]
    body = await read_body(request, request.app.state.max_request_bytes)
    doc = parse_json(body)
    req = v1_instances_to_request(name, doc, dp.input_specs(name))
    resp = await dp.infer(req)
    return json_response(v1_predictions(resp))


async def explain(request: Request) -> Response:
    name = request.path_params["model"]
    dataplane(request).manager.served(name)  # 404 for an unknown model first
    raise Unsupported(f"model {name!r} has no explainer configured; run an explainer component for :explain")


def routes() -> list[Route]:
    return [
        Route("/", live, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model}", model_status, methods=["GET"]),
        Route("/v1/models/{model}:predict", predict, methods=["POST"]),
        Route("/v1/models/{model}:explain", explain, methods=["POST"]),
    ]
