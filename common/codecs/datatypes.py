"""The one table between KServe V2 datatypes, numpy dtypes and OpenVINO types."""
from __future__ import annotations

import numpy as np

from ..errors import InvalidInput

# V2 datatype -> numpy dtype (little-endian, as the wire carries it).
# BYTES is variable-length and represented as an object array of ``bytes``.
V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}

NUMPY_TO_V2: dict[np.dtype, str] = {v.newbyteorder("="): k for k, v in V2_TO_NUMPY.items() if k != "BYTES"}

# OpenVINO element type names (ov.Type.get_type_name()) -> V2 datatype.
OV_TO_V2: dict[str, str] = {
    "boolean": "BOOL",
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "u64": "UINT64",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "f16": "FP16",
    "f32": "FP32",
    "f64": "FP64",
    "string": "BYTES",
}

#: Datatypes the V2 protocol names but ovserve refuses (OVMS does the same).
UNSUPPORTED = {"BF16": "BF16 is not supported by ovserve; send FP32 or FP16"}


def numpy_dtype(datatype: str, where: str) -> np.dtype:
    """The numpy dtype for a V2 datatype, or InvalidInput naming ``where``."""
    try:
        return V2_TO_NUMPY[datatype]
    except KeyError:
        if datatype in UNSUPPORTED:
            raise InvalidInput(f"{where}: {UNSUPPORTED[datatype]}") from None
        raise InvalidInput(f"{where}: unknown datatype {datatype!r}") from None


def element_size(datatype: str) -> int:
    """Bytes per element of a fixed-size datatype (0 for BYTES)."""
    dt = V2_TO_NUMPY[datatype]
    return 0 if dt == np.dtype(object) else dt.itemsize


def v2_datatype(array: np.ndarray) -> str:
    """The V2 datatype of a numpy array produced by a model."""
    if array.dtype == np.dtype(object) or array.dtype.kind in "SUT":
        return "BYTES"
    try:
        return NUMPY_TO_V2[array.dtype.newbyteorder("=")]
    except KeyError:
        raise InvalidInput(f"numpy dtype {array.dtype} has no V2 datatype") from None
