"""KServe V1 JSON <-> neutral types: ``instances`` (rows) or ``inputs`` (columns) in,
``predictions`` out.

One decoder for every component. Given the model's exact inputs (a model
server), a column must name one of them and takes its datatype. Given only
hints (a transformer: its handler may turn any inputs into the predictor's),
a column of a known name takes its datatype, and any other column is typed
from its values: ``{"b64": ...}`` objects and strings are BYTES, numbers
FP32, INT64 or BOOL.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ovserve.common.codecs.tensors import from_values

from ..errors import InvalidInput
from ..types import InferRequest, InferResponse, Tensor, TensorSpec

#: the name of the one column of row instances when the model's one input is not known
UNNAMED = "instances"


def decode_request(model_name: str, doc: Any, specs: Sequence[TensorSpec], exact: bool = True) -> InferRequest:
    """A V1 body -> a request; ``specs`` are the model's inputs (``exact``) or hints."""
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object")
    if ("instances" in doc) == ("inputs" in doc):
        raise InvalidInput("request must have exactly one of 'instances' or 'inputs'")
    types = {s.name: s.datatype for s in specs}
    columns = _columns(model_name, doc, list(types), exact)
    inputs = []
    for key, values in columns.items():
        datatype = types.get(key)
        if datatype is None and exact:
            raise InvalidInput(f"unknown input {key!r}; model {model_name!r} has inputs {list(types)}")
        inputs.append(_tensor(key, values, datatype))
    request_id = doc.get("id", "")
    return InferRequest(model_name=model_name, inputs=inputs, id=request_id if isinstance(request_id, str) else "")


def _columns(model_name: str, doc: dict[str, Any], names: list[str], exact: bool) -> dict[str, Any]:
    only = names[0] if len(names) == 1 else (None if exact else UNNAMED)
    if "instances" in doc:
        rows = doc["instances"]
        if not isinstance(rows, list) or not rows:
            raise InvalidInput("'instances' must be a non-empty list")
        if all(isinstance(r, dict) and set(r) != {"b64"} for r in rows):
            columns: dict[str, list[Any]] = {}
            for row in rows:
                for key, value in row.items():
                    columns.setdefault(key, []).append(value)
            for key, col in columns.items():
                if len(col) != len(rows):
                    raise InvalidInput(f"instance field {key!r} is missing from some instances")
            return columns
        if only is None:
            raise InvalidInput(f"model {model_name!r} has inputs {names}: each instance must be an object naming them")
        return {only: rows}
    cols = doc["inputs"]
    if isinstance(cols, dict):
        return cols
    if only is None:
        raise InvalidInput(f"model {model_name!r} has inputs {names}: 'inputs' must be an object naming them")
    return {only: cols}


def _tensor(name: str, values: Any, datatype: str | None) -> Tensor:
    where = f"input {name!r}"
    if not isinstance(values, list):
        values = [values]
    if datatype is None:
        datatype = _guess(where, values)
    try:
        # Only the shape is taken here; from_values checks and casts the values.
        arr = np.asarray(values, dtype=object if datatype == "BYTES" else None)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"{where}: instances do not form a {datatype} tensor: {exc}") from None
    if arr.size > 0 and math.prod(arr.shape) != arr.size:  # pragma: no cover - numpy invariant
        raise InvalidInput(f"{where}: ragged instances")
    return Tensor(name, datatype, tuple(arr.shape), from_values(where, datatype, tuple(arr.shape), values))


def _guess(where: str, values: list[Any]) -> str:
    """The datatype of a column no input spec names, from its values."""
    flat = np.asarray(values, dtype=object).reshape(-1)
    if flat.size and all(isinstance(v, str) or (isinstance(v, dict) and set(v) == {"b64"}) for v in flat):
        return "BYTES"
    try:
        kind = np.asarray(values).dtype.kind
    except ValueError as exc:
        raise InvalidInput(f"{where}: instances do not form a tensor: {exc}") from None
    if kind not in "biuf":
        raise InvalidInput(f"{where}: instances must be numbers, strings or {{\"b64\": ...}} objects")
    return {"b": "BOOL", "i": "INT64", "u": "INT64", "f": "FP32"}[kind]


def _text(item: Any) -> str:
    return item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)


def encode_predictions(response: InferResponse) -> dict[str, Any]:
    """Row-form predictions: one entry per instance; a dict per row for several outputs."""
    def rows(t: Tensor) -> Any:  # a list, or a scalar for a 0-d output
        data = t.data
        if t.datatype == "BYTES":
            data = np.vectorize(_text, otypes=[object])(data)
        elif t.datatype == "FP16":
            data = data.astype(np.float32)
        return data.tolist()

    if len(response.outputs) == 1:
        return {"predictions": rows(response.outputs[0])}
    columns = {t.name: rows(t) for t in response.outputs}
    n = min(len(c) for c in columns.values())
    return {"predictions": [{k: c[i] for k, c in columns.items()} for i in range(n)]}
