"""Pure codec functions: datatypes, BYTES framing, raw and value decoding."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from ovserve.server.codecs import bytes_tensor
from ovserve.server.codecs.datatypes import V2_TO_NUMPY, element_size, v2_datatype
from ovserve.server.codecs.tensors import check_shape, from_raw, from_values, to_raw
from ovserve.server.errors import InvalidInput

SIZES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2,
         "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8, "BYTES": 0}


@pytest.mark.parametrize("datatype,size", SIZES.items())
def test_element_sizes(datatype: str, size: int) -> None:
    assert element_size(datatype) == size


@pytest.mark.parametrize("datatype", [d for d in SIZES if d != "BYTES"])
def test_raw_round_trip_is_zero_copy(datatype: str) -> None:
    arr = (np.arange(6) % 2 == 0) if datatype == "BOOL" else np.arange(6).astype(V2_TO_NUMPY[datatype])
    raw = to_raw(arr, datatype)
    assert len(raw) == 6 * SIZES[datatype]
    back = from_raw("x", datatype, (2, 3), raw)
    assert back.base is not None  # a view over the request buffer, not a copy
    np.testing.assert_array_equal(back, arr.reshape(2, 3))
    assert v2_datatype(back) == datatype


def test_bytes_framing() -> None:
    items = [b"", b"a", "\u00e9t\u00e9".encode(), b"\x00\xff" * 100]
    packed = bytes_tensor.pack(np.array(items, dtype=object))
    expected = b"".join(struct.pack("<I", len(i)) + i for i in items)
    assert packed == expected
    assert bytes_tensor.unpack(packed, "x") == items


@pytest.mark.parametrize("buffer,needle", [
    (b"\x01\x00", "truncated"),
    (struct.pack("<I", 10) + b"abc", "declares 10 bytes"),
])
def test_bytes_framing_errors(buffer: bytes, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        bytes_tensor.unpack(buffer, "input 'x'")


def test_raw_length_must_match_shape() -> None:
    with pytest.raises(InvalidInput, match=r"input 'x'.*needs 24 bytes, got 20"):
        from_raw("input 'x'", "FP32", (2, 3), b"\x00" * 20)


@pytest.mark.parametrize("shape,needle", [
    ([2, -1], "negative"),
    ([1 << 30, 1 << 30], "too many elements"),
    (["a"], "list of integers"),
    ([1.5], "list of integers"),
])
def test_bad_shapes(shape: list, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        check_shape(shape, "input 'x'")


def test_values_flat_and_nested_agree() -> None:
    flat = from_values("x", "INT32", (2, 2), [1, 2, 3, 4])
    nested = from_values("x", "INT32", (2, 2), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(flat, nested)
    assert flat.dtype == np.int32


@pytest.mark.parametrize("datatype,values,needle", [
    ("INT32", [1, 2, 3], "needs 4 elements, got 3"),
    ("FP32", ["a", "b", "c", "d"], "does not fit datatype FP32"),
    ("BOOL", [1, 0, 1, 0], "BOOL"),
    ("BF16", [1, 2, 3, 4], "BF16 is not supported"),
    ("COMPLEX", [1, 2, 3, 4], "unknown datatype"),
])
def test_value_errors(datatype: str, values: list, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        from_values("input 'x'", datatype, (2, 2), values)


def test_bytes_values_accept_str_and_bytes() -> None:
    arr = from_values("x", "BYTES", (2,), ["h\u00e9", b"\xff"])
    assert list(arr) == ["h\u00e9".encode(), b"\xff"]
