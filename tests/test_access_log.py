"""The access log (``--access-log``) and request ids, against a real server on every listener.

One JSON line per request with what docs/operations.md lists; ``x-request-id`` kept from the client
(or made) and returned in a REST header or gRPC trailing metadata; nothing of it without the flag.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from . import models
from .servers import ServerProcess
from .ts_stubs import ts_stubs

ts = ts_stubs()
X = np.arange(16, dtype=np.float32).reshape(1, 16)
FIELDS = {"time", "listener", "method", "model", "version", "status", "latency_ms", "bytes_in", "bytes_out",
          "client", "request_id"}


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    repo = tmp_path_factory.mktemp("repo")
    models.save(models.add_one(), repo, "add")
    log = tmp_path_factory.mktemp("log") / "access.log"
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", "--access-log", str(log),
                          "--ts-inference-port", "0", "--ts-management-port", "0"])
    try:
        yield proc.wait_ready(), log
    finally:
        proc.stop()


def lines_for(log: Path, request_id: str, timeout: float = 10) -> list[dict[str, Any]]:
    """The log's lines of one request id (written at the end of the loop turn: waited for)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [json.loads(line) for line in log.read_text().splitlines() if request_id in line]
        if found or time.monotonic() > deadline:
            return [f for f in found if f["request_id"] == request_id]
        time.sleep(0.05)


def v2_body() -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                                   "data": X.ravel().tolist()}]}).encode()


def test_rest_infer_is_one_line_with_every_field(logged: tuple[ServerProcess, Path]) -> None:
    server, log = logged
    body = v2_body()
    resp = requests.post(f"{server.url}/v2/models/add/versions/1/infer", data=body,
                         headers={"x-request-id": "rest-1"}, timeout=30)
    assert resp.status_code == 200 and resp.headers["x-request-id"] == "rest-1"
    (line,) = lines_for(log, "rest-1")
    assert set(line) == FIELDS | {"path"}
    assert line["listener"] == "rest" and line["method"] == "POST"
    assert line["path"] == "/v2/models/add/versions/1/infer"
    assert (line["model"], line["version"], line["status"]) == ("add", "1", 200)
    assert line["bytes_in"] == len(body) and line["bytes_out"] == len(resp.content)
    assert line["latency_ms"] > 0 and line["client"].startswith("127.0.0.1:")
    assert line["time"].endswith("Z") and line["time"][:2] == "20"


def test_rest_request_id_is_made_when_the_client_sends_none(logged: tuple[ServerProcess, Path]) -> None:
    server, log = logged
    first = requests.get(f"{server.url}/v2/models/nope", timeout=10)
    second = requests.get(f"{server.url}/v2/models/nope", timeout=10)
    assert first.status_code == 404
    made = first.headers["x-request-id"]
    assert len(made) == 32 and made != second.headers["x-request-id"]
    (line,) = lines_for(log, made)
    assert line["status"] == 404 and line["model"] == "nope"


def test_v1_predict_names_its_model(logged: tuple[ServerProcess, Path]) -> None:
    server, log = logged
    resp = requests.post(f"{server.url}/v1/models/add:predict", json={"instances": [[0.0] * 16]},
                         headers={"x-request-id": "v1-1"}, timeout=30)
    assert resp.status_code == 200
    (line,) = lines_for(log, "v1-1")
    assert line["model"] == "add" and line["status"] == 200


def test_grpc_returns_the_request_id_in_trailing_metadata(logged: tuple[ServerProcess, Path]) -> None:
    server, log = logged
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="add", model_version="1")
        tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 16])
        tensor.contents.fp32_contents.extend(X.ravel().tolist())
        reply, call = stub.ModelInfer.with_call(request, metadata=[("x-request-id", "grpc-1")], timeout=30)
        assert dict(call.trailing_metadata())["x-request-id"] == "grpc-1"
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="nope"), timeout=10)
        made = dict(err.value.trailing_metadata())["x-request-id"]  # a failed call gets one too
    (line,) = lines_for(log, "grpc-1")
    assert set(line) == FIELDS
    assert (line["listener"], line["method"], line["model"], line["version"], line["status"]) == (
        "grpc", "ModelInfer", "add", "1", "OK")
    assert line["bytes_in"] == request.ByteSize() and line["bytes_out"] == reply.ByteSize()
    assert line["client"].startswith("127.0.0.1:")
    (failed,) = lines_for(log, made)
    assert (failed["method"], failed["model"], failed["status"]) == ("ModelMetadata", "nope", "NOT_FOUND")


def test_tritonclient_headers_become_the_request_id(logged: tuple[ServerProcess, Path]) -> None:
    server, log = logged
    client = tgrpc.InferenceServerClient(server.grpc_target)
    inp = tgrpc.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(X)
    client.infer("add", [inp], headers={"x-request-id": "triton-1"})
    (line,) = lines_for(log, "triton-1")
    assert line["method"] == "ModelInfer" and line["status"] == "OK"


def test_torchserve_listener_logs_too(logged: tuple[ServerProcess, Path]) -> None:
    server, log = logged
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-inference']}") as channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        stub.Predictions(ts.inference_pb2.PredictionsRequest(model_name="add", input={"data": v2_body()}),
                         metadata=[("x-request-id", "ts-1")], timeout=30)
    (line,) = lines_for(log, "ts-1")
    assert (line["listener"], line["method"], line["model"], line["status"]) == (
        "ts-inference", "Predictions", "add", "OK")


def test_torchserve_streams_and_management_log_too(logged: tuple[ServerProcess, Path]) -> None:
    """Both TorchServe listeners: a stream is one line when it ends (its model the first message's), a
    management call names the model it describes."""
    server, log = logged
    request = ts.inference_pb2.PredictionsRequest(model_name="add", input={"data": v2_body()})
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-inference']}") as channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        assert len(list(stub.StreamPredictions(request, metadata=[("x-request-id", "ts-s1")], timeout=30))) == 1
        assert len(list(stub.StreamPredictions2(iter([request, request]), metadata=[("x-request-id", "ts-s2")],
                                                timeout=30))) == 2
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-management']}") as channel:
        management = ts.management_pb2_grpc.ManagementAPIsServiceStub(channel)
        management.DescribeModel(ts.management_pb2.DescribeModelRequest(model_name="add"),
                                 metadata=[("x-request-id", "ts-m1")], timeout=30)
    for rid, listener, method in (("ts-s1", "ts-inference", "StreamPredictions"),
                                  ("ts-s2", "ts-inference", "StreamPredictions2"),
                                  ("ts-m1", "ts-management", "DescribeModel")):
        (line,) = lines_for(log, rid)
        assert (line["listener"], line["method"], line["model"], line["status"]) == (listener, method, "add", "OK")
    (both,) = lines_for(log, "ts-s2")
    assert both["bytes_in"] == 2 * request.ByteSize()  # the stream's messages summed


def test_off_by_default(server: ServerProcess) -> None:
    resp = requests.get(f"{server.url}/v2/health/ready", headers={"x-request-id": "abc"}, timeout=10)
    assert resp.status_code == 200 and "x-request-id" not in resp.headers
