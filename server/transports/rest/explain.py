"""Explanations on the wire: KServe V1 ``:explain`` JSON, a V2 response of tensors, or a PNG heatmap."""
from __future__ import annotations

import base64
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from ...errors import InvalidInput
from ...types import Explanation, InferResponse, Tensor


def v1_explanation(e: Explanation) -> dict[str, Any]:
    """``{"explanations": [one object per instance], ...summary}``: KServe V1 :explain."""
    items = []
    for i, target in enumerate(e.targets):
        item: dict[str, Any] = {"target": target, "score": e.scores[i], "attributions": e.attributions[i]}
        if e.heatmaps:
            item["heatmap_png"] = base64.b64encode(e.heatmaps[i]).decode("ascii")
        items.append(item)
    return {"model_name": e.model_name, "explanations": items, **e.summary()}


def v2_explanation(e: Explanation, request_id: str = "") -> InferResponse:
    """A V2 inference response: ``attributions``, ``target``, ``score`` (and ``heatmap_png``, base64) tensors;
    the summary (method, output, predictor_calls, perturbations) goes in the response ``parameters``."""
    n = len(e.targets)
    outputs = [
        Tensor("attributions", "FP32", tuple(e.attributions.shape), e.attributions),
        Tensor("target", "INT64", (n,), np.asarray(e.targets, dtype=np.int64)),
        Tensor("score", "FP32", (n,), np.asarray(e.scores, dtype=np.float32)),
    ]
    if e.heatmaps:
        data = np.array([base64.b64encode(p) for p in e.heatmaps], dtype=object)
        outputs.append(Tensor("heatmap_png", "BYTES", (n,), data))
    summary = {k: v for k, v in e.summary().items() if k != "parameters"}
    if e.heatmaps:
        summary["heatmap_png"] = "base64"  # each element: a base64 PNG (JSON strings cannot carry raw bytes)
    return InferResponse(model_name=e.model_name, model_version="", outputs=outputs, id=request_id,
                         parameters=summary)


def _wants_png(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return any(part.split(";")[0].strip().lower() == "image/png" for part in accept.split(","))


def explanation_response(request: Request, e: Explanation) -> Response | None:
    """The heatmap itself when the client asked ``Accept: image/png`` (one image); None otherwise."""
    if not _wants_png(request):
        return None
    if e.kind != "image":
        raise InvalidInput(f"Accept: image/png is for image inputs; model {e.model_name!r} takes tabular [N, F] input")
    if not e.heatmaps and len(e.targets) == 1:
        raise InvalidInput("Accept: image/png needs the heatmap; the request set parameter 'heatmap' to false")
    if len(e.heatmaps) != 1:
        raise InvalidInput(f"Accept: image/png answers one image; the request has {len(e.targets)} instances "
                           f"(send one, or ask for JSON)")
    return Response(e.heatmaps[0], media_type="image/png",
                    headers={"Explain-Target": str(e.targets[0]), "Explain-Score": repr(e.scores[0])})
