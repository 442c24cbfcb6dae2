"""Test tensors of every V2 datatype, and what the demo models compute on them.

Written out independently of the server's own datatype table.
"""
from __future__ import annotations

import numpy as np

from . import models

DATATYPES = list(models.OV_TYPES)

#: V2 datatype -> numpy dtype, written out here rather than taken from the server.
NUMPY = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}


def f32(*shape: int, seed: int = 0) -> np.ndarray:
    """Seeded standard-normal FP32 data."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def objects(items: list[bytes], shape: tuple[int, ...]) -> np.ndarray:
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr.reshape(shape)


def sample(datatype: str, full_range: bool = False) -> np.ndarray:
    """A [2,4] tensor of edge values; without ``full_range``, room for +1."""
    if datatype == "BOOL":
        return np.array([[True, False, False, True], [False, True, True, False]])
    if datatype == "BYTES":
        # Embedded NUL, escapes, multi-byte UTF-8, empty and long elements.
        items = ["", "a", "a\0b", "é€😀", " ", '\t\n"\\', "0", "x" * 300]
        return objects([s.encode() for s in items], (2, 4))
    dtype = NUMPY[datatype]
    # The CPU plugin computes 64-bit types in 32 bits: the +1 values stay within those.
    narrow = not full_range and dtype.itemsize == 8
    if dtype.kind == "f":
        fi = np.finfo(np.float32 if narrow else dtype)
        return np.array([[fi.min, -1.5, fi.tiny, fi.max], [0.0, 0.5, 3.25, 1000.0]], dtype=dtype)
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    if narrow:
        lo, hi = max(lo, -(2**31)), 2**31 - 1
    if not full_range:
        hi -= 1  # room for +1
    return np.array([[lo, 0, 1, hi], [lo + 1, 2, 3, hi - 1]], dtype=dtype)


def plus_one(datatype: str, x: np.ndarray) -> np.ndarray:
    """What the dt_* models compute."""
    if datatype == "BOOL":
        return np.logical_not(x)
    if datatype == "BYTES":
        return x
    return x + np.array(1, dtype=x.dtype)
