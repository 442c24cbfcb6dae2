"""Pure parts of the transformer and the predictor client: error mapping, hosts, wire conversions."""
from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ovserve.client as pc
from ovserve.client import errors as client_errors
from ovserve.client import rest_wire
from ovserve.server.codecs import v1
from ovserve.server.components.transformer import Transformer, TransformerDataPlane, load_handler, tensor
from ovserve.server.errors import InvalidInput, ServerError, grpc_status, http_status
from ovserve.server.transports.rest.codec import decode_infer_request, encode_infer_response
from ovserve.server.types import InferRequest, InferResponse, ModelMetadata, RequestedOutput, Tensor, TensorSpec


@pytest.mark.parametrize("status, grpc", [
    (400, "INVALID_ARGUMENT"), (404, "NOT_FOUND"), (412, "FAILED_PRECONDITION"), (409, "ALREADY_EXISTS"),
    (403, "PERMISSION_DENIED"), (401, "UNAUTHENTICATED"), (413, "RESOURCE_EXHAUSTED"),
    (500, "INTERNAL"), (501, "UNIMPLEMENTED"), (503, "UNAVAILABLE"), (504, "DEADLINE_EXCEEDED"),
])
def test_predictor_http_errors_keep_their_status(status: int, grpc: str) -> None:
    err = client_errors.error_from_http(status, "model 'm' not found")
    assert isinstance(err, (ServerError, pc.PredictorError))
    assert http_status(err) == status and grpc_status(err) == grpc
    assert err.message == "predictor: model 'm' not found"
    back = client_errors.error_from_grpc(grpc, "x")
    assert http_status(back) == status and grpc_status(back) == grpc


def test_predictor_overloaded_keeps_its_429_and_resource_exhausted_stays_payload_too_large() -> None:
    err = client_errors.error_from_http(429, "model 'm' has 8 requests queued")
    assert isinstance(err, client_errors.PredictorOverloaded)
    assert http_status(err) == 429 and grpc_status(err) == "RESOURCE_EXHAUSTED"
    # one gRPC code for both: the older meaning (413) wins, as before 429 existed
    assert http_status(client_errors.error_from_grpc("RESOURCE_EXHAUSTED", "x")) == 413


def test_unusual_statuses_map_to_the_nearest_class() -> None:
    assert http_status(client_errors.error_from_http(422, "bad")) == 400
    assert http_status(client_errors.error_from_http(502, "bad gateway")) == 500
    assert http_status(client_errors.error_from_grpc("ABORTED", "x")) == 500
    assert client_errors.error_from_http(422, "bad").status == 422  # the predictor's own status is kept on the error


@pytest.mark.parametrize("host, tls, want", [
    ("m-predictor.ns", False, ("m-predictor.ns", 80)),
    ("m-predictor.ns", True, ("m-predictor.ns", 443)),
    ("127.0.0.1:8081", False, ("127.0.0.1", 8081)),
    ("http://h:9/", False, ("h", 9)),
    ("[::1]:7000", False, ("::1", 7000)),
])
def test_predictor_host(host: str, tls: bool, want: tuple[str, int]) -> None:
    assert pc.split_host(host, tls) == want


def test_unknown_protocol_is_refused() -> None:
    with pytest.raises(ValueError, match="v1, v2, grpc-v2"):
        pc.PredictorClient("h", "v3")


def test_v2_request_is_binary_and_the_server_reads_it_back() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    words = np.array([b"\xff\xd8 jpeg", b"text"], dtype=object)
    req = InferRequest("m", [Tensor("x", "FP32", (2, 3), x), Tensor("w", "BYTES", (2,), words)], id="7",
                       outputs=[RequestedOutput("y")])
    body, header_len = rest_wire.encode_v2_request(req)
    assert b'"data"' not in body[:header_len]  # every tensor went binary
    back = decode_infer_request("m", "", body, str(header_len))
    np.testing.assert_array_equal(back.inputs[0].data, x)
    assert list(back.inputs[1].data) == list(words) and back.id == "7"
    assert back.parameters["binary_data_output"] is True and back.outputs[0].parameters["binary_data"] is True


def test_v2_response_binary_and_json_decode() -> None:
    y = np.array([[1.5, -2.0]], dtype=np.float32)
    resp = InferResponse("m", "1", [Tensor("y", "FP32", (1, 2), y, {"binary_data": True}),
                                    Tensor("l", "BYTES", (1,), np.array([b"cat"], dtype=object))])
    for binary in (True, False):
        req = InferRequest("m", [], parameters={"binary_data_output": binary})
        payload, header_len = encode_infer_response(resp, req)
        got = rest_wire.decode_v2_response(payload, None if header_len is None else str(header_len))
        np.testing.assert_array_equal(got.outputs[0].data, y)
        assert list(got.outputs[1].data) == [b"cat"] and got.model_version == "1"
        assert "binary_data_size" not in got.outputs[0].parameters


def test_v1_wire_round_trip() -> None:
    req = InferRequest("m", [Tensor("x", "FP32", (1, 2), np.array([[1.0, 2.0]], np.float32))])
    assert rest_wire.encode_v1_request(req) == {"instances": [[1.0, 2.0]]}
    md = ModelMetadata("m", ["1"], "OpenVINO", [TensorSpec("x", "FP32", (-1, 2))],
                       [TensorSpec("sum", "FP32", (-1,)), TensorSpec("label", "BYTES", (-1,))])
    resp = rest_wire.decode_v1_predictions({"predictions": [{"sum": 3.0, "label": "cat"}]}, "m", md)
    assert [t.name for t in resp.outputs] == ["sum", "label"]
    assert resp.outputs[0].data.dtype == np.float32 and list(resp.outputs[1].data) == [b"cat"]
    with pytest.raises(pc.PredictorInternal):
        rest_wire.decode_v1_predictions({"nope": 1}, "m", md)


def v1_request(model: str, doc: object, specs: list[TensorSpec]) -> InferRequest:
    """A transformer's V1 decoding: the predictor's input specs are hints."""
    return v1.decode_request(model, doc, specs, exact=False)


def test_v1_instances_with_base64_images() -> None:
    jpeg = b"\xff\xd8\xff\xe0 not really a jpeg \xfb\xff"
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        doc = {"instances": [{"image_bytes": {"b64": encode(jpeg).decode().rstrip("=")}, "key": "a"}]}
        req = v1_request("m", doc, [])
        by_name = {t.name: t for t in req.inputs}
        assert by_name["image_bytes"].datatype == "BYTES" and by_name["image_bytes"].data[0] == jpeg
        assert by_name["key"].data[0] == b"a"


def test_v1_numbers_take_the_predictors_datatype() -> None:
    req = v1_request("m", {"instances": [[1, 2], [3, 4]]}, [TensorSpec("x", "FP32", (-1, 2))])
    (t,) = req.inputs
    assert t.name == "x" and t.datatype == "FP32" and t.data.dtype == np.float32 and t.shape == (2, 2)
    req = v1_request("m", {"inputs": {"a": [1, 2]}}, [])
    assert req.inputs[0].datatype == "INT64"


@pytest.mark.parametrize("doc, words", [
    ([1], "JSON object"),
    ({"instances": []}, "non-empty"),
    ({"instances": [1], "inputs": [1]}, "exactly one"),
    ({"instances": [{"b64": "%%"}]}, "base64"),
    ({"instances": [[1, [2]]]}, "instances"),
])
def test_v1_bad_instances_are_400(doc: object, words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        v1_request("m", doc, [])


def test_tensor_helper_and_shape_follows_data() -> None:
    t = tensor("l", ["cat", "dog"])
    assert t.datatype == "BYTES" and list(t.data) == [b"cat", b"dog"]
    assert tensor("p", np.zeros((2, 3), np.float32)).datatype == "FP32"
    plane = TransformerDataPlane("m", Transformer(), predictor=None)
    resp = InferResponse("m", "1", [Tensor("y", "FP32", (9,), np.zeros((2, 2), np.float32))])
    plane._checked("postprocess", resp, InferResponse, "outputs")
    assert resp.outputs[0].shape == (2, 2)


def test_load_handler_by_module_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mine.py").write_text("from ovserve.server import Transformer\nclass T(Transformer):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert type(load_handler("mine:T")).__name__ == "T"
    assert type(load_handler(f"{tmp_path / 'mine.py'}:T")).__name__ == "T"
    assert type(load_handler(None)) is Transformer


@pytest.mark.integration
def test_imagenet_with_a_bad_labels_file_exits_at_start(tmp_path: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\n")
    out = subprocess.run([sys.executable, "-m", "ovserve.server", "transformer", "--handler",
                          "ovserve.server.components.imagenet:ImageNetTransformer", "--model_name", "m",
                          "--predictor_host", "h"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "OVSERVE_IMAGENET_LABELS": str(labels)}, check=False)
    assert out.returncode != 0 and "has 2 names, expected 1000" in out.stderr


@pytest.mark.integration
def test_rest_clients_never_load_the_protobuf_package() -> None:
    """A process that uses the REST predictor client (or this test process) keeps `inference` free."""
    code = ("import sys, asyncio\n"
            "from ovserve.server.components import transformer_server\n"
            "from ovserve.client import PredictorClient\n"
            "c = PredictorClient('127.0.0.1:9', 'v2'); asyncio.run(c.aclose())\n"
            "grpc = ('ovserve.common.proto', 'ovserve.client.grpc_v2', 'ovserve.server.transports.grpc_v2')\n"
            "print(any(m.startswith(grpc) for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.stdout.strip() == "False", out.stderr
