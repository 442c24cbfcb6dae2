"""KServe V1 REST endpoints: liveness, list, model status, :predict and :explain."""
from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...codecs import v1
from ...dataplane import explainer_of
from ...errors import InvalidInput, Unavailable
from ...types import TensorSpec
from .codec import parse_json
from .explain import explanation_response, v1_explanation
from .http import dataplane, error_response, json_response, read_body


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
    versions = [{"version": v.version, "state": v.state,
                 "status": {"error_code": v.error_code, "error_message": v.error_message}}
                for v in dp.model_status(name)]
    ready = dp.model_ready(name)
    # KServe answers 503 for a model that is not ready; the body still says why.
    return json_response({"name": name, "ready": ready, "versions": versions}, 200 if ready else 503)


async def _specs(request: Request, name: str) -> list[TensorSpec]:
    """The inputs V1 instances are decoded against: the model's, or a component's hints (may be none yet)."""
    dp = dataplane(request)
    try:
        return [p.spec for p in await dp.input_specs(name)]
    except Unavailable:
        if dp.exact_inputs:
            raise
        return []


async def _v1_request(request: Request) -> tuple[str, dict[str, Any]]:
    name = request.path_params["model"]
    doc = parse_json(await read_body(request, request.app.state.max_request_bytes))
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object")
    return name, doc


async def predict(request: Request) -> Response:
    dp = dataplane(request)
    name, doc = await _v1_request(request)
    req = v1.decode_request(name, doc, await _specs(request, name), dp.exact_inputs)
    resp = await dp.infer(req, request.headers)
    return json_response(v1.encode_predictions(resp))


async def explain(request: Request) -> Response:
    dp = dataplane(request)
    name, doc = await _v1_request(request)
    dp.model_ready(name)  # 404 for an unknown model before the body is looked at
    req = v1.decode_request(name, doc, await _specs(request, name), dp.exact_inputs)
    e = await explainer_of(dp, name).explain(req, doc.get("parameters") or {}, request.headers)
    return explanation_response(request, e) or json_response(v1_explanation(e))


def inference_routes() -> list[Route]:
    return [Route("/v1/models/{model}:predict", predict, methods=["POST"])]


def routes() -> list[Route]:
    """Every route but :func:`inference_routes`."""
    return [
        Route("/", live, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model}", model_status, methods=["GET"]),
        Route("/v1/models/{model}:explain", explain, methods=["POST"]),
    ]
