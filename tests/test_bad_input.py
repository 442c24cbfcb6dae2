"""Every bad input gets a clear error, the right status, and the server keeps serving.

Each case sends one malformed or unfitting request the way a user would (raw
HTTP with ``requests``, raw gRPC through tritonclient's own stubs, or the stock
tritonclient clients), checks the status (REST 400/404/405/413/503 with an
``{"error": "..."}`` body; gRPC INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE,
RESOURCE_EXHAUSTED) and that the message names the offending tensor or field,
and then proves that a normal inference still succeeds on both transports,
with no unexpected error in the server's log.
"""
from __future__ import annotations

import http.client
import json
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from . import models
from .inflight import Uploads
from .servers import EXACT, ComponentProcess, ServerProcess

TIMEOUT = 10  # seconds, for every single request

#: The good request of every "still serving" check: add (y = x + 1), FP32 [1,16].
X = (np.arange(16, dtype=np.float32) / 4 - 1.5).reshape(1, 16)
X_RAW = X.tobytes()
#: A well-formed JSON input for ``add``.
GOOD = {"name": "x", "datatype": "FP32", "shape": [1, 16], "data": X.ravel().tolist()}
GOOD_HEADER = {"name": "x", "datatype": "FP32", "shape": [1, 16]}
FOUR = [0.0, 1.0, 2.0, 3.0]
TWO = [{"name": n, "datatype": "FP32", "shape": [1, 4], "data": FOUR} for n in ("a", "b")]


# -- checks ------------------------------------------------------------------
def _needles(needle: str | tuple[str, ...]) -> tuple[str, ...]:
    return (needle,) if isinstance(needle, str) else needle


def assert_rest_error(resp: requests.Response, status: int, needle: str | tuple[str, ...]) -> str:
    """The status, a JSON ``{"error": msg}`` body, and every needle in msg."""
    assert resp.status_code == status, f"expected {status}, got {resp.status_code}: {resp.text[:500]}"
    assert resp.headers.get("content-type", "").startswith("application/json"), resp.headers
    body = resp.json()
    assert isinstance(body, dict) and list(body) == ["error"], body
    message = body["error"]
    assert isinstance(message, str) and message
    for n in _needles(needle):
        assert n in message, f"{n!r} not in error {message!r}"
    return message


def assert_grpc_error(err: grpc.RpcError, code: grpc.StatusCode, needle: str | tuple[str, ...]) -> str:
    message = err.details() or ""
    assert err.code() == code, f"expected {code.name}, got {err.code().name}: {message}"
    for n in _needles(needle):
        assert n in message, f"{n!r} not in error {message!r}"
    return message


def rest_infer_ok(url: str) -> None:
    resp = requests.post(f"{url}/v2/models/add/infer", json={"inputs": [GOOD]}, timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    (out,) = resp.json()["outputs"]
    assert out["name"] == "y" and out["shape"] == [1, 16]
    np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(1, 16), X + 1, rtol=1e-6)


def grpc_infer_ok(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    resp = stub.ModelInfer(infer_request("add", [tensor()], [X_RAW]), timeout=TIMEOUT)
    assert [o.name for o in resp.outputs] == ["y"] and list(resp.outputs[0].shape) == [1, 16]
    y = np.frombuffer(resp.raw_output_contents[0], dtype="<f4").reshape(1, 16)
    np.testing.assert_allclose(y, X + 1, rtol=1e-6)


def assert_still_serving(server: ServerProcess, stub: pb_grpc.GRPCInferenceServiceStub, mark: int = 0) -> None:
    """Alive, a good inference on both transports, no unexpected error logged since ``mark``."""
    assert server.proc.poll() is None, f"server exited:\n{server.log}"
    rest_infer_ok(server.url)
    grpc_infer_ok(stub)
    logged = "\n".join(server.lines[mark:])
    assert "Traceback" not in logged and "unexpected error" not in logged, logged


# -- request builders ----------------------------------------------------------
def tensor(name: str = "x", datatype: str = "FP32", shape: tuple[int, ...] = (1, 16),
           **contents: list) -> pb.ModelInferRequest.InferInputTensor:
    t = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=list(shape))
    for field, values in contents.items():
        getattr(t.contents, field).extend(values)
    return t


def infer_request(model: str = "add", inputs: list = (), raw: list[bytes] = (), outputs: list[str] = (),
                  version: str = "") -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model, model_version=version)
    req.inputs.extend(inputs)
    req.raw_input_contents.extend(raw)
    for name in outputs:
        req.outputs.add(name=name)
    return req


def binary_body(header: dict, payload: bytes, length: int | str | None = None) -> tuple[bytes, dict[str, str]]:
    """A binary-extension body: JSON header, then the tensor bytes."""
    head = json.dumps(header).encode()
    return head + payload, {"Inference-Header-Content-Length": str(len(head) if length is None else length)}


def framed(*elements: bytes) -> bytes:
    """BYTES raw form: each element prefixed by its 4-byte little-endian length."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def with_x(**changes: Any) -> dict:
    return {**GOOD, **changes}


def without(key: str) -> dict:
    return {k: v for k, v in GOOD.items() if k != key}


# -- fixtures ------------------------------------------------------------------
@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(server.grpc_target)
    try:
        yield pb_grpc.GRPCInferenceServiceStub(channel)
    finally:
        channel.close()


# -- REST: KServe V2 infer -----------------------------------------------------
INFER = "/v2/models/add/infer"

#: (path, JSON document or raw bytes, extra headers, status, needles in the message)
REST_CASES = [
    # model and version
    pytest.param("/v2/models/nope/infer", {"inputs": [GOOD]}, {}, 404, "'nope'", id="unknown-model"),
    pytest.param("/v2/models/add/versions/9/infer", {"inputs": [GOOD]}, {}, 404, ("'add'", "version 9"),
                 id="unknown-version"),
    pytest.param("/v2/models/add/versions/abc/infer", {"inputs": [GOOD]}, {}, 400, ("version", "'abc'"),
                 id="version-not-an-integer"),
    pytest.param("/v2/models/add/versions/1.0/infer", {"inputs": [GOOD]}, {}, 400, ("version", "'1.0'"),
                 id="version-float"),
    pytest.param("/v2/models/add/versions/0/infer", {"inputs": [GOOD]}, {}, 400, ("version", "'0'"),
                 id="version-zero"),
    pytest.param("/v2/models/add/versions/-1/infer", {"inputs": [GOOD]}, {}, 400, ("version", "'-1'"),
                 id="version-negative"),
    # input names and count
    pytest.param(INFER, {"inputs": [with_x(name="z")]}, {}, 400, ("'z'", "'x'"), id="wrong-input-name"),
    pytest.param("/v2/models/two/infer", {"inputs": TWO[:1]}, {}, 400, "'b'", id="missing-input"),
    pytest.param(INFER, {"inputs": [GOOD, with_x(name="z")]}, {}, 400, "'z'", id="extra-input"),
    pytest.param(INFER, {"inputs": [GOOD, GOOD]}, {}, 400, ("'x'", "more than once"), id="duplicate-input"),
    pytest.param(INFER, {"inputs": []}, {}, 400, "'inputs'", id="empty-inputs"),
    pytest.param(INFER, {"id": "1"}, {}, 400, "'inputs'", id="no-inputs"),
    pytest.param(INFER, {"inputs": GOOD}, {}, 400, "'inputs'", id="inputs-not-a-list"),
    pytest.param(INFER, {"inputs": [5]}, {}, 400, "inputs[0]", id="input-not-an-object"),
    pytest.param(INFER, {"inputs": [without("name")]}, {}, 400, ("inputs[0]", "'name'"), id="input-without-name"),
    pytest.param(INFER, {"inputs": [with_x(name="")]}, {}, 400, ("inputs[0]", "'name'"), id="input-empty-name"),
    pytest.param(INFER, {"inputs": [without("datatype")]}, {}, 400, ("'x'", "'datatype'"), id="no-datatype"),
    pytest.param(INFER, {"inputs": [without("shape")]}, {}, 400, ("'x'", "'shape'"), id="no-shape"),
    pytest.param(INFER, {"inputs": [without("data")]}, {}, 400, ("'x'", "'data'"), id="no-data"),
    # shape
    pytest.param(INFER, {"inputs": [with_x(shape=[16])]}, {}, 400, ("'x'", "[16]"), id="wrong-rank"),
    pytest.param(INFER, {"inputs": [with_x(shape=[2, 8])]}, {}, 400, ("'x'", "[2, 8]"), id="wrong-dim"),
    pytest.param("/v2/models/fixed/infer",
                 {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": FOUR * 2}]}, {}, 400,
                 ("'x'", "[2, 4]"), id="static-model-wrong-batch"),
    pytest.param(INFER, {"inputs": [with_x(shape=[-1, 16])]}, {}, 400, ("'x'", "negative"), id="negative-dim"),
    pytest.param(INFER, {"inputs": [with_x(shape=[1, 1.5])]}, {}, 400, ("'x'", "shape"), id="fractional-dim"),
    pytest.param(INFER, {"inputs": [with_x(shape=["1", 16])]}, {}, 400, ("'x'", "shape"), id="string-dim"),
    pytest.param(INFER, {"inputs": [with_x(shape=[True, 16])]}, {}, 400, ("'x'", "shape"), id="bool-dim"),
    pytest.param(INFER, {"inputs": [with_x(shape="1,16")]}, {}, 400, ("'x'", "'shape'"), id="shape-not-a-list"),
    pytest.param(INFER, {"inputs": [with_x(shape=[1 << 31, 1 << 31])]}, {}, 400, ("'x'", "too many elements"),
                 id="huge-shape"),
    pytest.param(INFER, {"inputs": [with_x(shape=[1, (1 << 64) + 1])]}, {}, 400, ("'x'", "too many elements"),
                 id="huge-shape-beyond-int64"),
    pytest.param(INFER, {"inputs": [with_x(shape=[1 << 20, 1 << 16])]}, {}, 400, ("'x'", "got 16"),
                 id="large-shape-little-data"),
    # numpy holds no more than 64 dimensions (1.x: 32), OpenVINO's CPU plugin compiles no more than 32
    pytest.param(INFER, {"inputs": [with_x(shape=[1] * 65, data=[0.0])]}, {}, 400,
                 ("'x'", "65 dimensions", "at most 32"), id="65-dims"),
    pytest.param(INFER, {"inputs": [with_x(shape=[1] * 33, data=[0.0])]}, {}, 400,
                 ("'x'", "33 dimensions", "at most 32"), id="33-dims"),
    pytest.param(INFER, *binary_body({"inputs": [{**GOOD_HEADER, "shape": [1] * 65}]}, X_RAW[:4]), 400,
                 ("'x'", "65 dimensions", "at most 32"), id="bin-65-dims"),
    # datatype and values
    pytest.param(INFER, {"inputs": [with_x(datatype="INT32", data=[0] * 16)]}, {}, 400, ("'x'", "INT32", "FP32"),
                 id="wrong-datatype"),
    pytest.param(INFER, {"inputs": [with_x(datatype="FLOAT")]}, {}, 400, ("'x'", "'FLOAT'"),
                 id="unknown-datatype"),
    pytest.param(INFER, {"inputs": [with_x(datatype="BF16")]}, {}, 400, ("'x'", "BF16"), id="bf16"),
    pytest.param(INFER, {"inputs": [with_x(data=GOOD["data"][:15])]}, {}, 400, ("'x'", "16", "15"),
                 id="too-few-values"),
    pytest.param(INFER, {"inputs": [with_x(data=[[0.0] * 8, [0.0] * 7])]}, {}, 400, "'x'", id="ragged-values"),
    pytest.param(INFER, {"inputs": [with_x(data=["a"] * 16)]}, {}, 400, ("'x'", "FP32"), id="strings-for-fp32"),
    pytest.param(INFER, {"inputs": [with_x(data=["1.5"] * 16)]}, {}, 400, ("'x'", "FP32"),
                 id="numeric-strings-for-fp32"),
    pytest.param(INFER, {"inputs": [with_x(data=[True] * 16)]}, {}, 400, ("'x'", "FP32"), id="bools-for-fp32"),
    pytest.param(INFER, {"inputs": [with_x(data={"v": 1})]}, {}, 400, ("'x'", "FP32"), id="object-for-data"),
    # JSON null is no number: numpy would compute it as NaN (and answer null again)
    pytest.param(INFER, {"inputs": [with_x(data=[None, *GOOD["data"][1:]])]}, {}, 400,
                 ("'x'", "FP32", "null is not a number"), id="null-in-data"),
    pytest.param(INFER, {"inputs": [with_x(data=[[None, *GOOD["data"][1:]]])]}, {}, 400,
                 ("'x'", "FP32", "null is not a number"), id="null-in-nested-data"),
    pytest.param(INFER, {"inputs": [with_x(shape=[4096, 16], data=[[0.5] * 16] * 4095 + [[None] * 16])]}, {}, 400,
                 ("'x'", "FP32", "null is not a number"), id="null-in-data-of-a-large-body"),
    pytest.param(INFER, {"inputs": [with_x(shape=[4096, 16], data=[0.5] * 65535 + [None])]}, {}, 400,
                 ("'x'", "FP32", "null is not a number"), id="null-in-flat-data-of-a-large-body"),
    pytest.param("/v2/models/dt_int32/infer",
                 {"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 4], "data": [None, 1, 2, 3]}]}, {}, 400,
                 ("'x'", "INT32", "null is not an integer"), id="null-for-int32"),
    pytest.param("/v2/models/dt_bool/infer",
                 {"inputs": [{"name": "x", "datatype": "BOOL", "shape": [1, 4], "data": [True, None, False, True]}]},
                 {}, 400, ("'x'", "BOOL", "null"), id="null-for-bool"),
    pytest.param("/v2/models/dt_bytes/infer",
                 {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 4], "data": [None, "a", "b", "c"]}]},
                 {}, 400, ("'x'", "BYTES", "null is not a string"), id="null-for-bytes"),
    pytest.param("/v2/models/dt_bytes/infer",
                 {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 4], "data": [1, True, "a", "b"]}]},
                 {}, 400, ("'x'", "BYTES", "is not a string"), id="numbers-for-bytes"),
    pytest.param(INFER, {"inputs": [with_x(data=[True, *GOOD["data"][1:]])]}, {}, 400,
                 ("'x'", "FP32", "true/false is not a number"), id="a-bool-among-numbers"),
    pytest.param(INFER, {"inputs": [with_x(data=["NaN"] * 16)]}, {}, 400, ("'x'", "FP32", "a string"),
                 id="nan-string-for-fp32"),
    pytest.param(INFER, {"inputs": [with_x(data=[1e39, *GOOD["data"][1:]])]}, {}, 400,
                 ("'x'", "FP32", "1e+39 is out of range"), id="fp32-overflow"),
    pytest.param(INFER, b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [NaN'
                 + b", 1" * 15 + b"]}]}", {}, 400, "not valid JSON", id="nan-literal-in-data"),
    pytest.param(INFER, b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [Infinity'
                 + b", 1" * 15 + b"]}]}", {}, 400, "not valid JSON", id="infinity-literal-in-data"),
    pytest.param(INFER, b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [4096, 16], "data": [NaN'
                 + b", 1" * 65535 + b"]}]}", {}, 400, "not valid JSON", id="nan-literal-in-a-large-body"),
    pytest.param("/v2/models/dt_int8/infer",
                 {"inputs": [{"name": "x", "datatype": "INT8", "shape": [1, 4], "data": [1, 2, 3, 1.5]}]}, {}, 400,
                 ("'x'", "INT8"), id="fraction-for-int8"),
    pytest.param("/v2/models/dt_int8/infer",
                 {"inputs": [{"name": "x", "datatype": "INT8", "shape": [1, 4], "data": [1, 2, 3, 300]}]}, {}, 400,
                 ("'x'", "300"), id="int8-out-of-range"),
    pytest.param("/v2/models/dt_uint8/infer",
                 {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1, 4], "data": [1, 2, 3, -1]}]}, {}, 400,
                 ("'x'", "-1"), id="uint8-negative"),
    pytest.param("/v2/models/dt_int64/infer",
                 {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1, 4], "data": [1, 2, 3, 1 << 70]}]}, {},
                 400, ("'x'", "INT64"), id="int64-out-of-range"),
    pytest.param("/v2/models/dt_bool/infer",
                 {"inputs": [{"name": "x", "datatype": "BOOL", "shape": [1, 4], "data": [1, 0, 1, 0]}]}, {}, 400,
                 ("'x'", "BOOL"), id="numbers-for-bool"),
    # requested outputs, id, parameters
    pytest.param(INFER, {"inputs": [GOOD], "outputs": [{"name": "nope"}]}, {}, 400, ("'nope'", "'y'"),
                 id="unknown-output"),
    pytest.param(INFER, {"inputs": [GOOD], "outputs": {"name": "y"}}, {}, 400, "'outputs'", id="outputs-not-a-list"),
    pytest.param(INFER, {"inputs": [GOOD], "outputs": ["y"]}, {}, 400, ("outputs[0]", "'name'"),
                 id="output-not-an-object"),
    pytest.param(INFER, {"inputs": [GOOD], "id": 7}, {}, 400, "'id'", id="id-not-a-string"),
    pytest.param(INFER, {"inputs": [GOOD], "parameters": [1]}, {}, 400, "parameters", id="parameters-not-an-object"),
    pytest.param(INFER, {"inputs": [with_x(parameters=[1])]}, {}, 400, ("'x'", "parameters"),
                 id="input-parameters-not-an-object"),
    # the body itself
    pytest.param(INFER, b'{"inputs": [', {}, 400, "not valid JSON", id="malformed-json"),
    pytest.param(INFER, b"", {}, 400, "empty", id="empty-body"),
    pytest.param(INFER, b"   ", {}, 400, "JSON", id="blank-body"),
    pytest.param(INFER, b"[]", {}, 400, "JSON object", id="json-array"),
    pytest.param(INFER, b"null", {}, 400, "JSON object", id="json-null"),
    pytest.param(INFER, b'"inputs"', {}, 400, "JSON object", id="json-string"),
    pytest.param(INFER, b'{"inputs": [NaN]}', {}, 400, "not valid JSON", id="json-nan"),
    pytest.param(INFER, json.dumps({"inputs": [GOOD]}).encode("utf-16"), {}, 400, "not valid JSON",
                 id="not-utf8"),
    # binary tensor data extension
    pytest.param(INFER, *binary_body({"inputs": [GOOD_HEADER]}, X_RAW, 10**6), 400,
                 ("Inference-Header-Content-Length", "larger than the body"), id="bin-header-longer-than-body"),
    pytest.param(INFER, *binary_body({"inputs": [GOOD_HEADER]}, X_RAW, "abc"), 400,
                 ("Inference-Header-Content-Length", "'abc'"), id="bin-header-length-not-a-number"),
    pytest.param(INFER, *binary_body({"inputs": [GOOD_HEADER]}, X_RAW, -5), 400,
                 ("Inference-Header-Content-Length", "'-5'"), id="bin-header-length-negative"),
    pytest.param(INFER, *binary_body({"inputs": [GOOD_HEADER]}, X_RAW, 12), 400,
                 ("inference header", "not valid JSON"), id="bin-header-cut-short"),
    pytest.param(INFER, *binary_body({"inputs": [{**GOOD, "parameters": {"binary_data_size": 64}}]}, X_RAW), 400,
                 ("'x'", "'data'", "binary_data_size"), id="bin-both-data-and-size"),
    pytest.param(INFER, *binary_body({"inputs": [{**GOOD_HEADER, "parameters": {"binary_data_size": 128}}]}, X_RAW),
                 400, ("'x'", "binary_data_size 128", "past the end"), id="bin-size-past-end"),
    pytest.param(INFER, *binary_body({"inputs": [{**GOOD_HEADER, "parameters": {"binary_data_size": 64}}]},
                                     X_RAW + b"abc"), 400, ("3 bytes", "not claimed"), id="bin-trailing-bytes"),
    pytest.param(INFER, *binary_body({"inputs": [{**GOOD_HEADER, "parameters": {"binary_data_size": 60}}]},
                                     X_RAW[:60]), 400, ("'x'", "64 bytes", "got 60"), id="bin-size-not-matching-shape"),
    pytest.param(INFER, *binary_body({"inputs": [{**GOOD_HEADER, "parameters": {"binary_data_size": -64}}]}, X_RAW),
                 400, ("'x'", "binary_data_size"), id="bin-size-negative"),
    pytest.param(INFER, *binary_body({"inputs": [{**GOOD_HEADER, "parameters": {"binary_data_size": "64"}}]},
                                     X_RAW), 400, ("'x'", "binary_data_size"), id="bin-size-not-an-integer"),
    pytest.param(INFER, *binary_body({"inputs": [GOOD_HEADER]}, X_RAW[:10]), 400, ("'x'", "64 bytes", "got 10"),
                 id="bin-single-input-wrong-length"),
    pytest.param("/v2/models/two/infer",
                 *binary_body({"inputs": [{k: v for k, v in t.items() if k != "data"} for t in TWO]},
                              np.zeros(8, np.float32).tobytes()), 400, ("'a'", "binary_data_size"),
                 id="bin-two-inputs-without-sizes"),
    pytest.param("/v2/models/two/infer",
                 *binary_body({"inputs": [{**TWO[0], "data": None, "parameters": {"binary_data_size": 16}}]}, b""),
                 400, ("'a'", "binary_data_size"), id="bin-size-and-null-data"),
    pytest.param("/v2/models/two/infer",
                 *binary_body({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 4],
                                           "parameters": {"binary_data_size": 16}},
                                          {"name": "b", "datatype": "FP32", "shape": [1, 4],
                                           "parameters": {"binary_data_size": 20}}]},
                              np.zeros(8, np.float32).tobytes()), 400, ("'b'", "past the end"),
                 id="bin-second-input-past-end"),
    pytest.param("/v2/models/dt_bytes/infer",
                 *binary_body({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 4]}]},
                              struct.pack("<I", 5) + b"ab"), 400, ("'x'", "BYTES element 0", "5 bytes"),
                 id="bin-bytes-element-runs-past-end"),
    pytest.param("/v2/models/dt_bytes/infer",
                 *binary_body({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 4]}]}, framed(b"a", b"b")),
                 400, ("'x'", "4 BYTES elements", "got 2"), id="bin-bytes-too-few-elements"),
    pytest.param("/v2/models/dt_bytes/infer",
                 *binary_body({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 4]}]}, b"\x01\x00"),
                 400, ("'x'", "truncated"), id="bin-bytes-truncated-length"),
    pytest.param("/v2/models/two/infer", np.zeros(8, np.float32).tobytes(),
                 {"Inference-Header-Content-Length": "0"}, 400, ("'two'", "2 inputs"),
                 id="bin-headerless-two-inputs"),
    pytest.param(INFER, X_RAW[:10], {"Inference-Header-Content-Length": "0"}, 400, ("'x'", "10 bytes"),
                 id="bin-headerless-wrong-length"),
]


def _send(url: str, path: str, body: dict | bytes, headers: dict[str, str]) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    # No Content-Type header, as tritonclient sends: the server must not need one.
    return requests.post(url + path, data=data, headers=headers, timeout=TIMEOUT)


@pytest.mark.parametrize("path,body,headers,status,needle", REST_CASES)
def test_rest_v2_infer_bad_input(server, stub, path, body, headers, status, needle) -> None:
    mark = len(server.lines)
    assert_rest_error(_send(server.url, path, body, headers), status, needle)
    assert_still_serving(server, stub, mark)


# -- REST: V1, routes, metadata -------------------------------------------------
#: (method, path, body or None, status, needles)
REST_OTHER_CASES = [
    # KServe V1 :predict
    pytest.param("POST", "/v1/models/add:predict", b"garbage", 400, "not valid JSON", id="v1-garbage"),
    pytest.param("POST", "/v1/models/add:predict", b"", 400, "empty", id="v1-empty-body"),
    pytest.param("POST", "/v1/models/add:predict", b"[1, 2]", 400, "JSON object", id="v1-json-array"),
    pytest.param("POST", "/v1/models/add:predict", {"rows": [[0] * 16]}, 400, ("'instances'", "'inputs'"),
                 id="v1-neither-instances-nor-inputs"),
    pytest.param("POST", "/v1/models/add:predict", {"instances": [[0] * 16], "inputs": [[0] * 16]}, 400,
                 ("'instances'", "'inputs'"), id="v1-both-instances-and-inputs"),
    pytest.param("POST", "/v1/models/add:predict", {"instances": []}, 400, "'instances'", id="v1-no-instances"),
    pytest.param("POST", "/v1/models/add:predict", {"instances": "x"}, 400, "'instances'",
                 id="v1-instances-not-a-list"),
    pytest.param("POST", "/v1/models/nope:predict", {"instances": [[0] * 16]}, 404, "'nope'",
                 id="v1-unknown-model"),
    pytest.param("POST", "/v1/models/add:predict", {"instances": [[0] * 3]}, 400, ("'x'", "[1, 3]"),
                 id="v1-wrong-shape"),
    pytest.param("POST", "/v1/models/add:predict", {"instances": [[0] * 16, [0] * 3]}, 400, "'x'",
                 id="v1-ragged-instances"),
    pytest.param("POST", "/v1/models/add:predict", {"instances": [["a"] * 16]}, 400, ("'x'", "FP32"),
                 id="v1-strings-for-fp32"),
    pytest.param("POST", "/v1/models/add:predict", {"instances": [[None] + [0] * 15]}, 400,
                 ("'x'", "null is not a number"), id="v1-null-in-instances"),
    pytest.param("POST", "/v1/models/add:predict", {"instances": [{"x": [0] * 15 + [None]}]}, 400,
                 ("'x'", "null is not a number"), id="v1-null-in-named-instances"),
    pytest.param("POST", "/v1/models/add:predict", {"inputs": [[None] + [0] * 15]}, 400,
                 ("'x'", "null is not a number"), id="v1-null-in-columnar-inputs"),
    pytest.param("POST", "/v1/models/add:predict", {"inputs": {"x": [[0.5] * 16] * 4095 + [[None] * 16]}}, 400,
                 ("'x'", "null is not a number"), id="v1-null-in-a-large-body"),
    pytest.param("POST", "/v1/models/add:predict", {"instances": [[True] + [0] * 15]}, 400,
                 ("'x'", "true/false is not a number"), id="v1-a-bool-among-numbers"),
    pytest.param("POST", "/v1/models/dt_int8:predict", {"instances": [[1.5, 2, 3, 4]]}, 400, ("'x'", "INT8"),
                 id="v1-fraction-for-int8"),
    pytest.param("POST", "/v1/models/dt_int8:predict", {"instances": [[300, 2, 3, 4]]}, 400, ("'x'", "300"),
                 id="v1-int8-out-of-range"),
    pytest.param("POST", "/v1/models/add:predict", {"instances": [{"z": [0] * 16}]}, 400, "'z'",
                 id="v1-unknown-input"),
    pytest.param("POST", "/v1/models/two:predict", {"instances": [FOUR]}, 400, ("'a'", "'b'"),
                 id="v1-unnamed-instances-for-two-inputs"),
    pytest.param("POST", "/v1/models/two:predict", {"instances": [{"a": FOUR}]}, 400, "'b'",
                 id="v1-missing-input"),
    pytest.param("POST", "/v1/models/two:predict", {"instances": [{"a": FOUR, "b": FOUR}, {"a": FOUR}]}, 400, "'b'",
                 id="v1-field-missing-from-some-instances"),
    pytest.param("POST", "/v1/models/two:predict", {"inputs": [FOUR]}, 400, ("'a'", "'b'"),
                 id="v1-columnar-inputs-not-named"),
    # unknown routes and wrong methods
    pytest.param("GET", "/v2/nothing", None, 404, "/v2/nothing", id="unknown-route"),
    pytest.param("POST", "/v3/models/add/infer", {"inputs": [GOOD]}, 404, "/v3/models/add/infer",
                 id="unknown-route-post"),
    pytest.param("POST", "/v2/models/add/predict", {"inputs": [GOOD]}, 404, "/v2/models/add/predict",
                 id="unknown-verb"),
    pytest.param("GET", INFER, None, 405, ("GET", INFER), id="get-on-infer"),
    pytest.param("PUT", "/v2/models/add", None, 405, ("PUT", "/v2/models/add"), id="put-on-metadata"),
    pytest.param("DELETE", "/v2/health/ready", None, 405, ("DELETE", "/v2/health/ready"), id="delete-on-ready"),
    # metadata and readiness of what does not exist
    pytest.param("GET", "/v2/models/nope", None, 404, "'nope'", id="metadata-unknown-model"),
    pytest.param("GET", "/v2/models/add/versions/9", None, 404, ("'add'", "version 9"),
                 id="metadata-unknown-version"),
    pytest.param("GET", "/v2/models/add/versions/v1", None, 400, ("version", "'v1'"),
                 id="metadata-version-not-an-integer"),
    pytest.param("GET", "/v2/models/nope/ready", None, 404, "'nope'", id="ready-unknown-model"),
    pytest.param("GET", "/v2/models/add/versions/abc/ready", None, 400, ("version", "'abc'"),
                 id="ready-version-not-an-integer"),
    pytest.param("GET", "/v2/models/nope/stats", None, 404, "'nope'", id="statistics-unknown-model"),
    pytest.param("GET", "/v2/models/add/versions/9/stats", None, 404, ("'add'", "'9'"),
                 id="statistics-unknown-version"),
    pytest.param("GET", "/v1/models/nope", None, 404, "'nope'", id="v1-status-unknown-model"),
    pytest.param("POST", "/v2/repository/index", b"{oops", 400, "not valid JSON", id="repository-index-garbage"),
    pytest.param("POST", "/v2/repository/models/nope/load", None, 404, "'nope'", id="repository-load-unknown"),
    pytest.param("POST", "/v2/repository/models/nope/unload", None, 404, "'nope'", id="repository-unload-unknown"),
]


@pytest.mark.parametrize("method,path,body,status,needle", REST_OTHER_CASES)
def test_rest_bad_request(server, stub, method, path, body, status, needle) -> None:
    mark = len(server.lines)
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = requests.request(method, server.url + path, data=data, timeout=TIMEOUT)
    assert_rest_error(resp, status, needle)
    assert_still_serving(server, stub, mark)


@pytest.mark.parametrize("headers", [{}, {"Content-Type": "application/json"}, {"Content-Type": "text/plain"}],
                         ids=["no-content-type", "json", "text-plain"])
def test_json_accepted_whatever_the_content_type(server, headers) -> None:
    req = requests.Request("POST", server.url + INFER, data=json.dumps({"inputs": [GOOD]}).encode(),
                           headers=headers).prepare()
    assert req.headers.get("Content-Type") == headers.get("Content-Type")
    with requests.Session() as session:
        resp = session.send(req, timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    np.testing.assert_allclose(np.asarray(resp.json()["outputs"][0]["data"]).reshape(1, 16), X + 1, rtol=1e-6)


def test_default_limit_is_one_gib(server, stub) -> None:
    """A declared body one byte over 1 GiB is refused before a byte of it is read."""
    mark = len(server.lines)
    conn = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=TIMEOUT)
    try:
        conn.putrequest("POST", INFER)
        conn.putheader("Content-Length", str((1 << 30) + 1))
        conn.endheaders()
        resp = conn.getresponse()
        status, body = resp.status, json.loads(resp.read())
    finally:
        conn.close()
    assert status == 413, body
    assert str(1 << 30) in body["error"] and str((1 << 30) + 1) in body["error"], body
    assert_still_serving(server, stub, mark)


#: (path, request head after the request line, the part of the body sent before hanging up)
HANG_UPS = [
    pytest.param(INFER, "Content-Length: 100000\r\n", b'{"inputs": [' + b" " * 5000, id="v2-json"),
    pytest.param(INFER, "Content-Length: 100000\r\nInference-Header-Content-Length: 60\r\n",
                 json.dumps({"inputs": [GOOD_HEADER]}).encode() + X_RAW[:20], id="v2-binary"),
    pytest.param(INFER, "Transfer-Encoding: chunked\r\n", b"1000\r\n" + b" " * 2000, id="v2-chunked"),
    pytest.param("/v1/models/add:predict", "Content-Length: 100000\r\n", b'{"instances": [' + b"0, " * 900,
                 id="v1"),
    pytest.param("/v2/repository/index", "Content-Length: 100000\r\n", b"{", id="repository-index"),
]


@pytest.mark.parametrize("path,head,sent", HANG_UPS)
def test_a_client_hanging_up_mid_upload_is_one_info_line(server, stub, path: str, head: str, sent: bytes) -> None:
    """A client that goes away before its body is read is no error of the server's."""
    mark = len(server.lines)
    uploads = Uploads(server.rest_port)
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=TIMEOUT) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: test\r\n{head}\r\n".encode() + sent)
        uploads.wait()  # sendall returned: once the server has read it all, it waits for the rest of the body
    server.wait_log(r"INFO .*client went away during POST " + re.escape(path))
    assert_still_serving(server, stub, mark)
    logged = server.lines[mark:]
    assert len([line for line in logged if "client went away" in line]) == 1, logged
    assert not [line for line in logged if " ERROR " in line or " WARNING " in line], logged


# -- REST: the request head is capped (--max-header-bytes) ------------------------
def peak_rss_since_reset(pid: int) -> Callable[[], int]:
    """Reset the process's peak RSS (VmHWM); the returned function reads its growth since, in bytes."""
    status = Path(f"/proc/{pid}/status")

    def field(name: str) -> int:
        line = next(ln for ln in status.read_text().splitlines() if ln.startswith(name + ":"))
        return int(line.split()[1]) * 1024

    Path(f"/proc/{pid}/clear_refs").write_text("5")  # Linux: VmHWM := current RSS
    start = field("VmRSS")
    return lambda: field("VmHWM") - start


def send_head(port: int, head: bytes, pieces: int = 1) -> bytes:
    """Send a request head (in ``pieces``, as it may be) and return the answer's first bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        step = -(-len(head) // pieces)
        try:
            for i in range(0, len(head), step):
                sock.sendall(head[i:i + step])
        except OSError:  # the server stopped reading and closed: what it answered is still readable
            pass
        return sock.recv(4096)


def test_a_32_mib_header_is_refused_at_once_with_little_memory(server, stub) -> None:
    """httptools has no limit of its own: the head of a request was read to the end and answered 200."""
    mark = len(server.lines)
    growth = peak_rss_since_reset(server.proc.pid)
    served: list[int] = []
    stop = threading.Event()

    def others() -> None:  # a normal client, served all along
        while not stop.is_set():
            rest_infer_ok(server.url)
            served.append(1)

    helper = threading.Thread(target=others)
    helper.start()
    try:
        with socket.create_connection(("127.0.0.1", server.rest_port), timeout=TIMEOUT) as sock:
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\nX-Big: ")
            sent, chunk = 0, b"a" * (1 << 20)
            try:
                while sent < 32 << 20:
                    sock.sendall(chunk)
                    sent += len(chunk)
            except OSError:  # refused and closed long before the end
                pass
            answer = sock.recv(4096)
        assert sent < 32 << 20, "the server read a 32 MiB header to its end"
        while len(served) < 3:
            time.sleep(0.01)
    finally:
        stop.set()
        helper.join()
    assert answer.startswith(b"HTTP/1.1 431 "), answer
    assert b"65536 bytes" in answer and b"--max-header-bytes" in answer, answer
    assert growth() < 16 << 20, f"peak RSS grew {growth() / 2**20:.1f} MiB"
    assert_still_serving(server, stub, mark)


def test_the_header_cap_is_a_flag_and_counts_only_the_head(start_server, demo_repo) -> None:
    srv = start_server("--model-repository", demo_repo, "--poll-interval", "0", "--max-header-bytes", "4096", *EXACT)
    url = srv.url
    assert requests.get(url + "/v2/health/ready", headers={"X-Pad": "a" * 3000}, timeout=TIMEOUT).status_code == 200
    resp = requests.get(url + "/v2/health/ready", headers={"X-Pad": "a" * 5000}, timeout=TIMEOUT)
    assert_rest_error(resp, 431, ("4096 bytes", "--max-header-bytes"))
    # a head trickling in, many headers of 100 bytes: the bytes add up across reads
    head = b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\n" + b"".join(
        f"X-{i}: {'b' * 90}\r\n".encode() for i in range(60)) + b"\r\n"
    assert send_head(srv.rest_port, head, pieces=60).startswith(b"HTTP/1.1 431 ")
    # so does a long URL
    assert send_head(srv.rest_port, b"GET /v2/" + b"x" * 5000 + b" HTTP/1.1\r\nHost: t\r\n\r\n").startswith(
        b"HTTP/1.1 431 ")
    # a body is no head: a body larger than the cap, then another request on the same connection
    with requests.Session() as session:
        for _ in range(2):
            body = json.dumps({"inputs": [GOOD]}).encode() + b" " * 20000
            assert session.post(url + INFER, data=body, timeout=TIMEOUT).status_code == 200
            assert session.get(url + "/v2/health/ready", headers={"X-Pad": "a" * 3000},
                               timeout=TIMEOUT).status_code == 200
    # two requests in one write, the first with a body larger than the cap
    body = json.dumps({"inputs": [GOOD]}).encode() + b" " * 20000
    with socket.create_connection(("127.0.0.1", srv.rest_port), timeout=TIMEOUT) as sock:
        sock.sendall(f"POST {INFER} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
                     + b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"a" * 3000 + b"\r\n\r\n")
        answers = b""
        while answers.count(b"HTTP/1.1 200 OK") < 2:
            chunk = sock.recv(65536)
            assert chunk, answers
            answers += chunk
    rest_infer_ok(url)


@pytest.mark.parametrize("command", [
    ["explainer", "--model_name", "m", "--predictor_host", "127.0.0.1:1", "--http_port", "0", "--host", "127.0.0.1"],
    ["transformer", "--model_name", "m", "--predictor_host", "127.0.0.1:1", "--http_port", "0", "--host", "127.0.0.1"],
], ids=["explainer", "transformer"])
@pytest.mark.parametrize("flag", [None, "4096"], ids=["default", "flag"])
def test_the_transformer_and_explainer_cap_the_head_too(command: list[str], flag: str | None) -> None:
    """They serve REST through the same runner, with the same flag (KServe's underscore spelling)."""
    proc = ComponentProcess(command + (["--max_header_bytes", flag] if flag else [])).wait_ports()
    try:
        limit = int(flag or 65536)
        # (live or not, with no predictor: either answer read the head)
        below = requests.get(proc.url + "/v2/health/live", headers={"X-Pad": "a" * (limit - 1000)}, timeout=TIMEOUT)
        assert below.status_code in (200, 400) and "live" in below.json(), below.text
        big = send_head(proc.rest_port, b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nX-Pad: "
                        + b"a" * (limit + 1000) + b"\r\n\r\n")
        assert big.startswith(b"HTTP/1.1 431 ") and f"{limit} bytes".encode() in big, big
    finally:
        assert proc.stop() == 0

# -- gRPC: ModelInfer ----------------------------------------------------------
X4_RAW = np.asarray(FOUR, np.float32).tobytes()
INVALID = grpc.StatusCode.INVALID_ARGUMENT

#: (request, status code, needles in the message)
GRPC_CASES = [
    # model and version
    pytest.param(infer_request("nope", [tensor()], [X_RAW]), grpc.StatusCode.NOT_FOUND, "'nope'", id="unknown-model"),
    pytest.param(infer_request("", [tensor()], [X_RAW]), grpc.StatusCode.NOT_FOUND, "model ''", id="empty-model-name"),
    pytest.param(infer_request("add", [tensor()], [X_RAW], version="9"), grpc.StatusCode.NOT_FOUND,
                 ("'add'", "version 9"), id="unknown-version"),
    pytest.param(infer_request("add", [tensor()], [X_RAW], version="abc"), INVALID, ("version", "'abc'"),
                 id="version-not-an-integer"),
    pytest.param(infer_request("add", [tensor()], [X_RAW], version="-2"), INVALID, ("version", "'-2'"),
                 id="version-negative"),
    # input names and count
    pytest.param(infer_request("add", [tensor("z")], [X_RAW]), INVALID, ("'z'", "'x'"), id="wrong-input-name"),
    pytest.param(infer_request("add"), INVALID, "'x'", id="no-inputs"),
    pytest.param(infer_request("two", [tensor("a", shape=(1, 4))], [X4_RAW]), INVALID, "'b'", id="missing-input"),
    pytest.param(infer_request("add", [tensor(), tensor("z")], [X_RAW, X_RAW]), INVALID, "'z'", id="extra-input"),
    pytest.param(infer_request("add", [tensor(), tensor()], [X_RAW, X_RAW]), INVALID, ("'x'", "more than once"),
                 id="duplicate-input"),
    pytest.param(infer_request("add", [tensor("")], [X_RAW]), INVALID, ("inputs[0]", "name"), id="empty-input-name"),
    # shape
    pytest.param(infer_request("add", [tensor(shape=(16,))], [X_RAW]), INVALID, ("'x'", "[16]"), id="wrong-rank"),
    pytest.param(infer_request("fixed", [tensor(shape=(2, 4))], [X_RAW[:32]]), INVALID, ("'x'", "[2, 4]"),
                 id="static-model-wrong-batch"),
    pytest.param(infer_request("add", [tensor(shape=(-1, 16))], [X_RAW]), INVALID, ("'x'", "negative"),
                 id="negative-dim"),
    pytest.param(infer_request("add", [tensor(shape=(1 << 31, 1 << 31))], [X_RAW]), INVALID,
                 ("'x'", "too many elements"), id="huge-shape"),
    pytest.param(infer_request("add", [tensor(shape=(1 << 20, 1 << 16))], [X_RAW]), INVALID, ("'x'", "got 64"),
                 id="large-shape-little-data"),
    pytest.param(infer_request("add", [tensor(shape=(1 << 31, 1 << 31), fp32_contents=[0.0])]), INVALID,
                 ("'x'", "too many elements"), id="huge-shape-typed"),
    pytest.param(infer_request("add", [tensor(shape=(1,) * 65)], [X_RAW[:4]]), INVALID,
                 ("'x'", "65 dimensions", "at most 32"), id="65-dims"),
    pytest.param(infer_request("add", [tensor(shape=(1,) * 65, fp32_contents=[0.0])]), INVALID,
                 ("'x'", "65 dimensions", "at most 32"), id="65-dims-typed"),
    # datatype
    pytest.param(infer_request("add", [tensor(datatype="INT32")], [X_RAW]), INVALID, ("'x'", "INT32", "FP32"),
                 id="wrong-datatype"),
    pytest.param(infer_request("add", [tensor(datatype="FLOAT")], [X_RAW]), INVALID, ("'x'", "'FLOAT'"),
                 id="unknown-datatype"),
    pytest.param(infer_request("add", [tensor(datatype="BF16")], [X_RAW[:32]]), INVALID, ("'x'", "BF16"),
                 id="bf16-raw"),
    pytest.param(infer_request("add", [tensor(datatype="BF16", fp32_contents=[0.0] * 16)]), INVALID,
                 ("'x'", "BF16"), id="bf16-typed"),
    pytest.param(infer_request("dt_fp16", [tensor(datatype="FP16", shape=(1, 4), fp32_contents=FOUR)]), INVALID,
                 ("'x'", "FP16", "raw_input_contents"), id="fp16-typed"),
    # byte lengths and contents
    pytest.param(infer_request("add", [tensor()], [X_RAW[:60]]), INVALID, ("'x'", "64 bytes", "got 60"),
                 id="raw-length-not-matching-shape"),
    pytest.param(infer_request("add", [tensor()], [X_RAW + b"\0" * 4]), INVALID, ("'x'", "64 bytes", "got 68"),
                 id="raw-longer-than-shape"),
    pytest.param(infer_request("two", [tensor("a", shape=(1, 4)), tensor("b", shape=(1, 4))], [X4_RAW]), INVALID,
                 ("raw_input_contents", "1", "2 inputs"), id="raw-fewer-entries-than-inputs"),
    pytest.param(infer_request("add", [tensor()], [X_RAW, X_RAW]), INVALID, ("raw_input_contents", "2", "1 inputs"),
                 id="raw-more-entries-than-inputs"),
    pytest.param(infer_request("two", [tensor("a", shape=(1, 4)), tensor("b", shape=(1, 4), fp32_contents=FOUR)],
                               [X4_RAW, X4_RAW]), INVALID, ("'b'", "raw_input_contents", "mixed"),
                 id="raw-and-typed-mixed"),
    pytest.param(infer_request("add", [tensor(fp32_contents=[0.0] * 15)]), INVALID, ("'x'", "16", "15"),
                 id="typed-too-few-values"),
    pytest.param(infer_request("add", [tensor(int_contents=[0] * 16)]), INVALID, ("'x'", "got 0"),
                 id="typed-wrong-contents-field"),
    pytest.param(infer_request("dt_int8", [tensor(datatype="INT8", shape=(1, 4), int_contents=[1, 2, 3, 300])]),
                 INVALID, ("'x'", "300"), id="typed-int8-out-of-range"),
    pytest.param(infer_request("dt_uint8", [tensor(datatype="UINT8", shape=(1, 4), uint_contents=[1, 2, 3, 256])]),
                 INVALID, ("'x'", "256"), id="typed-uint8-out-of-range"),
    pytest.param(infer_request("dt_int16", [tensor(datatype="INT16", shape=(1, 4),
                                                   int_contents=[1, 2, 3, -40000])]),
                 INVALID, ("'x'", "-40000"), id="typed-int16-out-of-range"),
    pytest.param(infer_request("dt_bytes", [tensor(datatype="BYTES", shape=(1, 4))], [struct.pack("<I", 5) + b"ab"]),
                 INVALID, ("'x'", "BYTES element 0", "5 bytes"), id="bytes-element-runs-past-end"),
    pytest.param(infer_request("dt_bytes", [tensor(datatype="BYTES", shape=(1, 4))], [framed(b"a")]), INVALID,
                 ("'x'", "4 BYTES elements", "got 1"), id="bytes-too-few-elements"),
    pytest.param(infer_request("dt_bytes", [tensor(datatype="BYTES", shape=(1, 4))], [b"\x01\x00"]), INVALID,
                 ("'x'", "truncated"), id="bytes-truncated-length"),
    pytest.param(infer_request("dt_bytes", [tensor(datatype="BYTES", shape=(1, 4), bytes_contents=[b"a"])]),
                 INVALID, ("'x'", "4 elements", "got 1"), id="bytes-typed-too-few-elements"),
    # requested outputs
    pytest.param(infer_request("add", [tensor()], [X_RAW], outputs=["nope"]), INVALID, ("'nope'", "'y'"),
                 id="unknown-output"),
]


@pytest.mark.parametrize("request_,code,needle", GRPC_CASES)
def test_grpc_infer_bad_input(server, stub, request_, code, needle) -> None:
    mark = len(server.lines)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request_, timeout=TIMEOUT)
    assert_grpc_error(info.value, code, needle)
    assert_still_serving(server, stub, mark)


#: (rpc, request, status code, needles)
GRPC_OTHER_CASES = [
    pytest.param("ModelMetadata", pb.ModelMetadataRequest(name="nope"), grpc.StatusCode.NOT_FOUND, "'nope'",
                 id="metadata-unknown-model"),
    pytest.param("ModelMetadata", pb.ModelMetadataRequest(name="add", version="9"), grpc.StatusCode.NOT_FOUND,
                 ("'add'", "version 9"), id="metadata-unknown-version"),
    pytest.param("ModelMetadata", pb.ModelMetadataRequest(name="add", version="x"), INVALID, ("version", "'x'"),
                 id="metadata-version-not-an-integer"),
    pytest.param("ModelReady", pb.ModelReadyRequest(name="nope"), grpc.StatusCode.NOT_FOUND, "'nope'",
                 id="ready-unknown-model"),
    pytest.param("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="nope"), grpc.StatusCode.NOT_FOUND,
                 "'nope'", id="repository-load-unknown"),
    pytest.param("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="nope"),
                 grpc.StatusCode.NOT_FOUND, "'nope'", id="repository-unload-unknown"),
    pytest.param("ModelStatistics", pb.ModelStatisticsRequest(name="nope"), grpc.StatusCode.NOT_FOUND, "'nope'",
                 id="statistics-unknown-model"),
    pytest.param("ModelStatistics", pb.ModelStatisticsRequest(name="add", version="9"), grpc.StatusCode.NOT_FOUND,
                 ("'add'", "'9'"), id="statistics-unknown-version"),
]


@pytest.mark.parametrize("rpc,request_,code,needle", GRPC_OTHER_CASES)
def test_grpc_bad_request(server, stub, rpc, request_, code, needle) -> None:
    mark = len(server.lines)
    with pytest.raises(grpc.RpcError) as info:
        getattr(stub, rpc)(request_, timeout=TIMEOUT)
    assert_grpc_error(info.value, code, needle)
    assert_still_serving(server, stub, mark)


def test_grpc_stream_reports_errors_in_band_and_keeps_going(server, stub) -> None:
    """ModelStreamInfer: each bad request gets its own error_message; the stream stays open."""
    bad = [param.values for param in GRPC_CASES]
    requests_ = []
    for i, original in enumerate([r for r, _, _ in bad] + [infer_request("add", [tensor()], [X_RAW])] * 2):
        r = pb.ModelInferRequest()
        r.CopyFrom(original)  # the table's requests stay untouched
        r.id = str(i)
        requests_.append(r)
    mark = len(server.lines)
    replies = list(stub.ModelStreamInfer(iter(requests_), timeout=30))
    assert len(replies) == len(requests_)
    for (_, _, needle), reply in zip(bad, replies[:len(bad)], strict=True):
        assert reply.error_message and not reply.HasField("infer_response"), reply
        for n in _needles(needle):
            assert n in reply.error_message, (n, reply.error_message)
    for i, reply in enumerate(replies[len(bad):], start=len(bad)):
        assert not reply.error_message, reply.error_message
        assert reply.infer_response.id == str(i)
        y = np.frombuffer(reply.infer_response.raw_output_contents[0], dtype="<f4").reshape(1, 16)
        np.testing.assert_allclose(y, X + 1, rtol=1e-6)
    assert_still_serving(server, stub, mark)


# -- the stock tritonclient clients ----------------------------------------------
def _triton_input(mod: Any, name: str, array: np.ndarray, datatype: str = "FP32") -> Any:
    inp = mod.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


TRITON_CASES = [
    pytest.param("nope", "x", X, None, ("404", "NOT_FOUND"), "'nope'", id="unknown-model"),
    pytest.param("add", "z", X, None, ("400", "INVALID_ARGUMENT"), "'z'", id="wrong-input-name"),
    pytest.param("add", "x", X[:, :8], None, ("400", "INVALID_ARGUMENT"), ("'x'", "[1, 8]"), id="wrong-shape"),
    pytest.param("add", "x", X.astype(np.float64), None, ("400", "INVALID_ARGUMENT"), ("'x'", "FP64"),
                 id="wrong-datatype"),
    pytest.param("add", "x", X, "nope", ("400", "INVALID_ARGUMENT"), "'nope'", id="unknown-output"),
]


@pytest.mark.parametrize("mod", [thttp, tgrpc], ids=["http", "grpc"])
@pytest.mark.parametrize("model,name,array,output,status,needle", TRITON_CASES)
def test_tritonclient_sees_clear_errors(server, stub, mod, model, name, array, output, status, needle) -> None:
    url = server.url[len("http://"):] if mod is thttp else server.grpc_target
    mark = len(server.lines)
    client = mod.InferenceServerClient(url)
    try:
        datatype = "FP64" if array.dtype == np.float64 else "FP32"
        outputs = [mod.InferRequestedOutput(output)] if output else None
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, [_triton_input(mod, name, array, datatype)], outputs=outputs)
        expected = status[0] if mod is thttp else f"StatusCode.{status[1]}"
        assert info.value.status() == expected, info.value
        for n in _needles(needle):
            assert n in info.value.message(), (n, info.value.message())
        result = client.infer("add", [_triton_input(mod, "x", X)])
        np.testing.assert_allclose(result.as_numpy("y"), X + 1, rtol=1e-6)
    finally:
        client.close()
    assert_still_serving(server, stub, mark)


# -- private servers: a model that failed to load; the size limit --------------------
@pytest.fixture
def broken_repo(tmp_path: Path) -> Path:
    """A good model next to one whose IR is garbage and one whose weights are missing."""
    repo = tmp_path / "repo"
    models.save(models.add_one(), repo, "add")
    garbage = repo / "broken" / "1"
    garbage.mkdir(parents=True)
    (garbage / "model.xml").write_text("<net name='broken'><layers><oops></net>")
    no_weights = models.save(models.matmul(), repo, "noweights")
    (no_weights / "model.bin").unlink()
    return repo


FAILED = ["broken", "noweights"]


@pytest.mark.parametrize("model", FAILED)
def test_model_that_failed_to_load(start_server, broken_repo, model) -> None:
    srv = start_server("--model-repository", broken_repo, "--poll-interval", "0", *EXACT)
    srv.wait_log(rf"model {model} version 1: END")
    channel = grpc.insecure_channel(srv.grpc_target)
    try:
        g = pb_grpc.GRPCInferenceServiceStub(channel)
        mark = len(srv.lines)
        # The server is ready (the latch), the failed model is not.
        assert requests.get(srv.url + "/v2/health/ready", timeout=TIMEOUT).status_code == 200
        ready = requests.get(f"{srv.url}/v2/models/{model}/ready", timeout=TIMEOUT)
        assert ready.status_code == 400 and ready.json()["ready"] is False  # the V2 protocol: 4xx is false
        assert g.ModelReady(pb.ModelReadyRequest(name=model), timeout=TIMEOUT).ready is False

        body = json.dumps({"inputs": [GOOD]}).encode()
        for method, path, data in [
            ("POST", f"/v2/models/{model}/infer", body),
            ("POST", f"/v2/models/{model}/versions/1/infer", body),
            ("POST", f"/v1/models/{model}:predict", json.dumps({"instances": [[0.0] * 16]}).encode()),
            ("GET", f"/v2/models/{model}", None),
            ("GET", f"/v2/models/{model}/versions/1", None),
        ]:
            resp = requests.request(method, srv.url + path, data=data, timeout=TIMEOUT)
            message = assert_rest_error(resp, 503, f"'{model}'")
            assert "version 1" in message, (path, message)

        for rpc, req in [
            ("ModelInfer", infer_request(model, [tensor()], [X_RAW])),
            ("ModelInfer", infer_request(model, [tensor()], [X_RAW], version="1")),
            ("ModelMetadata", pb.ModelMetadataRequest(name=model)),
        ]:
            with pytest.raises(grpc.RpcError) as info:
                getattr(g, rpc)(req, timeout=TIMEOUT)
            assert_grpc_error(info.value, grpc.StatusCode.UNAVAILABLE, (f"'{model}'", "version 1"))

        # The repository index tells why.
        index = requests.post(srv.url + "/v2/repository/index", timeout=TIMEOUT).json()
        (row,) = [r for r in index if r["name"] == model]
        assert row["state"] != "READY" and row["reason"], row
        assert_still_serving(srv, g, mark)
    finally:
        channel.close()


def _padded_json(size: int) -> bytes:
    """A valid infer request for ``add`` padded with whitespace to exactly ``size`` bytes."""
    doc = json.dumps({"inputs": [GOOD]}).encode()
    assert len(doc) <= size
    return doc + b" " * (size - len(doc))


LIMIT = 4096


@pytest.mark.parametrize("how", ["flag", "env"])
def test_body_over_the_limit(start_server, demo_repo, how) -> None:
    if how == "flag":
        srv = start_server("--model-repository", demo_repo, "--poll-interval", "0",
                           "--max-request-bytes", str(LIMIT), *EXACT)
    else:
        srv = start_server("--model-repository", demo_repo, "--poll-interval", "0", *EXACT,
                           env={"OVSERVE_MAX_REQUEST_BYTES": str(LIMIT)})
    channel = grpc.insecure_channel(srv.grpc_target)
    try:
        g = pb_grpc.GRPCInferenceServiceStub(channel)
        mark = len(srv.lines)
        # At the limit: served.
        resp = requests.post(srv.url + INFER, data=_padded_json(LIMIT), timeout=TIMEOUT)
        assert resp.status_code == 200, resp.text

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while reading
            body = _padded_json(3 * LIMIT)
            for i in range(0, len(body), 1000):
                yield body[i:i + 1000]

        big = np.zeros((LIMIT // 64 + 1, 16), np.float32)
        for _name, path, data, headers in [
            ("json", INFER, _padded_json(LIMIT + 1), {}),
            ("json-much-larger", INFER, _padded_json(1 << 20), {}),
            ("chunked", INFER, chunks(), {}),
            ("binary", INFER, *binary_body({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(big.shape)}]},
                                           big.tobytes())),
            ("v1", "/v1/models/add:predict", json.dumps({"instances": big.tolist()}).encode(), {}),
            ("repository-index", "/v2/repository/index", b" " * (LIMIT + 1), {}),
        ]:
            resp = requests.post(srv.url + path, data=data, headers=headers, timeout=TIMEOUT)
            assert_rest_error(resp, 413, str(LIMIT))
            rest_infer_ok(srv.url)

        # gRPC: the same limit on the received message.
        grpc_infer_ok(g)
        for req in [
            infer_request("add", [tensor(shape=big.shape)], [big.tobytes()]),
            infer_request("add", [tensor(shape=big.shape, fp32_contents=big.ravel().tolist())]),
        ]:
            assert req.ByteSize() > LIMIT
            with pytest.raises(grpc.RpcError) as info:
                g.ModelInfer(req, timeout=TIMEOUT)
            assert_grpc_error(info.value, grpc.StatusCode.RESOURCE_EXHAUSTED, str(LIMIT))
            grpc_infer_ok(g)
        assert_still_serving(srv, g, mark)
    finally:
        channel.close()
