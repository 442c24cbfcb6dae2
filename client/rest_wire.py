"""KServe V1 and V2 REST wire formats, client side: neutral types <-> predictor bodies.

V2 requests send every tensor with the binary tensor extension and ask every
output back binary; V1 uses ``instances`` for one input and columnar ``inputs``
for several, and names and types the ``predictions`` from the model's metadata.
"""
from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import orjson

from ovserve.common.codecs.datatypes import V2_TO_NUMPY
from ovserve.common.codecs.tensors import (
    MAX_DIMS,
    MAX_ELEMENTS,
    check_shape,
    from_raw,
    from_values,
    reply_parameters,
    to_raw,
)
from ovserve.common.types import InferRequest, InferResponse, ModelMetadata, Tensor, TensorSpec

from .errors import PredictorInternal

HEADER = "Inference-Header-Content-Length"


# -- V2 REST wire (client side) ----------------------------------------------
def v2_body(doc: dict[str, Any], chunks: list[bytes]) -> tuple[bytes, int | None]:
    """A V2 body: the JSON ``doc``, then the binary ``chunks`` in order; and the JSON's length
    (``Inference-Header-Content-Length``), ``None`` when there is no binary part."""
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def encode_v2_request(request: InferRequest) -> tuple[bytes, int]:
    """Body and JSON header length: every input as binary, every output asked as binary."""
    chunks: list[bytes] = []
    inputs = []
    for t in request.inputs:
        raw = to_raw(np.asarray(t.data), t.datatype)
        chunks.append(raw)
        params = {**reply_parameters(t.parameters), "binary_data_size": len(raw)}
        inputs.append({"name": t.name, "datatype": t.datatype, "shape": list(np.shape(t.data)), "parameters": params})
    doc: dict[str, Any] = {"inputs": inputs,
                           "parameters": {**request.parameters, "binary_data_output": True}}
    if request.id:
        doc["id"] = request.id
    if request.outputs:
        doc["outputs"] = [{"name": o.name, "parameters": {**o.parameters, "binary_data": True}}
                          for o in request.outputs]
    body, header_length = v2_body(doc, chunks)
    return body, len(body) if header_length is None else header_length


def decode_v2_response(body: bytes, header_length: str | None, what: str = "predictor output") -> InferResponse:
    """A V2 reply's body (JSON, then the binary outputs when ``header_length`` is given) as neutral types."""
    view = memoryview(body)
    try:
        if header_length is not None:
            n = int(header_length)
            if not 0 <= n <= len(view):
                raise ValueError(f"Inference-Header-Content-Length {n} is outside the body's {len(view)} bytes")
            doc, binary = orjson.loads(view[:n]), view[n:]
        else:
            doc, binary = orjson.loads(view), view[:0]
    except (ValueError, orjson.JSONDecodeError) as exc:
        raise PredictorInternal(f"unreadable V2 response: {exc}") from None
    return response_from_doc(doc, binary, what)


def response_from_doc(doc: Any, binary: bytes | memoryview = b"", what: str = "predictor output") -> InferResponse:
    """A V2 reply's JSON (and the binary part that follows it) as neutral types; ``what`` names an output
    in error messages."""
    if not isinstance(doc, dict) or not isinstance(doc.get("outputs", []), list):
        raise PredictorInternal("V2 response is not an object with a list of 'outputs'")
    outputs = []
    offset = 0
    for item in doc.get("outputs") or []:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) \
                or not isinstance(item.get("datatype"), str):
            raise PredictorInternal(f"V2 response: an output is not an object with a name and a datatype: "
                                    f"{item!r:.200}")
        name, datatype = item["name"], item["datatype"]
        params = item.get("parameters") or {}
        size = params.get("binary_data_size")
        raw_shape = item.get("shape", [])
        dtype = V2_TO_NUMPY.get(datatype)
        # A binary output of a fixed-size datatype whose shape (JSON integers) and size fit is decoded
        # inline; anything else, and every error, goes through the codecs' checks and messages. One reply
        # per call is decoded, and the client's CPU per call is measured (bench/client_cost.py).
        if type(size) is int and dtype is not None and dtype.kind != "O" and type(raw_shape) is list \
                and len(raw_shape) <= MAX_DIMS and all(type(d) is int and d >= 0 for d in raw_shape) \
                and math.prod(raw_shape) <= MAX_ELEMENTS and size == math.prod(raw_shape) * dtype.itemsize \
                and offset + size <= len(binary):
            shape = tuple(raw_shape)
            data = np.frombuffer(binary[offset:offset + size], dtype).reshape(shape)
            offset += size
            outputs.append(Tensor(name, datatype, shape, data,
                                  reply_parameters(params) if len(params) > 1 else {}))
            continue
        where = f"{what} {name!r}"
        shape = check_shape(raw_shape, where)
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise PredictorInternal(f"V2 response: {where} has binary_data_size {size!r}")
            data = from_raw(where, datatype, shape, binary[offset : offset + size])
            offset += size
        else:
            data = from_values(where, datatype, shape, item.get("data", []), reply=True)
        outputs.append(Tensor(name, datatype, shape, data, reply_parameters(params)))
    return InferResponse(
        model_name=doc.get("model_name", ""),
        model_version=str(doc.get("model_version", "") or ""),
        outputs=outputs,
        id=doc.get("id", "") or "",
        parameters=dict(doc.get("parameters") or {}),
    )


def metadata_from_json(doc: dict[str, Any]) -> ModelMetadata:
    def specs(items: list[dict[str, Any]] | None) -> list[TensorSpec]:
        return [TensorSpec(i["name"], i["datatype"], tuple(int(d) for d in i.get("shape", []))) for i in items or []]

    return ModelMetadata(name=doc.get("name", ""), versions=[str(v) for v in doc.get("versions") or []],
                         platform=doc.get("platform", ""), inputs=specs(doc.get("inputs")),
                         outputs=specs(doc.get("outputs")), parameters=dict(doc.get("parameters") or {}))


# -- V1 REST wire -------------------------------------------------------------
def _v1_values(t: Tensor) -> Any:
    arr = np.asarray(t.data)
    if t.datatype == "BYTES":
        flat = [v if isinstance(v, str) else _b64_or_text(v) for v in arr.reshape(-1)]
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(arr.shape).tolist()
    if t.datatype == "FP16":
        arr = arr.astype(np.float32)
    return arr.tolist()


def _b64_or_text(value: Any) -> Any:
    raw = bytes(value)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(raw).decode("ascii")}


def encode_v1_request(request: InferRequest) -> dict[str, Any]:
    """One input: ``instances``; several: columnar ``inputs`` keyed by name (both KServe V1)."""
    if len(request.inputs) == 1:
        return {"instances": _v1_values(request.inputs[0])}
    return {"inputs": {t.name: _v1_values(t) for t in request.inputs}}


def decode_v1_predictions(doc: Any, model: str, md: ModelMetadata) -> InferResponse:
    if not isinstance(doc, dict) or "predictions" not in doc:
        raise PredictorInternal("V1 response has no 'predictions'")
    preds = doc["predictions"]
    types = {s.name: s.datatype for s in md.outputs}
    if preds and all(isinstance(p, dict) for p in preds):
        columns = {k: [p.get(k) for p in preds] for k in preds[0]}
    else:
        columns = {md.outputs[0].name if md.outputs else "predictions": preds}
    outputs = []
    for name, values in columns.items():
        arr = np.asarray(values, dtype=object)
        datatype = types.get(name)
        if datatype is None:
            datatype = "BYTES" if arr.size and isinstance(arr.flat[0], str) else "FP32"
        shape = tuple(arr.shape)
        outputs.append(Tensor(name, datatype, shape,
                              from_values(f"predictor output {name!r}", datatype, shape, values, reply=True)))
    return InferResponse(model_name=model, model_version="", outputs=outputs)
