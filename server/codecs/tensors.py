"""Wire-independent tensor decoding: raw bytes or value lists -> numpy arrays.

Every check that does not need the model happens here, before any large
allocation: shape sanity, element counts, byte lengths.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..errors import InvalidInput
from . import bytes_tensor
from .datatypes import numpy_dtype

#: Refuse shapes whose element count is absurd before allocating anything.
MAX_ELEMENTS = 1 << 40


def check_shape(shape: Sequence[Any], where: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in shape)
        if any(isinstance(d, bool) or int(d) != d for d in shape):
            raise ValueError
    except (TypeError, ValueError):
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
            elements = bytes_tensor.unpack(buffer, where)
        except InvalidInput:
            if count != 1:
                raise
            # One element may come unframed (OVMS accepts a lone image this
            # way): a buffer that is not valid framing is that element itself.
            elements = [bytes(buffer)]
        if len(elements) != count:
            raise InvalidInput(
                f"{where}: shape {list(shape)} needs {count} BYTES elements, got {len(elements)}"
            )
        return bytes_tensor.to_object_array(elements, shape)
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidInput(
            f"{where}: shape {list(shape)} of {datatype} needs {expected} bytes, got {len(buffer)}"
        )
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def from_values(where: str, datatype: str, shape: tuple[int, ...], values: Any) -> np.ndarray:
    """Decode a flat or nested list of values (JSON ``data``, typed gRPC contents)."""
    dtype = numpy_dtype(datatype, where)
    count = math.prod(shape)
    if datatype == "BYTES":
        arr = np.asarray(values, dtype=object)
        if arr.size != count:
            raise InvalidInput(f"{where}: shape {list(shape)} needs {count} elements, got {arr.size}")
        try:
            flat = [bytes_tensor.as_bytes(v) for v in arr.reshape(-1)]
        except ValueError as exc:
            raise InvalidInput(f"{where}: {exc}") from None
        return bytes_tensor.to_object_array(flat, shape)
    try:
        # Parse without a target dtype first, so that a cast can never silently
        # truncate (1.5 -> 1), wrap (300 -> 44) or reinterpret (true, "2").
        arr = np.asarray(values)
        if arr.dtype.kind == "f" and dtype.kind in "iu":
            # numpy makes floats of integers when some do not fit int64 (UINT64
            # values past 2**63 next to small ones): keep exact integers exact.
            exact = np.asarray(values, dtype=object)
            if all(isinstance(v, int) and not isinstance(v, bool) for v in exact.flat):
                arr = exact
        if datatype == "BOOL":
            if arr.size and arr.dtype != np.bool_:
                raise ValueError("BOOL data must be true/false")
        elif arr.size and arr.dtype.kind in "iu" and dtype.kind in "iu":
            info = np.iinfo(dtype)
            low, high = arr.min(), arr.max()
            if low < info.min or high > info.max:
                raise ValueError(f"value {low if low < info.min else high} is out of range")
        elif arr.size and arr.dtype.kind not in ("iufO" if dtype.kind == "f" else "iuO"):
            raise ValueError(f"{datatype} data must be {'numbers' if dtype.kind == 'f' else 'integers'}")
        # Object arrays (None, huge integers, mixed junk) convert element by
        # element, which raises on anything that does not fit.
        arr = np.asarray(arr, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"{where}: data does not fit datatype {datatype}: {exc}") from None
    if arr.size != count:
        raise InvalidInput(f"{where}: shape {list(shape)} needs {count} elements, got {arr.size}")
    return arr.reshape(shape)


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
    return numbers.astype(dtype, copy=numbers.dtype != dtype).reshape(shape)


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
