"""Wire-independent tensor decoding: raw bytes or value lists -> numpy arrays.

Every check that does not need the model happens here, before any large
allocation: shape sanity, element counts, byte lengths.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import bytes_tensor
from .datatypes import numpy_dtype

#: Refuse shapes whose element count is absurd before allocating anything.
MAX_ELEMENTS = 1 << 40
#: The most dimensions a tensor may have. OpenVINO's CPU plugin compiles no model
#: with more (a rank-33 input fails inside the plugin), and numpy 1.x, which
#: ovserve still supports, holds no array with more (numpy 2 stops at 64): a
#: larger rank could fit no model, and numpy would fail on it with a ValueError.
MAX_DIMS = 32


def check_shape(shape: Sequence[Any], where: str) -> tuple[int, ...]:
    if len(shape) > MAX_DIMS:
        raise InvalidInput(
            f"{where}: shape has {len(shape)} dimensions; at most {MAX_DIMS} are supported "
            f"(OpenVINO's CPU plugin compiles no model of higher rank)"
        )
    dims = tuple(shape)
    if set(map(type, dims)) == {int}:  # protobuf's int64s, most JSON: at once (~1 us, ~4 us below)
        if min(dims) < 0:
            raise InvalidInput(f"{where}: shape {list(dims)} has a negative dimension")
        if math.prod(dims) > MAX_ELEMENTS:
            raise InvalidInput(f"{where}: shape {list(dims)} declares too many elements")
        return dims
    try:
        dims = tuple(int(d) for d in shape)
        if any(isinstance(d, bool) or int(d) != d for d in shape):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"{where}: shape must be a list of integers, got {list(shape)!r}") from None
    if any(d < 0 for d in dims):
        raise InvalidInput(f"{where}: shape {list(dims)} has a negative dimension")
    if math.prod(dims) > MAX_ELEMENTS:
        raise InvalidInput(f"{where}: shape {list(dims)} declares too many elements")
    return dims


def from_raw(where: str, datatype: str, shape: tuple[int, ...], buffer: bytes | memoryview) -> np.ndarray:
    """Decode raw little-endian bytes (or framed BYTES) of a tensor, zero-copy when possible."""
    dtype = numpy_dtype(datatype, where)
    count = math.prod(shape)
    if datatype == "BYTES":
        try:
            elements = bytes_tensor.unpack(buffer, where, limit=count)
        except InvalidInput:
            if count != 1:
                raise
            # One element may come unframed (OVMS accepts a lone image this
            # way): a buffer that is not valid framing is that element itself.
            elements = [bytes(buffer)]
        if len(elements) != count:
            got = len(elements) if len(elements) < count else "more"
            raise InvalidInput(f"{where}: shape {list(shape)} needs {count} BYTES elements, got {got}")
        return bytes_tensor.to_object_array(elements, shape)
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidInput(
            f"{where}: shape {list(shape)} of {datatype} needs {expected} bytes, got {len(buffer)}"
        )
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


#: What a JSON value is called in an error message, by its Python type.
_JSON_NAMES: dict[type, str] = {type(None): "null", bool: "true/false", str: "a string", dict: "an object",
                                list: "a list"}


def _json_value(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    return _JSON_NAMES.get(type(value), type(value).__name__)


def _check_value_types(datatype: str, dtype: np.dtype, arr: np.ndarray, values: Any, reply: bool) -> None:
    """Every element of JSON-like ``values`` is of the datatype's JSON kind, or ValueError naming one that is not.

    numpy would take them all: null becomes NaN in a float array, true becomes 1
    next to numbers, so the element types are checked before any cast.
    """
    if arr.ndim == 1 and isinstance(values, list):
        flat = values
    elif arr.ndim == 0:
        flat = [values]
    else:  # nested lists: their leaves, in order
        flat = np.asarray(values, dtype=object).reshape(-1).tolist()
    if datatype == "BOOL":
        allowed: tuple[type, ...] = (bool,)
        expected = "true or false"
    elif dtype.kind in "iu":
        allowed, expected = (int,), "an integer"
    else:
        allowed, expected = ((int, float, type(None)) if reply else (int, float)), "a number"
    bad = set(map(type, flat)).difference(allowed)
    if bad:
        first = next(v for v in flat if type(v) in bad)
        raise ValueError(f"{_json_value(first)} is not {expected}")


def from_values(where: str, datatype: str, shape: tuple[int, ...], values: Any, *, typed: bool = False,
                reply: bool = False) -> np.ndarray:
    """Decode a flat or nested list of values (JSON ``data``, typed gRPC contents).

    Values are checked to be of the datatype's kind (numbers, integers, true/false,
    strings) unless ``typed``: they come from a typed container (a protobuf
    repeated field) that holds nothing else. ``reply``: the values are a server's
    answer, not a client's request, read liberally: a null in float data is NaN
    (JSON cannot carry NaN, and servers, ovserve too, write null for it) and a
    BYTES element that is not a string is its text. A client's null is an error.
    """
    dtype = numpy_dtype(datatype, where)
    count = math.prod(shape)
    if datatype == "BYTES":
        try:
            arr = np.asarray(values, dtype=object)
        except ValueError as exc:  # ragged nesting
            raise InvalidInput(f"{where}: data does not fit datatype BYTES: {exc}") from None
        if arr.size != count:
            raise InvalidInput(f"{where}: shape {list(shape)} needs {count} elements, got {arr.size}")
        try:
            convert = bytes_tensor.as_bytes if reply else bytes_tensor.element
            flat = [convert(v) for v in arr.reshape(-1)]
        except ValueError as exc:
            raise InvalidInput(f"{where}: data does not fit datatype BYTES: {exc}") from None
        return bytes_tensor.to_object_array(flat, shape)
    try:
        # Parse without a target dtype first, so that a cast can never silently
        # truncate (1.5 -> 1), wrap (300 -> 44) or reinterpret (true, "2").
        arr = np.asarray(values)
        if typed:
            pass  # a protobuf field's values: of its one type (exact Python ints for 64-bit fields)
        elif not (isinstance(values, np.ndarray) and values.dtype != object):
            _check_value_types(datatype, dtype, arr, values, reply)
        elif datatype == "BOOL" and arr.size and arr.dtype != np.bool_:
            raise ValueError("BOOL data must be true/false")
        elif arr.size and dtype.kind in "iu" and arr.dtype.kind not in "iuO":
            raise ValueError(f"{datatype} data must be integers")
        elif arr.size and dtype.kind == "f" and arr.dtype.kind not in "iufO":
            raise ValueError(f"{datatype} data must be numbers")
        if arr.size and dtype.kind in "iu" and arr.dtype.kind not in "iu":
            # numpy makes floats (or objects) of integers when some do not fit
            # int64 (UINT64 values past 2**63 next to negative ones): compare exactly.
            arr = np.asarray(values, dtype=object)
        if arr.size and dtype.kind in "iu":
            info = np.iinfo(dtype)
            low, high = arr.min(), arr.max()
            if low < info.min or high > info.max:
                raise ValueError(f"value {low if low < info.min else high} is out of range")
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.asarray(arr, dtype=dtype)
        if dtype.kind == "f":
            _check_finite(out, arr)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"{where}: data does not fit datatype {datatype}: {exc}") from None
    if out.size != count:
        raise InvalidInput(f"{where}: shape {list(shape)} needs {count} elements, got {out.size}")
    return out.reshape(shape)


def _check_finite(out: np.ndarray, source: np.ndarray) -> None:
    """ValueError when a finite number became infinite in a narrower float type (1e39 as FP32)."""
    if out.size and out.dtype.itemsize < 8 and not np.isfinite(out).all():
        wide = np.asarray(source, dtype=np.float64)
        overflow = np.isinf(out) & np.isfinite(wide)
        if overflow.any():
            raise ValueError(f"value {float(wide[overflow][0])!r} is out of range")


def from_numbers(where: str, datatype: str, shape: tuple[int, ...], numbers: np.ndarray) -> np.ndarray:
    """A flat float64/int64/uint64 array parsed from JSON -> the datatype's array (range-checked)."""
    dtype = numpy_dtype(datatype, where)
    count = math.prod(shape)
    if numbers.size != count:
        raise InvalidInput(f"{where}: shape {list(shape)} needs {count} elements, got {numbers.size}")
    if dtype.kind in "iu" and numbers.size:
        info = np.iinfo(dtype)
        low, high = numbers.min(), numbers.max()
        if low < info.min or high > info.max:
            raise InvalidInput(f"{where}: data does not fit datatype {datatype}: "
                               f"value {low if low < info.min else high} is out of range")
    with np.errstate(over="ignore"):
        out = numbers.astype(dtype, copy=numbers.dtype != dtype)
    if dtype.kind == "f":
        try:
            _check_finite(out, numbers)
        except ValueError as exc:
            raise InvalidInput(f"{where}: data does not fit datatype {datatype}: {exc}") from None
    return out.reshape(shape)


def to_raw(array: np.ndarray, datatype: str) -> bytes:
    """Serialize an array to the raw wire form (little-endian, or framed BYTES)."""
    if datatype == "BYTES":
        return bytes_tensor.pack(array)
    dtype = numpy_dtype(datatype, "output")
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


#: Output parameters that steer the encoding of a reply (the client's ``binary_data`` ask,
#: the wire's ``binary_data_size``); every other parameter of an output is the reply's own.
ENCODING_PARAMETERS = frozenset({"binary_data", "binary_data_size"})


def reply_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """An output's parameters as its reply carries them, without the encoding directives."""
    return {k: v for k, v in params.items() if k not in ENCODING_PARAMETERS} if params else {}


def encoding_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """What a requested output asks of the reply's encoding (``binary_data``); the rest is not echoed."""
    return {k: v for k, v in params.items() if k in ENCODING_PARAMETERS} if params else {}
