"""Large JSON request bodies take a different parser (simdjson, arrays of numbers
straight into numpy): it must decode exactly what the small-body path decodes,
and refuse exactly what it refuses."""
from __future__ import annotations

import json
import math

import numpy as np
import orjson
import pytest

from ovserve.server.errors import InvalidInput
from ovserve.server.transports.rest import codec

N = 20_000  # elements: well past LARGE_JSON once written as JSON


def _body(datatype: str, data: object, shape: list[int] | None = None, **extra: object) -> bytes:
    item = {"name": "x", "datatype": datatype, "shape": shape or [N], "data": data, **extra}
    doc = {"id": "r1", "inputs": [item], "outputs": [{"name": "y"}], "parameters": {"p": 1}}
    return json.dumps(doc).encode()


def _both(body: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    """Decode with the large-body parser and with the small-body one (or their errors)."""
    results = []
    for threshold in (0, 1 << 40):
        monkeypatch.setattr(codec, "LARGE_JSON", threshold)
        try:
            results.append(codec.decode_infer_request("m", "", body, None))
        except InvalidInput as exc:
            results.append(exc)
    return results[0], results[1]


RNG = np.random.default_rng(3)
GOOD = [
    ("FP32", RNG.standard_normal(N).astype(np.float32).tolist()),
    ("FP64", RNG.standard_normal(N).tolist()),
    ("FP32", list(range(N))),  # integers are fine for a float tensor
    ("FP16", [0.5] * N),
    ("INT8", RNG.integers(-128, 128, N).tolist()),
    ("INT64", [-(2**63), 2**63 - 1] * (N // 2)),
    ("UINT8", RNG.integers(0, 256, N).tolist()),
    ("UINT64", [2**64 - 1, 0] * (N // 2)),
    ("BOOL", [True, False] * (N // 2)),
    ("BYTES", ["ab"] * N),
]


@pytest.mark.parametrize(("datatype", "data"), GOOD, ids=[f"{d}-{i}" for i, (d, _) in enumerate(GOOD)])
def test_large_bodies_decode_like_small_ones(datatype: str, data: list, monkeypatch: pytest.MonkeyPatch) -> None:
    body = _body(datatype, data)
    assert len(body) > codec.LARGE_JSON
    large, small = _both(body, monkeypatch)
    assert not isinstance(large, Exception), large
    assert not isinstance(small, Exception), small
    a, b = large.inputs[0], small.inputs[0]
    assert (a.name, a.datatype, a.shape) == (b.name, b.datatype, b.shape) == ("x", datatype, (N,))
    assert a.data.dtype == b.data.dtype
    np.testing.assert_array_equal(a.data, b.data)
    assert (large.id, large.parameters, [o.name for o in large.outputs]) == ("r1", {"p": 1}, ["y"])


def test_nested_data_takes_the_exact_path(monkeypatch: pytest.MonkeyPatch) -> None:
    values = RNG.standard_normal((100, 200)).astype(np.float32)
    large, small = _both(_body("FP32", values.tolist(), [100, 200]), monkeypatch)
    np.testing.assert_array_equal(large.inputs[0].data, values)
    np.testing.assert_array_equal(small.inputs[0].data, values)


BAD = [
    ("INT8", [1] * (N - 1) + [300], "out of range"),
    ("UINT8", [-1] + [1] * (N - 1), "out of range"),
    ("INT32", [1.5] * N, "1.5 is not an integer"),
    ("FP32", [1.0] * (N - 1) + ["2"], "a string is not a number"),
    ("FP32", [1.0] * (N - 1), "needs 20000 elements"),
    ("FP32", [[1.0, 2.0], [3.0]] * (N // 3), ""),
    ("BOOL", [1] * N, "1 is not true or false"),
    # null is no number: numpy would make it NaN in a float array, None in an object one
    ("FP32", [None] + [1.0] * (N - 1), "null is not a number"),
    ("FP64", [1.0] * (N - 1) + [None], "null is not a number"),
    ("INT32", [None] + [1] * (N - 1), "null is not an integer"),
    ("FP32", [[None] + [1.0] * 99] + [[1.0] * 100] * (N // 100 - 1), "null is not a number"),
    # true among numbers: numpy would make it 1
    ("FP32", [True] + [2.0] * (N - 1), "true/false is not a number"),
    ("INT64", [1] * (N - 1) + [False], "true/false is not an integer"),
    ("BOOL", [True] * (N - 1) + [None], "null is not true or false"),
    # what the JSON number becomes must be finite: 1e39 is no FP32 and 70000 no FP16
    ("FP32", [1.0] * (N - 1) + [1e39], "1e+39 is out of range"),
    ("FP16", [70000.0] + [1.0] * (N - 1), "70000.0 is out of range"),
    ("FP32", ["NaN"] * N, "a string is not a number"),
    ("BYTES", ["a"] * (N - 1) + [None], "null is not a string"),
    ("BYTES", [1] * N, "int is not a string"),
    ("BYTES", ["a"] * (N - 1) + [True], "true/false is not a string"),
]


@pytest.mark.parametrize(("datatype", "data", "needle"), BAD, ids=[f"{d}-{i}" for i, (d, _, _) in enumerate(BAD)])
def test_large_bodies_refuse_what_small_ones_refuse(datatype: str, data: list, needle: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    large, small = _both(_body(datatype, data), monkeypatch)
    assert isinstance(large, InvalidInput) and isinstance(small, InvalidInput), (large, small)
    assert needle in large.message and needle in small.message, (large.message, small.message)


def test_large_invalid_json_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    body = _body("FP32", [1.0] * N)[:-5]
    large, small = _both(body, monkeypatch)
    for err in (large, small):
        assert isinstance(err, InvalidInput) and "not valid JSON" in err.message


def test_large_binary_header_with_json_data_beside_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    """The binary extension's header can be large too (a JSON input beside a binary one)."""
    big = RNG.standard_normal(N).astype(np.float32)
    small_input = np.arange(4, dtype=np.int32)
    header = orjson.dumps({"inputs": [
        {"name": "a", "datatype": "FP32", "shape": [N], "data": big.tolist()},
        {"name": "b", "datatype": "INT32", "shape": [4], "parameters": {"binary_data_size": 16}},
    ]})
    body = header + small_input.tobytes()
    monkeypatch.setattr(codec, "LARGE_JSON", 0)
    req = codec.decode_infer_request("m", "", body, str(len(header)))
    np.testing.assert_array_equal(req.inputs[0].data, big)
    np.testing.assert_array_equal(req.inputs[1].data, small_input)
    assert math.prod(req.inputs[0].shape) == N


def test_binary_tensors_of_a_bytearray_body_are_writable_views_of_it() -> None:
    """read_body hands the codec a bytearray: binary tensors are views the inference shares."""
    x = np.arange(6, dtype=np.float32)
    raw = x.tobytes()
    header = json.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()
    body = bytearray(header + raw)
    req = codec.decode_infer_request("m", "", body, str(len(header)))
    arr = req.inputs[0].data
    assert arr.flags.writeable and np.shares_memory(arr, np.frombuffer(body, np.uint8))
    np.testing.assert_array_equal(arr, x.reshape(2, 3))


def test_a_large_json_body_in_a_bytearray_takes_the_simdjson_path() -> None:
    """read_body hands a bytearray; the large-body parser reads it like bytes."""
    x = np.arange(50_000, dtype=np.float32) / 8
    body = bytearray(json.dumps({"inputs": [{"name": "x", "shape": [50_000], "datatype": "FP32",
                                             "data": x.tolist()}]}).encode())
    assert len(body) >= codec.LARGE_JSON
    req = codec.decode_infer_request("m", "", body, None)
    np.testing.assert_array_equal(req.inputs[0].data, x)


def test_integers_past_64_bits_decode_like_the_small_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """simdjson holds no integer past 64 bits (its BIGINT_ERROR was a RuntimeError, a 500); orjson reads a float."""
    data = [2**64] + [1.0] * (N - 1)
    large, small = _both(_body("FP64", data), monkeypatch)
    assert not isinstance(large, Exception) and not isinstance(small, Exception), (large, small)
    np.testing.assert_array_equal(large.inputs[0].data, small.inputs[0].data)
    assert large.inputs[0].data[0] == float(2**64)
    large, small = _both(_body("INT64", [-(2**63) - 1] + [1] * (N - 1)), monkeypatch)
    for err in (large, small):
        assert isinstance(err, InvalidInput) and "INT64" in err.message, err
