"""Pure codec functions: datatypes, BYTES framing, raw and value decoding."""
from __future__ import annotations

import re
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ovserve.common.codecs import bytes_tensor
from ovserve.common.codecs.datatypes import V2_TO_NUMPY, element_size, v2_datatype
from ovserve.common.codecs.tensors import check_shape, from_raw, from_values, to_raw
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


@pytest.mark.parametrize("datatype,values,needle", [
    ("FP32", [None, 1.0, 2.0, 3.0], "null is not a number"),
    ("FP32", [[1.0, 2.0], [None, 3.0]], "null is not a number"),
    ("FP32", [True, 1.0, 2.0, 3.0], "true/false is not a number"),
    ("INT32", [1, 2, 3, None], "null is not an integer"),
    ("INT32", [1, 2, 3, 4.0], "4.0 is not an integer"),
    ("BOOL", [True, False, None, True], "null is not true or false"),
    ("FP16", [1.0, 2.0, 3.0, 1e6], "1000000.0 is out of range"),
    ("FP32", [1.0, 2.0, 3.0, -1e39], "-1e+39 is out of range"),
    ("FP32", [1.0, 2.0, 3.0, 10**400], "FP32"),
    ("BYTES", ["a", None, "b", "c"], "null is not a string"),
    ("BYTES", ["a", 1, "b", "c"], "int is not a string"),
    ("BYTES", ["a", ["b"], "b", "c"], "a list is not a string"),
])
def test_a_clients_values_are_of_the_datatypes_kind(datatype: str, values: list, needle: str) -> None:
    """JSON null, true or a string is never a number (numpy would make NaN or 1 of them)."""
    with pytest.raises(InvalidInput, match=re.escape(needle)):
        from_values("input 'x'", datatype, (2, 2), values)


def test_a_servers_reply_may_carry_nan_as_null_and_bytes_as_any_value() -> None:
    """JSON has no NaN: a reply (a predictor's, read by the transformer) writes it as null."""
    got = from_values("predictor output 'y'", "FP32", (2, 2), [None, 1.0, 2.0, None], reply=True)
    assert got.dtype == np.float32 and np.isnan(got[0, 0]) and np.isnan(got[1, 1]) and got[0, 1] == 1.0
    assert list(from_values("y", "BYTES", (2,), [1, "a"], reply=True)) == [b"1", b"a"]
    with pytest.raises(InvalidInput, match="true/false is not a number"):
        from_values("y", "FP32", (2,), [True, 1.0], reply=True)


def test_typed_values_skip_the_kind_check_but_not_the_range() -> None:
    """gRPC typed contents: a protobuf field holds one type; its range is still the datatype's."""
    big = [2**64 - 1, 0, 1, 2**63]
    np.testing.assert_array_equal(from_values("x", "UINT64", (2, 2), big, typed=True),
                                  np.array(big, np.uint64).reshape(2, 2))
    with pytest.raises(InvalidInput, match="300 is out of range"):
        from_values("input 'x'", "INT8", (2, 2), [1, 2, 3, 300], typed=True)


@pytest.mark.parametrize("rank", [33, 65, 1000])
def test_a_shape_of_more_than_32_dimensions_is_refused(rank: int) -> None:
    with pytest.raises(InvalidInput, match=f"{rank} dimensions; at most 32"):
        check_shape([1] * rank, "input 'x'")
    assert check_shape([1] * 32, "input 'x'") == (1,) * 32


class CountingPool(ThreadPoolExecutor):
    """A real thread pool that counts the tasks it was given."""

    def __init__(self) -> None:
        super().__init__(max_workers=4)
        self.submitted = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def test_a_batch_of_bad_images_stops_at_the_first_with_few_tasks_in_flight() -> None:
    """pool.map once queued a task per image and decoded them all before the first failure counted."""
    from ovserve.server.codecs import images
    from ovserve.server.types import Dim

    in_flight = images.IN_FLIGHT
    dims = [Dim(0, -1), Dim(8, 8), Dim(8, 8), Dim(3, 3)]
    uint8 = np.dtype(np.uint8)
    with CountingPool() as pool:
        with pytest.raises(InvalidInput, match="image 0 cannot be decoded"):
            images.decode_images("input 'x'", [b"not an image"] * 1000, dims, "NHWC", uint8, pool)
        assert pool.submitted <= in_flight
    good = cv2_png(8, 8)
    with CountingPool() as pool:  # the first bad one is named, whichever finishes first
        with pytest.raises(InvalidInput, match="image 37 cannot be decoded"):
            images.decode_images("input 'x'", [good] * 37 + [b"bad"] * 900, dims, "NHWC", uint8, pool)
        assert pool.submitted <= 37 + in_flight
    with CountingPool() as pool:
        batch = images.decode_images("input 'x'", [good] * 100, dims, "NHWC", uint8, pool)
    assert batch.shape == (100, 8, 8, 3) and pool.submitted == 100


def cv2_png(h: int, w: int) -> bytes:
    cv2 = pytest.importorskip("cv2")
    ok, buf = cv2.imencode(".png", np.full((h, w, 3), 7, np.uint8))
    assert ok
    return buf.tobytes()
