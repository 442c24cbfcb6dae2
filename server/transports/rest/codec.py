"""V2 REST wire format <-> neutral types: JSON tensors and the binary tensor extension.

Binary extension: the body is a JSON header of ``Inference-Header-Content-Length``
bytes followed by the tensors' bytes in input order; an input with
``parameters.binary_data_size`` takes its bytes from there instead of ``data``.
"""
from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import orjson
import simdjson

from ovserve.common.codecs.datatypes import V2_TO_NUMPY, numpy_dtype
from ovserve.common.codecs.tensors import check_shape, from_numbers, from_raw, from_values, reply_parameters, to_raw

from ...errors import InvalidInput
from ...types import InferRequest, InferResponse, PortInfo, RequestedOutput, Tensor

HEADER = "inference-header-content-length"


def _int_param(params: dict[str, Any], key: str, where: str) -> int | None:
    if key not in params:
        return None
    value = params[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput(f"{where}: parameter {key} must be a non-negative integer, got {value!r}")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} must be a JSON object")
    return value


def parse_json(body: bytes | bytearray | memoryview, where: str = "request body") -> Any:
    if not len(body):
        raise InvalidInput(f"{where} is empty; expected a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{where} is not valid JSON: {exc}") from None


#: Request bodies from this size on are parsed with simdjson, which puts a flat
#: array of numbers straight into a numpy buffer instead of making a Python
#: object per element (docs/performance.md "Large JSON bodies through simdjson"). Smaller ones
#: go through orjson, which is quicker to start.
LARGE_JSON = 64 * 1024
#: simdjson's buffer type for each datatype family (d: float64, i: int64, u: uint64).
_BUFFER_TYPE: dict[str, Literal["d", "i", "u"]] = {
    "FP16": "d", "FP32": "d", "FP64": "d", "INT8": "i", "INT16": "i", "INT32": "i",
    "INT64": "i", "UINT8": "u", "UINT16": "u", "UINT32": "u", "UINT64": "u"}
_BUFFER_DTYPE = {"d": np.float64, "i": np.int64, "u": np.uint64}


def _plain(value: Any) -> Any:
    """A simdjson proxy as plain Python objects."""
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _numbers(data: simdjson.Array, datatype: Any) -> Any:
    """A flat JSON array of numbers as a numpy array, or the plain list when it is not one."""
    kind = _BUFFER_TYPE.get(datatype) if isinstance(datatype, str) else None
    if kind is not None:
        try:
            arr = np.frombuffer(data.as_buffer(of_type=kind), dtype=_BUFFER_DTYPE[kind])
        except (TypeError, ValueError):  # not all numbers of that kind: the exact path decides
            arr = None
        if arr is not None and arr.size == len(data):  # flat (a nested array would flatten)
            return arr
    return data.as_list()


def parse_request_json(body: memoryview, where: str = "request body") -> Any:
    """An inference request's JSON; inputs' ``data`` may come back as numpy arrays (large bodies)."""
    if len(body) < LARGE_JSON:
        return parse_json(body, where)
    try:
        doc = simdjson.Parser().parse(body)
    except (ValueError, RuntimeError):
        # simdjson refuses some valid JSON, integers past 64 bits (NUMBER_ERROR, or
        # BIGINT_ERROR as a RuntimeError): orjson, the small bodies' parser, decides,
        # so that both paths read (or refuse) the same documents.
        return parse_json(body, where)
    if not isinstance(doc, simdjson.Object):
        return _plain(doc)
    try:
        return _convert(doc)
    except KeyError:
        # simdjson looks a key up as a C string: one holding a NUL ("\u0000") is not found again.
        # orjson, the small bodies' parser, reads the document as it is.
        return parse_json(body, where)


def _convert(doc: Any) -> dict[str, Any]:
    """A large request's document as Python, each input's ``data`` as a numpy array where it can be."""
    out = {}
    for key in doc:
        value = doc[key]
        if key == "inputs" and isinstance(value, simdjson.Array):
            items: list[Any] = []
            for item in value:
                if not isinstance(item, simdjson.Object):
                    items.append(_plain(item))
                    continue
                fields = {k: _plain(item[k]) for k in item if k != "data"}
                if "data" in item:
                    data = item["data"]
                    if isinstance(data, simdjson.Array):
                        fields["data"] = _numbers(data, fields.get("datatype"))
                    else:
                        fields["data"] = data
                items.append(fields)
            out[key] = items
        else:
            out[key] = _plain(value)
    return out


def decode_infer_request(model_name: str, version: str, body: bytes | bytearray,
                         header_length: str | None) -> InferRequest:
    view = memoryview(body)
    if header_length is not None:
        try:
            json_len = int(header_length)
            if json_len < 0:
                raise ValueError
        except ValueError:
            raise InvalidInput("Inference-Header-Content-Length must be a non-negative integer, "
                               f"got {header_length!r}") from None
        if json_len > len(view):
            raise InvalidInput(
                f"Inference-Header-Content-Length {json_len} is larger than the body ({len(view)} bytes)"
            )
        if json_len == 0:
            raise InvalidInput("Inference-Header-Content-Length 0 needs the model's input spec; use decode_headerless")
        doc = parse_request_json(view[:json_len], "inference header")
        binary = view[json_len:]
    else:
        doc, binary = parse_request_json(view), view[:0]
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("request must have a non-empty 'inputs' list")
    inputs: list[Tensor] = []
    offset = 0
    for i, item in enumerate(raw_inputs):
        if not isinstance(item, dict):
            raise InvalidInput(f"inputs[{i}] must be an object")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"inputs[{i}] needs a 'name'")
        where = f"input {name!r}"
        datatype = item.get("datatype")
        if not isinstance(datatype, str):
            raise InvalidInput(f"{where} needs a 'datatype'")
        numpy_dtype(datatype, where)
        if "shape" not in item or not isinstance(item["shape"], list):
            raise InvalidInput(f"{where} needs a 'shape' list")
        shape = check_shape(item["shape"], where)
        params = _object(item.get("parameters"), f"{where} parameters")
        size = _int_param(params, "binary_data_size", where)
        has_data = "data" in item
        if size is not None and has_data:
            raise InvalidInput(f"{where} has both 'data' and binary_data_size")
        if size is None and not has_data:
            if len(raw_inputs) == 1 and len(binary):
                size = len(binary)  # a single binary input may omit its size
            else:
                raise InvalidInput(f"{where} has neither 'data' nor binary_data_size")
        if size is not None:
            if offset + size > len(binary):
                raise InvalidInput(
                    f"{where}: binary_data_size {size} runs past the end of the body "
                    f"({len(binary) - offset} bytes left)"
                )
            array = from_raw(where, datatype, shape, binary[offset : offset + size])
            offset += size
        elif isinstance(item["data"], np.ndarray):
            array = from_numbers(where, datatype, shape, item["data"])
        else:
            array = from_values(where, datatype, shape, item["data"])
        inputs.append(Tensor(name, datatype, shape, array, reply_parameters(params)))
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    outputs = []
    raw_outputs = doc.get("outputs") or []
    if not isinstance(raw_outputs, list):
        raise InvalidInput("'outputs' must be a list")
    for i, item in enumerate(raw_outputs):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInput(f"outputs[{i}] must be an object with a 'name'")
        outputs.append(RequestedOutput(item["name"], _object(item.get("parameters"), f"outputs[{i}] parameters")))
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    return InferRequest(
        model_name=model_name,
        model_version=version,
        id=request_id,
        parameters=_object(doc.get("parameters"), "request parameters"),
        inputs=inputs,
        outputs=outputs,
    )


def decode_headerless(model_name: str, version: str, body: bytes | bytearray,
                      specs: list[PortInfo]) -> InferRequest:
    """Inference-Header-Content-Length 0: the whole body is the model's only input.

    A BYTES input, or a 4-D input whose batch-1 raw size the body does not
    match, takes the body as one element (one encoded image); otherwise the
    body is the raw tensor of batch 1. All outputs come back binary.
    """
    if len(specs) != 1:
        raise InvalidInput(
            f"Inference-Header-Content-Length 0 sends the body as the only input, but model {model_name!r} "
            f"has {len(specs)} inputs"
        )
    port = specs[0]
    where = f"input {port.name!r}"
    raw_shape = [1 if i == 0 and not d.static else d.lo for i, d in enumerate(port.dims)]
    static = all(d.static or i == 0 for i, d in enumerate(port.dims))
    raw_size = math.prod(raw_shape) * V2_TO_NUMPY[port.datatype].itemsize if port.datatype != "BYTES" else -1
    if port.datatype != "BYTES" and static and len(body) == raw_size:
        shape = tuple(raw_shape)
        array = from_raw(where, port.datatype, shape, memoryview(body))
        tensor = Tensor(port.name, port.datatype, shape, array)
    elif port.datatype == "BYTES" or len(port.dims) == 4:
        tensor = Tensor(port.name, "BYTES", (1,), from_values(where, "BYTES", (1,), [bytes(body)]))
    else:
        raise InvalidInput(
            f"{where}: a body of {len(body)} bytes does not match the model's input of batch 1 "
            f"({raw_size} bytes of {port.datatype})"
        )
    return InferRequest(model_name=model_name, model_version=version, inputs=[tensor],
                        parameters={"binary_data_output": True})


def _json_data(tensor: Tensor) -> Any:
    arr = tensor.data.reshape(-1)
    if tensor.datatype == "BYTES":
        return [x.decode("utf-8", "replace") if isinstance(x, (bytes, bytearray)) else str(x) for x in arr]
    if tensor.datatype == "FP16":
        return arr.astype(np.float32)
    return arr


def encode_infer_response(response: InferResponse, request: InferRequest) -> tuple[bytes, int | None]:
    """The response body, and the JSON header length when binary outputs follow it."""
    all_binary = bool(request.parameters.get("binary_data_output", False))
    chunks: list[bytes] = []
    outputs = []
    for tensor in response.outputs:
        binary = tensor.parameters.get("binary_data", all_binary)
        out: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        params = reply_parameters(tensor.parameters)
        if binary:
            raw = to_raw(tensor.data, tensor.datatype)
            chunks.append(raw)
            out["parameters"] = {**params, "binary_data_size": len(raw)}
        else:
            if params:
                out["parameters"] = params
            out["data"] = _json_data(tensor)
        outputs.append(out)
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version,
                           "outputs": outputs}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)
