"""Property-based tests (hypothesis) of every decoder a client's bytes reach.

REST JSON (``transports/rest/codec.py``: small bodies through orjson, bodies over
``LARGE_JSON`` through simdjson), KServe V1 ``instances``/``inputs``, the binary
tensor extension (``Inference-Header-Content-Length``, ``binary_data_size``,
header 0), gRPC ``request_from_pb`` (typed contents and ``raw_input_contents``),
BYTES framing (``codecs/bytes_tensor.py``) and image batches (``codecs/images.py``).

- Anything a client may send ends in a request or in one of the documented errors
  (``ServerError`` subclasses: InvalidInput, PayloadTooLarge): never a KeyError,
  TypeError, ValueError, RecursionError or a hang.
- Valid tensors round-trip to exactly the arrays they describe, in every form.
- Nothing is coerced on the way: a decoded numeric tensor came from values of its
  datatype's kind (no null read as NaN, no true read as 1).

The gRPC converters import ovserve's own protobuf package ``inference``, which
tritonclient, imported by the other test modules, defines too: those tests run
in a process of their own (``test_grpc_converters_in_a_process_of_their_own``).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ovserve.common.codecs import bytes_tensor
from ovserve.common.codecs.datatypes import V2_TO_NUMPY
from ovserve.common.codecs.tensors import MAX_DIMS, from_raw
from ovserve.server.codecs import images, v1
from ovserve.server.errors import InvalidInput, PayloadTooLarge, ServerError
from ovserve.server.transports.rest import codec
from ovserve.server.types import Dim, InferRequest, PortInfo

FAST = settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: Set in the child process that runs the gRPC converter properties (see the module docstring).
PROTO_CHILD = os.environ.get("OVSERVE_TEST_OWN_PROTO") == "1"
in_child_only = pytest.mark.skipif(not PROTO_CHILD, reason="runs in a process of its own, without tritonclient "
                                                            "(test_grpc_converters_in_a_process_of_their_own)")

DATATYPES = list(V2_TO_NUMPY)
NUMERIC = [d for d in DATATYPES if d not in ("BOOL", "BYTES")]


# -- values ------------------------------------------------------------------------------------
def scalars(datatype: str) -> st.SearchStrategy[Any]:
    """The JSON values a tensor of ``datatype`` may hold, over its whole range."""
    if datatype == "BOOL":
        return st.booleans()
    if datatype == "BYTES":
        return st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
    dtype = V2_TO_NUMPY[datatype]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return st.integers(int(info.min), int(info.max))
    width = {"FP16": 16, "FP32": 32, "FP64": 64}[datatype]
    return st.floats(width=width, allow_nan=False, allow_infinity=False)


#: Any JSON value, small: what a field may hold when the client gets it wrong.
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6))
json_value = st.recursive(
    json_scalar, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner,
                                                                                      max_size=3)),
    max_leaves=12)


@st.composite
def tensors(draw: st.DrawFn, datatypes: list[str] = DATATYPES) -> tuple[str, tuple[int, ...], list[Any]]:
    """A valid tensor: datatype, shape, flat values (count = product of the shape)."""
    datatype = draw(st.sampled_from(datatypes))
    shape = tuple(draw(st.lists(st.integers(0, 3), min_size=1, max_size=3)))
    values = draw(st.lists(scalars(datatype), min_size=math.prod(shape), max_size=math.prod(shape)))
    return datatype, shape, values


def expected_array(datatype: str, shape: tuple[int, ...], values: list[Any]) -> np.ndarray:
    if datatype == "BYTES":
        out = np.empty(len(values), dtype=object)
        out[:] = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
        return out.reshape(shape)
    return np.array(values, dtype=object).astype(V2_TO_NUMPY[datatype]).reshape(shape)


def nested(values: list[Any], shape: tuple[int, ...]) -> Any:
    """The flat values as nested lists of ``shape`` (JSON's other form)."""
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr.reshape(shape).tolist()


def assert_tensor(array: np.ndarray, datatype: str, shape: tuple[int, ...], values: list[Any]) -> None:
    want = expected_array(datatype, shape, values)
    assert array.shape == shape and array.dtype == V2_TO_NUMPY[datatype], (array.shape, array.dtype)
    if datatype == "BYTES":
        assert array.reshape(-1).tolist() == want.reshape(-1).tolist()
    else:
        np.testing.assert_array_equal(array, want)


@contextlib.contextmanager
def json_path(large: bool) -> Iterator[None]:
    """Parse with simdjson (the path of bodies over 64 KiB) or with orjson, whatever the size."""
    saved = codec.LARGE_JSON
    codec.LARGE_JSON = 0 if large else 1 << 40
    try:
        yield
    finally:
        codec.LARGE_JSON = saved


def decode_or_refuse(body: bytes, header_length: str | None = None, large: bool = False) -> InferRequest | None:
    """decode_infer_request's request, or None when it refused with a documented error."""
    with json_path(large):
        try:
            return codec.decode_infer_request("m", "", body, header_length)
        except ServerError:
            return None


# -- REST JSON (V2) -------------------------------------------------------------------------------
@FAST
@given(tensor=tensors(), form=st.sampled_from(["flat", "nested"]), large=st.booleans())
@example(tensor=("FP32", (2, 2), [1.0, -0.0, 3.5, 1e-45]), form="nested", large=True)
@example(tensor=("UINT64", (2,), [2**64 - 1, 0]), form="flat", large=True)
@example(tensor=("INT64", (2,), [-(2**63), 2**63 - 1]), form="flat", large=False)
def test_rest_json_tensors_round_trip(tensor: tuple, form: str, large: bool) -> None:
    datatype, shape, values = tensor
    data = values if form == "flat" else nested(values, shape)
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": list(shape), "data": data}]}).encode()
    with json_path(large):
        request = codec.decode_infer_request("m", "", body, None)
    (got,) = request.inputs
    assert (got.name, got.datatype, got.shape) == ("x", datatype, shape)
    assert_tensor(got.data, datatype, shape, values)


@FAST
@given(datatype=st.sampled_from(DATATYPES), data=st.lists(json_scalar, min_size=1, max_size=6), large=st.booleans())
@example(datatype="FP32", data=[None, 1.0, 2.0, 3.0], large=False)  # issue 15: computed as NaN, answered 200
@example(datatype="FP32", data=[None, 1.0, 2.0, 3.0], large=True)
@example(datatype="FP64", data=[True, 2.0], large=False)  # numpy reads true as 1 beside numbers
@example(datatype="BYTES", data=[None, "a"], large=False)  # was the string 'None'
@example(datatype="FP16", data=[70000.0], large=True)  # past FP16's range: was inf
@example(datatype="BOOL", data=[-(2**63) - 1], large=True)  # simdjson's BIGINT_ERROR was a 500
@example(datatype="FP64", data=[2**64], large=True)
def test_rest_json_values_are_never_coerced(datatype: str, data: list, large: bool) -> None:
    """Decoded only when every value is of the datatype's kind, and then exactly."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [len(data)], "data": data}]}).encode()
    request = decode_or_refuse(body, large=large)
    if request is None:
        return
    kinds = {"BOOL": (bool,),
             "BYTES": (str,)}.get(datatype, (int,) if V2_TO_NUMPY[datatype].kind in "iu" else (int, float))
    assert all(type(v) in kinds for v in data), f"{datatype} decoded from {data!r}"
    got = request.inputs[0].data
    if datatype not in ("BYTES", "BOOL") and V2_TO_NUMPY[datatype].kind == "f":
        assert np.isfinite(got).all(), f"{data!r} became {got!r}"
        np.testing.assert_array_equal(got, np.array(data, dtype=np.float64).astype(got.dtype))
    else:
        assert_tensor(got, datatype, (len(data),), data)


@st.composite
def infer_documents(draw: st.DrawFn) -> Any:
    """Inference request documents, from nearly right to anything at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_value)
    inputs = []
    for _ in range(draw(st.integers(0, 3))):
        item: dict[str, Any] = {}
        if draw(st.booleans()):
            item["name"] = draw(st.one_of(st.sampled_from(["x", "y"]), json_scalar))
        if draw(st.integers(0, 4)):
            item["datatype"] = draw(st.one_of(st.sampled_from([*DATATYPES, "BF16", "FLOAT"]), json_scalar))
        if draw(st.integers(0, 4)):
            item["shape"] = draw(st.one_of(st.lists(st.integers(-2, 4), max_size=3),
                                           st.lists(st.integers(0, 1), min_size=MAX_DIMS, max_size=70),
                                           st.lists(st.integers(0, 2**64), max_size=3), json_value))
        if draw(st.integers(0, 4)):
            item["data"] = draw(st.one_of(st.lists(json_scalar, max_size=6), json_value))
        if draw(st.booleans()):
            item["parameters"] = draw(st.one_of(
                st.fixed_dictionaries({"binary_data_size": st.one_of(st.integers(-5, 50), json_scalar)}), json_value))
        inputs.append(item if draw(st.integers(0, 9)) else draw(json_value))
    doc: dict[str, Any] = {"inputs": inputs if draw(st.integers(0, 9)) else draw(json_value)}
    for key, values in (("outputs", st.lists(st.one_of(st.fixed_dictionaries({"name": json_scalar}), json_value),
                                             max_size=2)),
                        ("id", json_scalar), ("parameters", json_value)):
        if draw(st.booleans()):
            doc[key] = draw(st.one_of(values, json_value))
    return doc


@FAST
@given(doc=infer_documents(), large=st.booleans())
@example(doc={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1] * 65, "data": [1.0]}]}, large=False)
@example(doc={"inputs": [{"name": "x", "datatype": "FP32", "shape": [2**64], "data": [1.0]}]}, large=True)
@example(doc={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [[1.0], [2.0, 3.0]]}]},
         large=True)
# a key holding NUL: simdjson (the large bodies' parser) could not look it up again (KeyError, a 500)
@example(doc={"inputs": [None, {"\x00": None}]}, large=True)
@example(doc={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0], "a\x00b": 1}]},
         large=True)
def test_rest_json_documents_decode_or_are_refused(doc: Any, large: bool) -> None:
    body = json.dumps(doc).encode()
    request = decode_or_refuse(body, large=large)
    if request is not None:
        for t in request.inputs:
            assert t.data.shape == t.shape and len(t.shape) <= MAX_DIMS


@FAST
@given(body=st.one_of(st.binary(max_size=200), st.text(max_size=100).map(str.encode)), large=st.booleans())
@example(body=b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [NaN]}]}', large=True)
@example(body=b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [Infinity]}]}', large=False)
@example(body=b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1e400]}]}', large=True)
@example(body=b"[" * 100_000, large=True)
@example(body=b"[" * 100_000, large=False)
def test_rest_bodies_that_are_not_requests_are_refused(body: bytes, large: bool) -> None:
    assert decode_or_refuse(body, large=large) is None or body.strip().startswith(b"{")


# -- the binary tensor extension -------------------------------------------------------------------
def raw_of(datatype: str, shape: tuple[int, ...], values: list[Any]) -> bytes:
    arr = expected_array(datatype, shape, values)
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in arr.reshape(-1))
    return arr.astype(arr.dtype.newbyteorder("<")).tobytes()


@FAST
@given(inputs=st.lists(st.tuples(tensors(), st.sampled_from(["binary", "json", "binary-unsized"])),
                       min_size=1, max_size=3),
       large=st.booleans())
def test_binary_extension_round_trips(inputs: list, large: bool) -> None:
    """JSON and binary inputs side by side; a lone binary input may leave out its size."""
    items, payload = [], b""
    for i, ((datatype, shape, values), how) in enumerate(inputs):
        item: dict[str, Any] = {"name": f"in{i}", "datatype": datatype, "shape": list(shape)}
        if how == "json":
            item["data"] = values
        else:
            raw = raw_of(datatype, shape, values)
            if how == "binary" or len(inputs) > 1 or not raw:  # an empty lone one is no data at all
                item["parameters"] = {"binary_data_size": len(raw)}
            payload += raw
        items.append(item)
    header = json.dumps({"inputs": items}).encode()
    with json_path(large):
        request = codec.decode_infer_request("m", "", header + payload, str(len(header)))
    assert [t.name for t in request.inputs] == [f"in{i}" for i in range(len(inputs))]
    for got, ((datatype, shape, values), _) in zip(request.inputs, inputs, strict=True):
        assert_tensor(got.data, datatype, shape, values)


@FAST
@given(header=infer_documents(), tail=st.binary(max_size=64),
       length=st.one_of(st.none(), st.integers(-3, 400).map(str), st.text(max_size=5), st.just("0x10"),
                        st.just(str(2**70))),
       large=st.booleans())
@example(header={"inputs": [{"name": "x", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": 6}}]},
         tail=b"\x01\x00\x00\x00a\x00", length=None, large=False)
def test_binary_extension_framing_decodes_or_is_refused(header: Any, tail: bytes, length: str | None,
                                                        large: bool) -> None:
    head = json.dumps(header).encode()
    if length is None:  # the true length
        length = str(len(head))
    decode_or_refuse(head + tail, length, large)


@FAST
@given(body=st.binary(max_size=64), datatype=st.sampled_from(DATATYPES),
       dims=st.lists(st.integers(-1, 3), min_size=1, max_size=4))
def test_header_zero_takes_the_body_or_refuses_it(body: bytes, datatype: str, dims: list[int]) -> None:
    port = PortInfo("x", datatype, tuple(Dim(0, -1) if d < 0 else Dim(d, d) for d in dims), 0)
    try:
        request = codec.decode_headerless("m", "", body, [port])
    except ServerError:
        return
    (t,) = request.inputs
    assert t.data.shape == t.shape
    if t.datatype == "BYTES":
        assert t.data.reshape(-1).tolist() == [body]
    else:
        assert t.data.tobytes() == body


# -- KServe V1 ---------------------------------------------------------------------------------------
@FAST
@given(tensor=tensors(), named=st.booleans())
def test_v1_instances_round_trip(tensor: tuple, named: bool) -> None:
    datatype, shape, values = tensor
    rows = nested(values, shape)
    port = PortInfo("x", datatype, tuple(Dim(0, -1) for _ in shape), 0)
    doc = {"instances": [{"x": row} for row in rows] if named else rows}
    if not rows:  # no instances: refused as such
        with pytest.raises(InvalidInput, match="'instances'"):
            v1.decode_request("m", doc, [port.spec])
        return
    request = v1.decode_request("m", doc, [port.spec])
    (got,) = request.inputs
    # np.asarray gives the shape; trailing 0-length dimensions collapse in nested JSON lists
    if all(shape):
        assert got.shape == shape
    assert got.data.size == math.prod(shape)
    assert_tensor(got.data.reshape(shape), datatype, shape, values)


@FAST
@given(doc=st.one_of(
    st.fixed_dictionaries({"instances": json_value}),
    st.fixed_dictionaries({"inputs": json_value}),
    st.fixed_dictionaries({"instances": st.lists(st.fixed_dictionaries({"a": json_value}, optional={"b": json_value}),
                                                 max_size=3)}),
    json_value),
       datatypes=st.lists(st.sampled_from(DATATYPES), min_size=1, max_size=2))
@example(doc={"instances": [[None, 1.0]]}, datatypes=["FP32"])
@example(doc={"inputs": {"a": [[True, 2]]}}, datatypes=["INT32"])
@example(doc={"instances": [{"a": [1.0], "b": [None]}]}, datatypes=["FP32", "FP32"])
def test_v1_documents_decode_or_are_refused(doc: Any, datatypes: list[str]) -> None:
    ports = [PortInfo(name, dt, (Dim(0, -1), Dim(0, -1)), i)
             for i, (name, dt) in enumerate(zip("ab", datatypes, strict=False))]  # one or two inputs
    try:
        request = v1.decode_request("m", doc, [p.spec for p in ports])
    except ServerError:
        return
    for t in request.inputs:
        assert t.data.shape == t.shape
        if t.datatype not in ("BYTES", "BOOL") and V2_TO_NUMPY[t.datatype].kind == "f":
            assert np.isfinite(t.data).all(), (doc, t.data)


# -- BYTES framing -------------------------------------------------------------------------------------
def framed(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


@FAST
@given(elements=st.lists(st.binary(max_size=20), max_size=8))
def test_bytes_framing_round_trips(elements: list[bytes]) -> None:
    arr = np.empty(len(elements), dtype=object)
    arr[:] = elements
    packed = bytes_tensor.pack(arr)
    assert packed == framed(elements)
    assert bytes_tensor.unpack(packed, "x") == elements
    assert bytes_tensor.unpack(memoryview(bytearray(packed)), "x") == elements


@FAST
@given(buffer=st.one_of(st.binary(max_size=64), st.lists(st.binary(max_size=6), max_size=6).map(framed)),
       limit=st.one_of(st.none(), st.integers(0, 5)))
@example(buffer=b"\xff\xff\xff\xff", limit=None)
@example(buffer=b"\x01\x00", limit=0)
def test_bytes_framing_splits_or_refuses(buffer: bytes, limit: int | None) -> None:
    try:
        elements = bytes_tensor.unpack(buffer, "input 'x'", limit)
    except InvalidInput:
        return
    if limit is None:
        assert framed(elements) == buffer
    else:
        assert len(elements) <= limit + 1
        assert buffer.startswith(framed(elements))


@FAST
@given(buffer=st.one_of(st.binary(max_size=64), st.lists(st.binary(max_size=6), max_size=6).map(framed)),
       shape=st.lists(st.integers(0, 4), min_size=1, max_size=2))
def test_raw_bytes_tensors_decode_or_are_refused(buffer: bytes, shape: list[int]) -> None:
    try:
        arr = from_raw("input 'x'", "BYTES", tuple(shape), buffer)
    except InvalidInput:
        return
    assert arr.shape == tuple(shape)
    if math.prod(shape) != 1 or arr.reshape(-1)[0] != buffer:  # a lone element may come unframed
        assert framed(arr.reshape(-1).tolist()) == buffer


# -- image batches ---------------------------------------------------------------------------------------
cv2 = pytest.importorskip("cv2")


def encode(img: np.ndarray, ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, img)
    assert ok
    return buf.tobytes()


@st.composite
def png_batches(draw: st.DrawFn) -> tuple[list[np.ndarray], int]:
    """Random images of one size (dynamic H and W take them as they are), and their channels."""
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    channels = draw(st.sampled_from([1, 3]))
    seeds = draw(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=4))
    shape = (h, w) if channels == 1 else (h, w, 3)
    return [np.random.default_rng(s).integers(0, 256, shape, dtype=np.uint8) for s in seeds], channels


@SLOW
@given(batch=png_batches(), layout=st.sampled_from(["NHWC", "NCHW"]), pooled=st.booleans())
def test_png_batches_decode_to_their_pixels(batch: tuple, layout: str, pooled: bool) -> None:
    pictures, channels = batch
    dims = (Dim(0, -1), Dim(0, -1), Dim(0, -1), Dim(channels, channels))
    if layout == "NCHW":
        dims = (dims[0], dims[3], dims[1], dims[2])
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(_pool()) if pooled else None
        got = images.decode_images("input 'x'", [encode(p, ".png") for p in pictures], dims, layout,
                                   np.dtype(np.float32), pool)
    want = np.stack([p.reshape(p.shape[0], p.shape[1], channels) for p in pictures]).astype(np.float32)
    if layout == "NCHW":
        want = want.transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(got, want)


@contextlib.contextmanager
def _pool() -> Iterator[Any]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        yield pool


GOOD_PNG = encode(np.full((6, 5, 3), 9, np.uint8), ".png")
GOOD_JPEG = encode(np.random.default_rng(1).integers(0, 256, (16, 16, 3), dtype=np.uint8), ".jpg")


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """A real image cut short, with bytes flipped, or random bytes."""
    how = draw(st.sampled_from(["cut", "flip", "random"]))
    if how == "random":
        return draw(st.binary(max_size=64))
    data = bytearray(draw(st.sampled_from([GOOD_PNG, GOOD_JPEG])))
    if how == "cut":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    for _ in range(draw(st.integers(1, 4))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@SLOW
@given(elements=st.lists(st.one_of(damaged(), st.sampled_from([GOOD_PNG, GOOD_JPEG])), min_size=1, max_size=4),
       hw=st.sampled_from([(8, 8), (-1, -1)]), channels=st.sampled_from([1, 3]), pooled=st.booleans())
@example(elements=[b"a"] * 4, hw=(8, 8), channels=3, pooled=True)
@example(elements=[GOOD_PNG, b""], hw=(8, 8), channels=3, pooled=False)
def test_any_batch_decodes_or_is_refused(elements: list[bytes], hw: tuple[int, int], channels: int,
                                         pooled: bool) -> None:
    h, w = (Dim(0, -1), Dim(0, -1)) if hw[0] < 0 else (Dim(hw[0], hw[0]), Dim(hw[1], hw[1]))
    dims = (Dim(0, -1), h, w, Dim(channels, channels))
    try:
        with contextlib.ExitStack() as stack:
            pool = stack.enter_context(_pool()) if pooled else None
            got = images.decode_images("input 'x'", elements, dims, "NHWC", np.dtype(np.uint8), pool)
    except (InvalidInput, PayloadTooLarge):
        return
    assert got.shape[0] == len(elements) and got.shape[3] == channels
    if hw[0] > 0:
        assert got.shape[1:3] == hw


# -- gRPC converters (in a process of their own) -------------------------------------------------------
@pytest.mark.integration
def test_grpc_converters_in_a_process_of_their_own() -> None:
    """The properties below, run by pytest in a child process that never imports tritonclient."""
    if PROTO_CHILD:
        pytest.skip("this is that process")
    env = {**os.environ, "OVSERVE_TEST_OWN_PROTO": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider",
                             "-k", "grpc_pb", "-W", "error::pytest.PytestUnknownMarkWarning"],
                            capture_output=True, text=True, env=env, timeout=280, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1], result.stdout[-2000:]


@st.composite
def pb_requests(draw: st.DrawFn) -> Any:
    """ModelInferRequests from nearly right to anything the message can hold."""
    from ovserve.common.proto import grpc_predict_v2_pb2 as pb

    req = pb.ModelInferRequest(model_name="m", id=draw(st.text(max_size=4)))
    for key in draw(st.lists(st.text(max_size=3), max_size=2)):
        p = req.parameters[key]
        which = draw(st.sampled_from(["bool", "int64", "string", "double", "uint64", "none"]))
        if which == "bool":
            p.bool_param = draw(st.booleans())
        elif which == "int64":
            p.int64_param = draw(st.integers(-(2**63), 2**63 - 1))
        elif which == "string":
            p.string_param = draw(st.text(max_size=4))
        elif which == "double":
            p.double_param = draw(st.floats())
        elif which == "uint64":
            p.uint64_param = draw(st.integers(0, 2**64 - 1))
    raw = draw(st.booleans())
    for _i in range(draw(st.integers(0, 3))):
        t = req.inputs.add(name=draw(st.sampled_from(["x", "y", ""])),
                           datatype=draw(st.one_of(st.sampled_from([*DATATYPES, "BF16"]), st.text(max_size=4))),
                           shape=draw(st.one_of(st.lists(st.integers(-1, 4), max_size=3),
                                                st.lists(st.just(1), min_size=30, max_size=70),
                                                st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3))))
        if raw:
            req.raw_input_contents.append(draw(st.one_of(st.binary(max_size=48),
                                                         st.lists(st.binary(max_size=4), max_size=4).map(framed))))
        else:
            c = t.contents
            field = draw(st.sampled_from(["bool", "int", "int64", "uint", "uint64", "fp32", "fp64", "bytes"]))
            values = {
                "bool": st.booleans(), "int": st.integers(-(2**31), 2**31 - 1),
                "int64": st.integers(-(2**63), 2**63 - 1), "uint": st.integers(0, 2**32 - 1),
                "uint64": st.integers(0, 2**64 - 1), "fp32": st.floats(width=32), "fp64": st.floats(),
                "bytes": st.binary(max_size=4),
            }[field]
            getattr(c, f"{field}_contents").extend(draw(st.lists(values, max_size=8)))
    if draw(st.integers(0, 5)) == 0:  # raw contents that do not match the inputs
        req.raw_input_contents.append(b"\0" * draw(st.integers(0, 8)))
    for name in draw(st.lists(st.sampled_from(["y", "z"]), max_size=2)):
        req.outputs.add(name=name)
    return req


@in_child_only
@FAST
@given(req=pb_requests())
def test_grpc_pb_requests_decode_or_are_refused(req: Any) -> None:
    from ovserve.server.transports.grpc_v2 import converters

    try:
        request = converters.request_from_pb(req)
    except ServerError:
        return
    for t in request.inputs:
        assert t.data.shape == t.shape and len(t.shape) <= MAX_DIMS


@in_child_only
@FAST
@given(inputs=st.lists(tensors(), min_size=1, max_size=3), typed=st.booleans())
def test_grpc_pb_tensors_round_trip(inputs: list, typed: bool) -> None:
    from ovserve.common.proto import grpc_predict_v2_pb2 as pb
    from ovserve.server.transports.grpc_v2 import converters

    typed = typed and all(datatype in converters.CONTENTS_FIELD for datatype, _, _ in inputs)
    req = pb.ModelInferRequest(model_name="m")
    for i, (datatype, shape, values) in enumerate(inputs):
        t = req.inputs.add(name=f"in{i}", datatype=datatype, shape=list(shape))
        if typed:
            field = getattr(t.contents, converters.CONTENTS_FIELD[datatype])
            field.extend([v.encode("utf-8") for v in values] if datatype == "BYTES" else values)
        else:
            req.raw_input_contents.append(raw_of(datatype, shape, values))
    request = converters.request_from_pb(pb.ModelInferRequest.FromString(req.SerializeToString()))
    assert converters.used_typed_contents(req) == typed
    for got, (datatype, shape, values) in zip(request.inputs, inputs, strict=True):
        assert (got.datatype, got.shape) == (datatype, shape)
        assert_tensor(got.data, datatype, shape, values)


@in_child_only
@FAST
@given(tensor=tensors([d for d in DATATYPES if d not in ("FP16", "BF16")]), fortran=st.booleans())
@example(tensor=("FP32", (4,), [float("nan"), -0.0, float("inf"), 1e-45]), fortran=False)
@example(tensor=("FP64", (2, 3), [0.5, 1.0, 2.0, 3.0, 4.0, 5.0]), fortran=True)
def test_grpc_pb_typed_replies_are_the_values_a_python_list_makes(tensor: tuple, fortran: bool) -> None:
    """A typed reply's contents (FP32/FP64/BOOL from the array's bytes, the rest through Python values) serialize
    exactly as the field extended with the array's values one by one, whatever the array's memory order."""
    from ovserve.common.proto import grpc_predict_v2_pb2 as pb
    from ovserve.common.proto.fields import CONTENTS_FIELD, extend_typed

    datatype, shape, values = tensor
    array = expected_array(datatype, shape, values)
    if fortran:
        array = np.asfortranarray(array)
    got, want = pb.InferTensorContents(), pb.InferTensorContents()
    extend_typed(got, datatype, array)
    flat = array.reshape(-1).tolist()
    getattr(want, CONTENTS_FIELD[datatype]).extend(flat)
    assert got.SerializeToString() == want.SerializeToString()
    assert len(getattr(got, CONTENTS_FIELD[datatype])) == len(flat)


@in_child_only
@FAST
@given(fields=st.fixed_dictionaries({}, optional={
    "bool_contents": st.lists(st.booleans(), max_size=5),
    "int_contents": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3),
    "uint64_contents": st.lists(st.integers(0, 2**64 - 1), max_size=3),
    "fp32_contents": st.lists(st.floats(width=32), max_size=300),
    "fp64_contents": st.lists(st.floats(), max_size=5),
    "bytes_contents": st.lists(st.binary(max_size=200), max_size=3)}),
    # fields of numbers this version does not know: a varint, a fixed32, bytes, a fixed64
    unknown=st.sampled_from([b"", b"\x48\x05", b"\x55\x01\x02\x03\x04", b"\x5a\x02ab", b"\x49" + bytes(8)]))
@example(fields={"fp32_contents": [float("nan"), -0.0, 1e-45]}, unknown=b"")
def test_grpc_pb_typed_arrays_are_the_fields_values(fields: dict, unknown: bytes) -> None:
    """``typed_array`` (the packed bytes of FP32/FP64/BOOL read as an array) gives exactly the field's values,
    whatever else the message holds: other fields, large ones, and fields this version does not know."""
    from ovserve.common.proto import grpc_predict_v2_pb2 as pb
    from ovserve.common.proto.fields import CONTENTS_FIELD, typed_array

    contents = pb.InferTensorContents.FromString(pb.InferTensorContents(**fields).SerializeToString() + unknown)
    for datatype, field in CONTENTS_FIELD.items():
        got = typed_array(contents, datatype)
        if datatype not in ("FP32", "FP64", "BOOL"):
            assert got is None
            continue
        want = np.array(list(getattr(contents, field)), dtype=V2_TO_NUMPY[datatype])
        assert got is not None and got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()  # NaN and -0.0 too
