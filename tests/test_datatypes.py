"""Every V2 datatype through every tensor form, on both transports.

The forms: REST JSON with flat and with nested ``data``; the REST binary tensor
extension through tritonclient.http (``binary_data=True``) and the same client
in plain JSON (``binary_data=False``); gRPC ``raw_input_contents`` through
tritonclient.grpc; gRPC typed ``InferTensorContents`` built by hand with
tritonclient's stubs. Each form returns a :class:`Reply`, decoded from the wire
by the test, and checks the reply form rule on the way.

Expected values come from numpy. The ``dt_*`` models add one, which the CPU
plugin computes in 32 bits for 64-bit types; the full range of every
datatype goes through ``echo_server``, whose models return their input.
"""
from __future__ import annotations

import functools
import json
import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from .servers import ServerProcess
from .values import DATATYPES, NUMPY, f32, objects, plus_one, sample

TIMEOUT = 20

#: V2 datatype -> InferTensorContents field (FP16 has none: raw only).
CONTENTS = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
    "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}

Inputs = list[tuple[str, str, np.ndarray]]  # (name, datatype, array)


def as_bytes_array(arr: np.ndarray) -> np.ndarray:
    """BYTES elements as ``bytes`` whichever way the client decoded them."""
    flat = [v.encode() if isinstance(v, str) else bytes(v) for v in arr.reshape(-1)]
    return objects(flat, arr.shape)


def assert_tensor(reply: Reply, name: str, datatype: str, expected: np.ndarray) -> None:
    assert reply.datatypes[name] == datatype
    got = reply.outputs[name]
    assert got.shape == expected.shape
    if datatype == "BYTES":
        assert as_bytes_array(got).tolist() == expected.tolist()
    else:
        assert got.dtype == NUMPY[datatype]
        np.testing.assert_array_equal(got, expected)


# -- the forms ------------------------------------------------------------------
@dataclass
class Reply:
    outputs: dict[str, np.ndarray]
    datatypes: dict[str, str]
    id: str
    model_version: str


def _rest_json(server: ServerProcess, model: str, inputs: Inputs, outputs: list[str] | None, *,
               nested: bool, version: str = "", request_id: str = "", parameters: dict | None = None) -> Reply:
    def data(datatype: str, arr: np.ndarray) -> list:
        if datatype == "BYTES":
            arr = objects([b.decode() for b in arr.reshape(-1)], arr.shape)
        return arr.tolist() if nested else arr.reshape(-1).tolist()

    body: dict[str, Any] = {
        "inputs": [{"name": n, "datatype": dt, "shape": list(a.shape), "data": data(dt, a)} for n, dt, a in inputs]
    }
    if outputs is not None:
        body["outputs"] = [{"name": n} for n in outputs]
    if request_id:
        body["id"] = request_id
    if parameters:
        body["parameters"] = parameters
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    resp = requests.post(server.url + path, json=body, timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    doc = resp.json()
    arrays, datatypes = {}, {}
    for out in doc["outputs"]:
        dt = out["datatype"]
        assert "binary_data_size" not in out.get("parameters", {})
        values = np.array(out["data"], dtype=object if dt == "BYTES" else NUMPY[dt])
        arrays[out["name"]] = values.reshape(out["shape"])
        datatypes[out["name"]] = dt
    return Reply(arrays, datatypes, doc.get("id", ""), doc["model_version"])


_clients: dict[tuple[str, str], Any] = {}
_CLIENT_KINDS: dict[str, Callable[[str], Any]] = {
    "http": lambda url: thttp.InferenceServerClient(url, connection_timeout=TIMEOUT, network_timeout=TIMEOUT),
    "grpc": tgrpc.InferenceServerClient,
    "channel": grpc.insecure_channel,
}


def client(kind: str, address: str) -> Any:
    """One client per kind and address for the module (closed by ``_close_clients``)."""
    if (kind, address) not in _clients:
        _clients[kind, address] = _CLIENT_KINDS[kind](address)
    return _clients[kind, address]


def stub(server: ServerProcess) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(client("channel", server.grpc_target))


def _tritonclient(server: ServerProcess, model: str, inputs: Inputs, outputs: list[str] | None, *,
                  mod: Any, binary: bool | None, version: str = "", request_id: str = "",
                  parameters: dict | None = None) -> Reply:
    """tritonclient over REST (binary or JSON) or gRPC (always raw contents)."""
    kw = {} if binary is None else {"binary_data": binary}
    infer = (client("grpc", server.grpc_target) if mod is tgrpc else client("http", server.url[len("http://"):])).infer
    tensors = []
    for name, dt, arr in inputs:
        t = mod.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr, **kw)
        tensors.append(t)
    wanted = None if outputs is None else [mod.InferRequestedOutput(n, **kw) for n in outputs]
    timeout = {"client_timeout": TIMEOUT} if mod is tgrpc else {}  # REST: set on the client
    result = infer(model, tensors, model_version=version, outputs=wanted,
                   request_id=request_id, parameters=parameters, **timeout)
    response = result.get_response()
    if mod is tgrpc:
        # Raw request -> raw reply: one raw entry per output, no typed contents.
        assert len(response.raw_output_contents) == len(response.outputs)
        assert not any(o.HasField("contents") for o in response.outputs)
        names = [(o.name, o.datatype) for o in response.outputs]
        rid, mver = response.id, response.model_version
    else:
        for o in response["outputs"]:
            # binary_data=False outputs come back as JSON; binary ones (and all
            # outputs when none were named) carry binary_data_size instead.
            assert ("binary_data_size" in o.get("parameters", {})) == (binary or outputs is None)
        names = [(o["name"], o["datatype"]) for o in response["outputs"]]
        rid, mver = response.get("id", ""), response["model_version"]
    return Reply({n: result.as_numpy(n) for n, _ in names}, dict(names), rid, mver)


def _pb_params(target: Any, params: dict) -> None:
    for key, value in params.items():
        field = {bool: "bool_param", int: "int64_param", str: "string_param"}[type(value)]
        setattr(target[key], field, value)


def typed_request(model: str, inputs: Inputs, outputs: list[str] | None = None, *, version: str = "",
                  request_id: str = "", parameters: dict | None = None) -> Any:
    msg = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    _pb_params(msg.parameters, parameters or {})
    for name, dt, arr in inputs:
        tensor = msg.inputs.add(name=name, datatype=dt, shape=list(arr.shape))
        getattr(tensor.contents, CONTENTS[dt]).extend(arr.reshape(-1).tolist())
    for name in outputs or []:
        msg.outputs.add(name=name)
    return msg


def _grpc_typed(server: ServerProcess, model: str, inputs: Inputs, outputs: list[str] | None, **kw: Any) -> Reply:
    response = stub(server).ModelInfer(typed_request(model, inputs, outputs, **kw), timeout=TIMEOUT)
    # Typed contents for every input -> typed reply, no raw contents.
    assert not response.raw_output_contents
    arrays, datatypes = {}, {}
    for out in response.outputs:
        values = list(getattr(out.contents, CONTENTS[out.datatype]))
        arrays[out.name] = np.array(values, dtype=NUMPY[out.datatype]).reshape(tuple(out.shape))
        datatypes[out.name] = out.datatype
    return Reply(arrays, datatypes, response.id, response.model_version)


Form = Callable[..., Reply]
FORMS: dict[str, Form] = {
    "rest_json_flat": functools.partial(_rest_json, nested=False),
    "rest_json_nested": functools.partial(_rest_json, nested=True),
    "rest_binary": functools.partial(_tritonclient, mod=thttp, binary=True),
    "rest_json_tritonclient": functools.partial(_tritonclient, mod=thttp, binary=False),
    "grpc_raw": functools.partial(_tritonclient, mod=tgrpc, binary=None),
    "grpc_typed": _grpc_typed,
}
BINARY_SAFE = ["rest_binary", "grpc_raw", "grpc_typed"]  # forms that carry any bytes

#: Every datatype x form, but FP16, which typed contents cannot carry (tested apart).
MATRIX = [
    pytest.param(dt, form, id=f"{dt}-{form}")
    for dt in DATATYPES for form in FORMS if not (dt == "FP16" and form == "grpc_typed")
]


# -- fixtures -------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _close_clients():
    yield
    for c in _clients.values():
        c.close()
    _clients.clear()


# -- datatypes x forms ------------------------------------------------------------
@pytest.mark.parametrize("datatype, form", MATRIX)
def test_datatype_through_form(server, datatype: str, form: str) -> None:
    x = sample(datatype)
    reply = FORMS[form](server, f"dt_{datatype.lower()}", [("x", datatype, x)], ["y"])
    assert list(reply.outputs) == ["y"]
    assert_tensor(reply, "y", datatype, plus_one(datatype, x))


@pytest.mark.parametrize("datatype, form", MATRIX)
def test_full_range_echo(echo_server, datatype: str, form: str) -> None:
    x = sample(datatype, full_range=True)
    reply = FORMS[form](echo_server, f"echo_{datatype.lower()}", [("x", datatype, x)], ["x"])
    assert_tensor(reply, "x", datatype, x)


@pytest.mark.parametrize("form", BINARY_SAFE)
def test_bytes_that_are_not_utf8(echo_server, form: str) -> None:
    # No trailing NUL: OpenVINO string tensors go through numpy's "S" dtype, which drops them.
    x = objects([b"\xff\xfe", b"\x00\x80", b"\xc3", b"\x00\x00ok"], (1, 4))
    reply = FORMS[form](echo_server, "echo_bytes", [("x", "BYTES", x)], ["x"])
    assert_tensor(reply, "x", "BYTES", x)


@pytest.mark.parametrize("contents", ["fp32_contents", "none"])
def test_fp16_in_typed_contents_is_invalid_argument(server, contents: str) -> None:
    msg = service_pb2.ModelInferRequest(model_name="dt_fp16")
    tensor = msg.inputs.add(name="x", datatype="FP16", shape=[1, 4])
    if contents != "none":
        getattr(tensor.contents, contents).extend([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(grpc.RpcError) as err:
        stub(server).ModelInfer(msg, timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "FP16" in err.value.details()


# -- request features across forms -------------------------------------------------
@pytest.mark.parametrize("form", FORMS)
def test_requested_output_subset(server, form: str) -> None:
    a, b = f32(3, 4, seed=1), f32(3, 4, seed=2)
    reply = FORMS[form](server, "two", [("a", "FP32", a), ("b", "FP32", b)], ["prod"])
    assert list(reply.outputs) == ["prod"]
    assert_tensor(reply, "prod", "FP32", a * b)


@pytest.mark.parametrize("form", FORMS)
def test_all_outputs_when_none_requested(server, form: str) -> None:
    a, b = f32(2, 4, seed=3), f32(2, 4, seed=4)
    reply = FORMS[form](server, "two", [("a", "FP32", a), ("b", "FP32", b)], None)
    assert sorted(reply.outputs) == ["prod", "sum"]
    assert_tensor(reply, "sum", "FP32", a + b)
    assert_tensor(reply, "prod", "FP32", a * b)


@pytest.mark.parametrize("form", FORMS)
def test_request_id_echoed_and_parameters_accepted(server, form: str) -> None:
    x = f32(1, 16, seed=5)
    params = {"note": "from-the-tests", "flag": True, "count": 3}
    reply = FORMS[form](server, "add", [("x", "FP32", x)], ["y"], request_id=f"req-{form}", parameters=params)
    assert reply.id == f"req-{form}"
    assert_tensor(reply, "y", "FP32", x + np.float32(1))


@pytest.mark.parametrize("form", FORMS)
def test_versioned_infer(server, form: str) -> None:
    x = f32(2, 16, seed=6)
    reply = FORMS[form](server, "add", [("x", "FP32", x)], ["y"], version="1")
    assert reply.model_version == "1"
    assert_tensor(reply, "y", "FP32", x + np.float32(1))


@pytest.mark.parametrize("batch", [0, 1, 3, 64])
@pytest.mark.parametrize("form", FORMS)
def test_dynamic_dimension_takes_any_size(server, form: str, batch: int) -> None:
    x = f32(batch, 16, seed=batch)
    reply = FORMS[form](server, "add", [("x", "FP32", x)], ["y"])
    assert_tensor(reply, "y", "FP32", x + np.float32(1))


@pytest.mark.parametrize("form", FORMS)
def test_static_model_takes_its_shape(server, form: str) -> None:
    x = f32(1, 4, seed=7)
    reply = FORMS[form](server, "fixed", [("x", "FP32", x)], ["y"])
    assert_tensor(reply, "y", "FP32", x * np.float32(2))


def test_raw_rest_binary_body_and_headers(server) -> None:
    """The binary extension on the wire: header length, octet-stream body, sizes."""
    x = f32(2, 16, seed=8)
    header = json.dumps({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16], "parameters": {"binary_data_size": x.nbytes}}],
        "parameters": {"binary_data_output": True},
    }).encode()
    resp = requests.post(server.url + "/v2/models/add/infer", data=header + x.tobytes(),
                         headers={"Inference-Header-Content-Length": str(len(header)),
                                  "Content-Type": "application/octet-stream"}, timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/octet-stream"
    json_len = int(resp.headers["inference-header-content-length"])
    doc = json.loads(resp.content[:json_len])
    (out,) = doc["outputs"]
    assert out["parameters"] == {"binary_data_size": x.nbytes} and "data" not in out
    assert len(resp.content) == json_len + x.nbytes
    y = np.frombuffer(resp.content[json_len:], dtype="<f4").reshape(out["shape"])
    np.testing.assert_array_equal(y, x + np.float32(1))


# -- metadata ---------------------------------------------------------------------
def _ports(*specs: tuple[str, str, list[int]]) -> list[dict]:
    return [{"name": n, "datatype": dt, "shape": shape} for n, dt, shape in specs]


EXPECTED_METADATA = {
    "add": (_ports(("x", "FP32", [-1, 16])), _ports(("y", "FP32", [-1, 16]))),
    "matmul": (_ports(("x", "FP32", [-1, 8])), _ports(("y", "FP32", [-1, 4]))),
    "two": (_ports(("a", "FP32", [-1, 4]), ("b", "FP32", [-1, 4])),
            _ports(("sum", "FP32", [-1, 4]), ("prod", "FP32", [-1, 4]))),
    "fixed": (_ports(("x", "FP32", [1, 4])), _ports(("y", "FP32", [1, 4]))),
    **{f"dt_{dt.lower()}": (_ports(("x", dt, [-1, 4])), _ports(("y", dt, [-1, 4]))) for dt in DATATYPES},
}


def rest_metadata(server: ServerProcess, model: str, version: str) -> dict:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    resp = requests.get(server.url + path, timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    # REST's extension field (gRPC's message has none): how the model was compiled, here in the f32 EXACT names
    params = doc.pop("parameters")
    assert (params["inference_precision"], params["precision_chosen_by"]) == ("f32", "plugin_config"), params
    return doc


def grpc_metadata(server: ServerProcess, model: str, version: str) -> dict:
    md = stub(server).ModelMetadata(
        service_pb2.ModelMetadataRequest(name=model, version=version), timeout=TIMEOUT)
    ports = lambda ts: [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in ts]  # noqa: E731
    return {"name": md.name, "versions": list(md.versions), "platform": md.platform,
            "inputs": ports(md.inputs), "outputs": ports(md.outputs)}


@pytest.mark.parametrize("version", ["", "1"], ids=["latest", "v1"])
@pytest.mark.parametrize("fetch", [rest_metadata, grpc_metadata], ids=["rest", "grpc"])
@pytest.mark.parametrize("model", EXPECTED_METADATA)
def test_model_metadata(server, model: str, fetch: Callable, version: str) -> None:
    inputs, outputs = EXPECTED_METADATA[model]
    assert fetch(server, model, version) == {
        "name": model, "versions": ["1"], "platform": "OpenVINO", "inputs": inputs, "outputs": outputs,
    }


# -- streaming --------------------------------------------------------------------
def test_stream_reports_errors_in_band_and_keeps_going(server) -> None:
    client = tgrpc.InferenceServerClient(server.grpc_target)
    replies: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)), stream_timeout=TIMEOUT)
    try:
        def send(i: int, width: int = 16) -> np.ndarray:
            x = np.full((1, width), i, dtype=np.float32)
            t = tgrpc.InferInput("x", list(x.shape), "FP32")
            t.set_data_from_numpy(x)
            client.async_stream_infer("add", [t], request_id=f"s{i}")
            return x

        def expect_ok(i: int, x: np.ndarray) -> None:
            result, error = replies.get(timeout=TIMEOUT)
            assert error is None, error
            assert result.get_response().id == f"s{i}"
            np.testing.assert_array_equal(result.as_numpy("y"), x + np.float32(1))

        sent = [send(i, width=15 if i == 2 else 16) for i in range(5)]  # request 2 has a bad shape
        for i, x in enumerate(sent):
            if i != 2:
                expect_ok(i, x)
                continue
            result, error = replies.get(timeout=TIMEOUT)
            assert result is None and isinstance(error, InferenceServerException)
            assert "shape" in error.message()
        expect_ok(5, send(5))  # the stream still serves new requests after the error
    finally:
        client.stop_stream()
        client.close()
