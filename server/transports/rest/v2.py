"""KServe V2 REST endpoints (health, metadata, infer, explain, repository and statistics extensions)."""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...dataplane import explainer_of, repository_of, statistics_of
from ...types import Duration, InferRequest, InferResponse, VersionStatistics
from .codec import HEADER, decode_headerless, decode_infer_request, encode_infer_response, parse_json
from .explain import explanation_response, v2_explanation
from .http import dataplane, json_response, read_body

#: The V2 protocol answers a health question (live, ready, model ready) with 200 for true and a
#: 4xx for false; Triton and OVMS answer 400, and so does ovserve (a Kubernetes probe fails on any
#: status from 400 on).
NOT_HEALTHY = 400


async def server_metadata(request: Request) -> Response:
    md = dataplane(request).server_metadata()
    return json_response({"name": md.name, "version": md.version, "extensions": list(md.extensions)})


async def live(request: Request) -> Response:
    ok = dataplane(request).server_live()
    return json_response({"live": ok}, 200 if ok else NOT_HEALTHY)


async def ready(request: Request) -> Response:
    ok = dataplane(request).server_ready()
    return json_response({"ready": ok}, 200 if ok else NOT_HEALTHY)


async def list_models(request: Request) -> Response:
    return json_response({"models": dataplane(request).model_names()})


def _name_version(request: Request) -> tuple[str, str]:
    p = request.path_params
    return p["model"], p.get("version", "")


async def model_metadata(request: Request) -> Response:
    name, version = _name_version(request)
    md = dataplane(request).model_metadata(name, version)
    doc: dict[str, Any] = {
        "name": md.name,
        "versions": md.versions,
        "platform": md.platform,
        "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in md.inputs],
        "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in md.outputs],
    }
    if md.parameters:  # an extension field: V2 clients read the fields above and ignore it
        doc["parameters"] = md.parameters
    return json_response(doc)


async def model_ready(request: Request) -> Response:
    name, version = _name_version(request)
    ok = dataplane(request).model_ready(name, version)
    return json_response({"name": name, "ready": ok}, 200 if ok else NOT_HEALTHY)


async def _decode(request: Request) -> InferRequest:
    name, version = _name_version(request)
    body = await read_body(request, request.app.state.max_request_bytes)
    header = request.headers.get(HEADER)
    if header is not None and header.strip() == "0":
        return decode_headerless(name, version, body, await dataplane(request).input_specs(name, version))
    return decode_infer_request(name, version, body, header)


def _encoded(response: InferResponse, request: InferRequest) -> Response:
    payload, header_len = encode_infer_response(response, request)
    if header_len is None:
        return Response(payload, media_type="application/json")
    return Response(payload, media_type="application/octet-stream", headers={HEADER: str(header_len)})


async def infer(request: Request) -> Response:
    req = await _decode(request)
    # the client's binary_data_output, whatever a transformer's handler does to the request
    asked = dict(req.parameters) if req.parameters else req.parameters
    resp = await dataplane(request).infer(req, request.headers)
    req.parameters = asked
    return _encoded(resp, req)


async def explain(request: Request) -> Response:
    req = await _decode(request)
    explainer = explainer_of(dataplane(request), req.model_name)
    e = await explainer.explain(req, dict(req.parameters), request.headers)
    return explanation_response(request, e) or _encoded(v2_explanation(e, req.id), req)


async def repository_index(request: Request) -> Response:
    body = await read_body(request, request.app.state.max_request_bytes)
    doc = parse_json(body) if body.strip() else {}
    ready_only = bool(doc.get("ready", False)) if isinstance(doc, dict) else False
    rows = repository_of(dataplane(request)).repository_index(ready_only)
    return json_response([{"name": r.name, "version": r.version, "state": r.state, "reason": r.reason} for r in rows])


async def repository_load(request: Request) -> Response:
    name = request.path_params["model"]
    await repository_of(dataplane(request), name).load_model(name)
    return json_response({})


async def repository_unload(request: Request) -> Response:
    name = request.path_params["model"]
    await repository_of(dataplane(request), name).unload_model(name)
    return json_response({})


def _duration(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def statistics_document(stats: list[VersionStatistics]) -> dict[str, Any]:
    """Triton's ``{"model_stats": [...]}``: cache_hit and cache_miss at zero (no response cache), and
    memory_usage and response_stats empty (not kept)."""
    return {"model_stats": [{
        "name": s.name,
        "version": s.version,
        "last_inference": s.last_inference,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": _duration(s.success), "fail": _duration(s.fail), "queue": _duration(s.queue),
            "compute_input": _duration(s.compute_input), "compute_infer": _duration(s.compute_infer),
            "compute_output": _duration(s.compute_output), "cache_hit": _duration(s.cache_hit),
            "cache_miss": _duration(s.cache_miss),
        },
        "response_stats": {},
        "batch_stats": [{
            "batch_size": b.batch_size, "compute_input": _duration(b.compute_input),
            "compute_infer": _duration(b.compute_infer), "compute_output": _duration(b.compute_output),
        } for b in s.batch_stats],
        "memory_usage": [],
    } for s in stats]}


async def model_statistics(request: Request) -> Response:
    p = request.path_params
    name = p.get("model", "")
    stats = statistics_of(dataplane(request), name).model_statistics(name, p.get("version", ""))
    return json_response(statistics_document(stats))


M, MV = "/v2/models/{model}", "/v2/models/{model}/versions/{version}"


def inference_routes() -> list[Route]:
    return [Route(M + "/infer", infer, methods=["POST"]), Route(MV + "/infer", infer, methods=["POST"])]


def routes() -> list[Route]:
    """Every route but :func:`inference_routes`."""
    m, mv = M, MV
    return [
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/v2/models", list_models, methods=["GET"]),
        # before the metadata route, which would take "stats" for a model's name (as Triton's paths do)
        Route("/v2/models/stats", model_statistics, methods=["GET"]),
        Route(m + "/stats", model_statistics, methods=["GET"]),
        Route(mv + "/stats", model_statistics, methods=["GET"]),
        Route(m, model_metadata, methods=["GET"]),
        Route(mv, model_metadata, methods=["GET"]),
        Route(m + "/ready", model_ready, methods=["GET"]),
        Route(mv + "/ready", model_ready, methods=["GET"]),
        Route(m + "/explain", explain, methods=["POST"]),
        Route("/v2/repository/index", repository_index, methods=["POST"]),
        Route("/v2/repository/models/{model}/load", repository_load, methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", repository_unload, methods=["POST"]),
    ]
