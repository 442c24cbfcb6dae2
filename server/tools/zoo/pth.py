"""Read a PyTorch checkpoint (.pth state dict) into numpy arrays without torch.

``torch.save`` wraps the same pickle in one of two containers:

- zip (torch >= 1.6): ``<archive>/data.pkl`` is the pickle and every storage
  is a raw little-endian file ``<archive>/data/<key>``;
- legacy (older torch, or ``_use_new_zipfile_serialization=False``): five
  pickles in a row (magic number, protocol version, system info, the object,
  the list of storage keys), then for each listed key an int64 element count
  and the storage's raw bytes.

In both, a tensor is pickled as ``torch._utils._rebuild_tensor_v2(storage,
offset, size, stride, ...)`` whose storage is a persistent id
``('storage', torch.<Type>Storage, key, location, numel[, view])``. The
unpickler below resolves only those few names, to inert stand-ins, so a
checkpoint cannot construct or call anything else; the tensors come out as
references that are turned into arrays once the storages are read, with
their offset, size and stride checked against the storage's length.
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001

#: Storage classes the unpickler accepts, as numpy dtypes (all little-endian).
STORAGE_DTYPES = {
    "DoubleStorage": "<f8", "FloatStorage": "<f4", "HalfStorage": "<f2",
    "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2",
    "CharStorage": "i1", "ByteStorage": "u1", "BoolStorage": "?",
}


class Storage(NamedTuple):
    """A persistent id, resolved: elements [offset, offset + numel) of storage ``key``."""
    key: str
    dtype: str
    offset: int
    numel: int


class TensorRef(NamedTuple):
    """A tensor whose storage is read later (the legacy format stores it after the pickle)."""
    storage: Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor(storage: Storage, offset: int, size: Sequence[int], stride: Sequence[int],
                    *_ignored: object) -> TensorRef:
    # The trailing arguments (requires_grad, backward hooks, metadata) do not matter here.
    return TensorRef(storage, offset, tuple(size), tuple(stride))


def _rebuild_parameter(data: TensorRef, *_ignored: object) -> TensorRef:
    return data  # an nn.Parameter is just its tensor once loaded


class _Unpickler(pickle.Unpickler):
    """Resolves only the names a state dict needs; anything else is an error."""

    def __init__(self, file: IO[bytes]) -> None:
        super().__init__(file)
        self.dtypes: dict[str, str] = {}  # storage key -> dtype, as the pickle names them

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict  # torch sets a _metadata attribute on it
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("torch._utils", "_rebuild_parameter"):
            return _rebuild_parameter
        if module == "torch" and name in STORAGE_DTYPES:
            return STORAGE_DTYPES[name]  # a plain string: nothing to call or build
        raise pickle.UnpicklingError(f"checkpoint refers to {module}.{name}, which is not allowed")

    def persistent_load(self, pid: Any) -> Storage:
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"
                and pid[1] in STORAGE_DTYPES.values()):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r:.80}")
        _, dtype, key, _location, numel, *view = pid
        self.dtypes[str(key)] = dtype  # a view's bytes belong to its root key
        if view and view[0] is not None:  # legacy view into a larger storage
            _view_key, view_offset, view_numel = view[0]
            return Storage(str(key), dtype, int(view_offset), int(view_numel))
        return Storage(str(key), dtype, 0, int(numel))


def _materialize(ref: TensorRef, raw: bytes) -> np.ndarray:
    """The tensor's elements out of its storage's bytes, bounds-checked before any strided view."""
    s = ref.storage
    flat = np.frombuffer(raw, dtype=s.dtype)
    if not (s.offset >= 0 and s.numel >= 0 and s.offset + s.numel <= flat.size):
        raise ValueError(f"storage {s.key}: {flat.size} elements, tensor wants [{s.offset}, +{s.numel})")
    flat = flat[s.offset:s.offset + s.numel]
    size, stride = [int(v) for v in ref.size], [int(v) for v in ref.stride]
    if len(size) != len(stride) or min(size + stride + [ref.offset], default=0) < 0:
        raise ValueError(f"storage {s.key}: bad size {size} / stride {stride} / offset {ref.offset}")
    if 0 in size:
        return np.zeros(size, dtype=flat.dtype)
    last = ref.offset + sum((n - 1) * st for n, st in zip(size, stride, strict=True))
    if last >= flat.size:
        raise ValueError(f"storage {s.key}: tensor reaches element {last} of {flat.size}")
    item = flat.itemsize
    view = np.lib.stride_tricks.as_strided(flat[ref.offset:], size, [st * item for st in stride], writeable=False)
    return np.array(view)  # a contiguous, writable copy


def _collect(obj: Any, raw_of: Callable[[Storage], bytes]) -> dict[str, np.ndarray]:
    if not isinstance(obj, dict):
        raise ValueError(f"checkpoint holds a {type(obj).__name__}, not a state dict")
    return {str(k): _materialize(v, raw_of(v.storage)) for k, v in obj.items() if isinstance(v, TensorRef)}


def _load_zip(path: Path) -> dict[str, np.ndarray]:
    with zipfile.ZipFile(path) as zf:
        pkl = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith("/data.pkl")]
        if len(pkl) != 1:
            raise ValueError(f"{path}: no single <archive>/data.pkl in the zip")
        root = pkl[0][: -len("data.pkl")]
        order = f"{root}byteorder"
        if order in zf.namelist() and zf.read(order).strip() != b"little":
            raise ValueError(f"{path}: big-endian checkpoints are not supported")
        obj = _Unpickler(io.BytesIO(zf.read(pkl[0]))).load()
        return _collect(obj, lambda s: zf.read(f"{root}data/{s.key}"))


def _load_legacy(path: Path) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        magic, protocol, info = (_Unpickler(f).load() for _ in range(3))
        if magic != LEGACY_MAGIC or protocol != LEGACY_PROTOCOL:
            raise ValueError(f"{path}: not a PyTorch checkpoint")
        if not (isinstance(info, dict) and info.get("little_endian")):
            raise ValueError(f"{path}: big-endian checkpoints are not supported")
        unpickler = _Unpickler(f)
        obj = unpickler.load()
        end = os.fstat(f.fileno()).st_size
        raw: dict[str, bytes] = {}
        for key in _Unpickler(f).load():
            if key not in unpickler.dtypes:
                raise ValueError(f"{path}: storage {key} is listed but never used")
            head = f.read(8)
            nbytes = struct.unpack("<q", head)[0] * np.dtype(unpickler.dtypes[key]).itemsize if len(head) == 8 else -1
            if not 0 <= nbytes <= end - f.tell():  # checked before reading: a count is not trusted
                raise ValueError(f"{path}: storage {key} is truncated")
            raw[key] = f.read(nbytes)
        return _collect(obj, lambda s: raw[s.key])


def load_state_dict(path: Path | str) -> dict[str, np.ndarray]:
    """Parameter name -> numpy array, from a .pth file in either container."""
    path = Path(path)
    with open(path, "rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"  # as torch tells the two apart
    return _load_zip(path) if is_zip else _load_legacy(path)
