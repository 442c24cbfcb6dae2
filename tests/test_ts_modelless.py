"""Issue 34, part 2: archives whose handler does all the work itself, with no OpenVINO model.

TorchServe serves an archive without a serialized file (an echo, a pre/post-processing service, a
handler that builds its own model in ``initialize``); so does ovserve, in worker processes (the default)
and in threads (``--ts-workers thread``): every TorchServe RPC works for it, its ``context.model`` is None,
and KServe V2/V1 inference on it answers FAILED_PRECONDITION (REST 412) saying where it is served, while
its metadata, readiness and the repository index describe it as the loaded model it is. The archives are
made by the real ``torch-model-archiver``; the client is TorchServe's own gRPC stubs.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from .mar import build_mar, write_model_config
from .servers import ServerProcess
from .ts_harness import code_of, describe, inference_pb2, management_pb2, predict, register, stubs, ts_server

pytestmark = pytest.mark.integration


#: the issue's example, verbatim: TorchServe's seed example of StreamPredictions
INTERMEDIATE_HANDLER = '''from ts.protocol.otf_message_handler import send_intermediate_predict_response

def handle(data, context):
    if type(data) is list:
        for i in range (3):
            send_intermediate_predict_response(["intermediate_response"], context.request_ids, "Intermediate Prediction success", 200, context)
        return ["hello world "]
'''  # noqa: E501 (verbatim)

#: answers each request's body as it came; "model" reaches for context.model
ECHO_HANDLER = '''import os


def handle(data, context):
    if data is None:
        return None
    out = []
    for item in data:
        body = item.get("data") or item.get("body")
        if body == b"model":
            context.model.infer({"x": [1.0]})
        if body == b"whoami":
            body = ("model is None" if context.model is None else "a model") + f" pid {os.getpid()}"
        out.append(body)
    return out
'''

#: builds its own "model" in initialize: numpy weights from a file of the archive (an extra file)
WEIGHTS_HANDLER = '''import json
import os

import numpy as np


class Linear:
    def initialize(self, context):
        folder = context.system_properties["model_dir"]
        self.w = np.load(os.path.join(folder, "weights.npy"))
        self.has_model = context.model is not None
        self.version = context.manifest["model"]["modelVersion"]

    def handle(self, data, context):
        out = []
        for item in data:
            x = np.asarray(json.loads(item["data"]), dtype=np.float32)
            out.append(json.dumps({"y": (x @ self.w).tolist(), "has_model": self.has_model,
                                   "version": self.version}))
        return out
'''

#: a TorchServe handler for a TorchScript model: it needs torch, which ovserve's environment need not have
TORCH_HANDLER = '''import torch


def handle(data, context):
    return ["never"]
'''

WEIGHTS = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=np.float32)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("modelless")
    src = root / "src"
    src.mkdir()
    handlers = {"intermediate.py": INTERMEDIATE_HANDLER, "echo.py": ECHO_HANDLER, "linear.py": WEIGHTS_HANDLER,
                "torch_handler.py": TORCH_HANDLER}
    for file, code in handlers.items():
        (src / file).write_text(code)
    np.save(src / "weights.npy", WEIGHTS)
    out = root / "store"
    # no --serialized-file anywhere: the handler is the whole service
    build_mar(out, "intermediate", "1.0", None, handler=src / "intermediate.py")
    build_mar(out, "echo", "1.0", None, handler=src / "echo.py",
              config_file=write_model_config(src / "echo", min_workers=1, max_workers=1))
    build_mar(out / "v2", "echo", "2.0", None, handler=src / "echo.py")
    build_mar(out, "linear", "1.0", None, [src / "weights.npy"], handler=src / "linear.py")
    build_mar(out, "nothing", "1.0", None)  # base_handler and no model: nothing to run
    scripted = src / "model.pt"
    scripted.write_bytes(b"PK\x03\x04 a TorchScript zip")
    build_mar(out, "scripted", "1.0", scripted, handler=src / "torch_handler.py")
    return out


@pytest.fixture(scope="module", params=["process", "thread"])
def server(request: pytest.FixtureRequest, store: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ts_server(tmp_path_factory, store, "--ts-workers", request.param) as proc:
        yield proc


@pytest.fixture(scope="module")
def both(server: ServerProcess) -> Iterator[tuple[Any, Any]]:
    with stubs(server) as pair:
        yield pair


@pytest.fixture(scope="module")
def inference(both: tuple[Any, Any]) -> Any:
    return both[0]


@pytest.fixture(scope="module")
def management(both: tuple[Any, Any]) -> Any:
    return both[1]


def unregister(management: Any, name: str, version: str = "") -> str:
    return str(management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name=name,
                                                                                model_version=version)).msg)


def test_the_issues_streaming_example_answers_as_on_torchserve(inference: Any, management: Any) -> None:
    assert register(management, "intermediate.mar") == \
        'Model "intermediate" Version: 1.0 registered with 1 initial workers'
    try:
        replies = [bytes(r.prediction) for r in inference.StreamPredictions(
            inference_pb2.PredictionsRequest(model_name="intermediate", input={"data": b"hi"}), timeout=30)]
        assert replies == [b"intermediate_response"] * 3 + [b"hello world "]
        assert predict(inference, "intermediate", b"hi") == b"hello world "

        def stream2() -> Iterator[Any]:
            for i in range(2):
                yield inference_pb2.PredictionsRequest(model_name="intermediate", input={"data": b"x"},
                                                       sequence_id=f"s-{i}")

        # StreamPredictions2: each request's intermediate messages, then its answer, in the order sent
        replies2 = [(bytes(r.prediction), r.sequence_id) for r in inference.StreamPredictions2(stream2(), timeout=30)]
        assert replies2 == [
            item for seq in ("s-0", "s-1")
            for item in [(b"intermediate_response", seq)] * 3 + [(b"hello world ", seq)]]
    finally:
        unregister(management, "intermediate")


def test_an_echo_without_a_model_serves_every_torchserve_call(server: ServerProcess, inference: Any,
                                                              management: Any) -> None:
    register(management, "echo.mar")
    try:
        assert predict(inference, "echo", b"ping") == b"ping"
        assert predict(inference, "echo", b"whoami").startswith(b"model is None pid ")
        # a handler that reaches for context.model fails alone, saying why, and the model serves on
        got, details = code_of(lambda: predict(inference, "echo", b"model"))
        assert got is grpc.StatusCode.INTERNAL and "NoneType" in details and "infer" in details, details
        assert predict(inference, "echo", b"again") == b"again"

        (described,) = describe(management, "echo")
        assert (described["modelName"], described["modelVersion"], described["modelUrl"]) == ("echo", "1.0",
                                                                                               "echo.mar")
        assert described["inputs"] == [] and described["outputs"] == [], described
        assert described["handler"] == "echo.py" and described["state"] == "AVAILABLE"
        assert len(described["workers"]) == 1
        listed = json.loads(management.ListModels(management_pb2.ListModelsRequest(), timeout=10).msg)
        assert {"modelName": "echo", "modelUrl": "echo.mar"} in listed["models"]

        msg = management.ScaleWorker(management_pb2.ScaleWorkerRequest(
            model_name="echo", min_worker=2, max_worker=2, synchronous=True), timeout=60).msg
        assert "2" in msg
        (described,) = describe(management, "echo")
        assert len(described["workers"]) == 2
        if "--ts-workers" in server.args and server.args[server.args.index("--ts-workers") + 1] == "process":
            pids = {predict(inference, "echo", b"whoami").split(b" pid ")[1] for _ in range(20)}
            assert str(server.pid).encode() not in pids  # the handler ran in worker processes

        # versions: a second handler-only version, the default, SetDefault, unregistering each
        register(management, "v2/echo.mar")
        assert predict(inference, "echo", b"one", version="2.0") == b"one"
        assert sorted(d["modelVersion"] for d in describe(management, "echo", "all")) == ["1.0", "2.0"]
        got, _ = code_of(lambda: unregister(management, "echo"))
        assert got is grpc.StatusCode.FAILED_PRECONDITION
        assert management.SetDefault(management_pb2.SetDefaultRequest(model_name="echo", model_version="2.0")).msg \
            == 'Default version successfully updated for model "echo" to "2.0"'
        (described,) = describe(management, "echo")
        assert described["modelVersion"] == "2.0"
        assert unregister(management, "echo", "1.0") == 'Model "echo" version 1.0 unregistered'
        assert predict(inference, "echo", b"still") == b"still"
    finally:
        for version in ("1.0", "2.0"):
            with contextlib.suppress(grpc.RpcError):
                unregister(management, "echo", version)
    got, _ = code_of(lambda: predict(inference, "echo", b"gone"))
    assert got is grpc.StatusCode.NOT_FOUND
    assert requests.get(f"{server.url}/v2/models/echo", timeout=10).status_code == 404


def test_a_handler_that_builds_its_own_model_in_initialize(inference: Any, management: Any) -> None:
    register(management, "linear.mar")
    try:
        doc = json.loads(predict(inference, "linear", json.dumps([1.0, 1.0, 1.0]).encode()))
        assert doc == {"y": (np.ones(3, np.float32) @ WEIGHTS).tolist(), "has_model": False, "version": "1.0"}
        (described,) = describe(management, "linear")
        assert described["inputs"] == [] and described["outputs"] == [] and described["handler"] == "linear.py"
    finally:
        unregister(management, "linear")


def test_kserve_describes_it_and_says_where_it_is_served(server: ServerProcess, management: Any) -> None:
    register(management, "echo.mar")
    why = "served by its TorchServe handler alone"
    try:
        # loaded and serving: metadata without inputs or outputs, ready, READY in the index
        r = requests.get(f"{server.url}/v2/models/echo", timeout=10)
        assert r.status_code == 200, r.text
        assert r.json() == {"name": "echo", "versions": ["1.0"], "platform": "torchserve_handler",
                            "inputs": [], "outputs": []}
        assert requests.get(f"{server.url}/v2/models/echo/ready", timeout=10).status_code == 200
        assert requests.get(f"{server.url}/v2/models/echo/versions/1.0/ready", timeout=10).status_code == 200
        index = requests.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
        assert {"name": "echo", "version": "1.0", "state": "READY", "reason": ""} in index, index
        v1 = requests.get(f"{server.url}/v1/models/echo", timeout=10)
        assert v1.status_code == 200 and v1.json()["ready"] is True, v1.text

        # inference: FAILED_PRECONDITION (412) naming why and where to go instead
        body = {"inputs": [{"name": "data", "shape": [1], "datatype": "BYTES", "data": ["ping"]}]}
        r = requests.post(f"{server.url}/v2/models/echo/infer", json=body, timeout=10)
        assert r.status_code == 412 and why in r.json()["error"] and "Predictions" in r.json()["error"], r.text
        r = requests.post(f"{server.url}/v1/models/echo:predict", json={"instances": ["ping"]}, timeout=10)
        assert r.status_code == 412 and why in r.json()["error"], r.text

        with tgrpc.InferenceServerClient(server.grpc_target) as client:
            assert client.is_model_ready("echo")
            md = client.get_model_metadata("echo", as_json=True)
            assert md["platform"] == "torchserve_handler" and md["versions"] == ["1.0"], md
            assert not md.get("inputs") and not md.get("outputs"), md
            tensor = tgrpc.InferInput("data", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([b"ping"], dtype=object))
            with pytest.raises(InferenceServerException) as err:
                client.infer("echo", [tensor])
            assert "FAILED_PRECONDITION" in str(err.value.status()) and why in err.value.message(), err.value
        # the OpenVINO model beside it is untouched
        add = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]}
        r = requests.post(f"{server.url}/v2/models/add/infer", json=add, timeout=10)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0] * 16, r.text
    finally:
        unregister(management, "echo")


@pytest.mark.parametrize("url, words", [
    # a TorchScript serialized file is not what ovserve runs: refused, naming it and both ways out
    ("scripted.mar", ["'model.pt' is not an OpenVINO model", "--extra-files"]),
    # no model and no handler of its own: the built-in handler would have nothing to run
    ("nothing.mar", ["holds no OpenVINO model", "'base_handler'", "a handler of its own"]),
])
def test_what_cannot_be_served_is_refused_by_name(inference: Any, management: Any, url: str,
                                                  words: list[str]) -> None:
    got, details = code_of(lambda: register(management, url))
    assert got is grpc.StatusCode.FAILED_PRECONDITION, details
    assert all(w in details for w in words), details
    listed = json.loads(management.ListModels(management_pb2.ListModelsRequest(), timeout=10).msg)
    assert [m["modelName"] for m in listed["models"]] == ["add"]  # nothing half-registered is left
    # the same archive without a model, its built-in handler replaced by one of its own at registration
    if url == "nothing.mar":
        got, details = code_of(lambda: register(management, url, handler="tensor"))
        assert got is grpc.StatusCode.FAILED_PRECONDITION and "'tensor'" in details, details
