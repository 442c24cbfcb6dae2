"""The torch-free checkpoint reader: both containers, strided views, and what it refuses.

Checkpoints are written here by hand in torch's two layouts. Pickling the
names ``torch.FloatStorage`` and ``torch._utils._rebuild_tensor_v2`` needs
importable objects of those names, so stand-in modules are put in
``sys.modules`` for the time of a test (torch itself is not needed).
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import sys
import types
import zipfile

import numpy as np
import pytest

from ovserve.server.tools.zoo.pth import LEGACY_MAGIC, LEGACY_PROTOCOL, load_state_dict

STORAGES = {"0": np.arange(12, dtype=np.float32), "1": np.array([7, 8, 9], dtype=np.float32)}


@pytest.fixture
def fake_torch(monkeypatch):
    torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")

    def rebuild(*args):  # never called: only its name is pickled
        raise AssertionError

    storage_type = type("FloatStorage", (), {"__module__": "torch"})
    rebuild.__module__, rebuild.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    torch.FloatStorage, torch._utils, utils._rebuild_tensor_v2 = storage_type, utils, rebuild
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)
    return storage_type, rebuild


class _Tensor:
    def __init__(self, key, offset, size, stride, rebuild):
        self.args, self.rebuild = (key, offset, size, stride), rebuild

    def __reduce__(self):
        key, offset, size, stride = self.args
        return self.rebuild, (_StorageRef(key), offset, size, stride, False, collections.OrderedDict())


class _StorageRef:
    def __init__(self, key):
        self.key = key


def _state_pickle(fake, legacy: bool) -> bytes:
    storage_type, rebuild = fake
    state = collections.OrderedDict(
        transposed=_Tensor("0", 1, (3, 2), (1, 3), rebuild),  # elements 1 + i + 3j of storage 0
        plain=_Tensor("1", 0, (3,), (1,), rebuild),
    )
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=2)
    numel = {k: v.size for k, v in STORAGES.items()}
    pickler.persistent_id = lambda obj: (
        ("storage", storage_type, obj.key, "cpu", numel[obj.key]) + ((None,) if legacy else ())
        if isinstance(obj, _StorageRef) else None)
    pickler.dump(state)
    return buf.getvalue()


def _write(path, data_pkl: bytes, legacy: bool, storages=STORAGES) -> None:
    if not legacy:
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("ckpt/data.pkl", data_pkl)
            zf.writestr("ckpt/byteorder", "little")
            for key, arr in storages.items():
                zf.writestr(f"ckpt/data/{key}", arr.tobytes())
        return
    with open(path, "wb") as f:
        for header in (LEGACY_MAGIC, LEGACY_PROTOCOL, {"protocol_version": 1001, "little_endian": True}):
            f.write(pickle.dumps(header, protocol=2))
        f.write(data_pkl)
        f.write(pickle.dumps(sorted(storages), protocol=2))
        for key in sorted(storages):
            f.write(struct.pack("<q", storages[key].size) + storages[key].tobytes())


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_reads_offsets_and_strides(tmp_path, fake_torch, legacy):
    path = tmp_path / "w.pth"
    _write(path, _state_pickle(fake_torch, legacy), legacy)
    state = load_state_dict(path)
    assert list(state) == ["transposed", "plain"]
    np.testing.assert_array_equal(state["transposed"], [[1, 4], [2, 5], [3, 6]])
    np.testing.assert_array_equal(state["plain"], [7, 8, 9])
    assert state["transposed"].dtype == np.float32 and state["transposed"].flags.writeable


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_refuses_a_stride_past_the_storage(tmp_path, fake_torch, legacy):
    path = tmp_path / "w.pth"
    small = {"0": STORAGES["0"][:6], "1": STORAGES["1"]}  # "transposed" would read element 7
    _write(path, _state_pickle(fake_torch, legacy), legacy, small)
    with pytest.raises(ValueError, match="storage 0"):
        load_state_dict(path)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("payload", ["os.system", "builtins.eval"])
def test_refuses_other_globals(tmp_path, legacy, payload):
    marker = tmp_path / "owned"
    if payload == "os.system":
        data = pickle.dumps(collections.OrderedDict(w=_Evil(marker)), protocol=2)
    else:
        data = b"\x80\x02cbuiltins\neval\nX\x0b\x00\x00\x00print('hi')\x85R."
    path = tmp_path / "evil.pth"
    _write(path, data, legacy, storages={})
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        load_state_dict(path)
    assert not marker.exists()
