"""The hand-written half of the KServe V2 gRPC wire, shared by the server's servicer and the client.

Which ``InferTensorContents`` field carries each datatype, and the protobuf
``InferParameter`` maps as plain dicts. Duck-typed over the generated messages,
so this module imports no protobuf; the stubs beside it are generated
(``scripts/gen_protos.py``).
"""
from __future__ import annotations

from typing import Any

#: V2 datatype -> the InferTensorContents field that carries it.
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def params_from_pb(params: Any) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as a dict of its set values."""
    out = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        out[key] = getattr(p, which) if which else None
    return out


def params_to_pb(target: Any, params: dict[str, Any]) -> None:
    """Fill a ``map<string, InferParameter>`` from a dict (bool, int, float, anything else as its text)."""
    for key, value in params.items():
        p = target[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            if value >= 0 and value > 2**63 - 1:
                p.uint64_param = value
            else:
                p.int64_param = value
        elif isinstance(value, float):
            p.double_param = value
        else:
            p.string_param = str(value)
