"""TorchServe's gRPC inference and management APIs, driven as a TorchServe user drives them.

The client side is what such a user has: stubs generated from the .proto files with
grpc_tools (tests/ts_stubs.py), archives made by the real ``torch-model-archiver``
(tests/mar.py), handlers written the way TorchServe documents them. The server is a real
``ovserve serve`` in its own process, serving a model repository and a model store.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
from google.protobuf import empty_pb2

from . import models
from .mar import SLOW_HANDLER, STREAM_HANDLER, build_mar, stage_add_model, write_model_config
from .servers import ServerProcess
from .ts_harness import (
    code_of,
    inference_pb2,
    management_pb2,
    management_pb2_grpc,
    predict,
    register,
    stubs,
    ts_server,
)

pytestmark = pytest.mark.integration


HANDLERS = {
    "stream_handler.py": STREAM_HANDLER,
    "slow_handler.py": SLOW_HANDLER,
    # a module with handle(): TorchServe calls handle(None, context) once to initialise it
    "fn_handler.py": '''
        import json
        import numpy as np

        def handle(data, context):
            if data is None:
                return None
            out = []
            for item in data:
                x = np.asarray(json.loads(item["data"]), dtype=np.float32).reshape(1, -1)
                y = context.model.infer({"x": x})["y"]
                out.append(json.dumps({"y": y.reshape(-1).tolist(), "model": context.model_name,
                                       "version": context.manifest["model"]["modelVersion"]}))
            return out
    ''',
    # a class: initialize(context) once per worker, then handle() per batch; state lives in the instance
    "class_handler.py": '''
        class Counter:
            def initialize(self, context):
                self.calls = 0
                self.batch_size = context.system_properties["batch_size"]

            def handle(self, data, context):
                self.calls += 1
                if data[0].get("data") == b"fail":
                    raise ValueError("the handler refuses 'fail'")
                if data[0].get("data") == b"status":
                    context.set_response_status(404, "nothing here", 0)
                    return ["x"]
                return [{"calls": self.calls, "batch": len(data), "batch_size": self.batch_size,
                         "header": context.get_request_header(i, "x-trace"),
                         "sequence": context.get_sequence_id(i)} for i in range(len(data))]
    ''',
    # TorchServe's streaming contract: intermediate messages, then the return value
    "yield_handler.py": '''
        def handle(data, context):
            if data is None:
                return None
            def gen():
                for word in ("one", "two", "three"):
                    yield [word for _ in data]
            return gen()
    ''',
    # TorchServe's stateful example: a sum per sequence, kept in the handler instance
    "stateful_handler.py": '''
        class Sums:
            def initialize(self, context):
                self.sums = {}

            def handle(self, data, context):
                out = []
                for i, item in enumerate(data):
                    seq = context.get_sequence_id(i)
                    self.sums[seq] = self.sums.get(seq, 0) + int(item["data"])
                    out.append(f"{seq}={self.sums[seq]} by {id(self)}")
                return out
    ''',
    # a + b through context.model, on a model with several infer requests: the handler answers each item
    # with its sum or with the error the server raised for it
    "pair_handler.py": '''
        import json
        import numpy as np

        def handle(data, context):
            if data is None:
                return None
            out = []
            for item in data:
                body = json.loads(item["data"])
                inputs = {k: np.asarray(body[k], dtype=np.float32) for k in ("a", "b")}
                try:
                    out.append(json.dumps({"sum": context.model.infer(inputs, ["sum"])["sum"].tolist()}))
                except Exception as exc:
                    out.append(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
            return out
    ''',
    "broken_handler.py": '''
        class Broken:
            def initialize(self, context):
                raise RuntimeError("cannot start: no licence file")

            def handle(self, data, context):
                return ["never"]
    ''',
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model store with archives of the add model (x [-1,16] -> y = x + 1) and its handlers."""
    root = tmp_path_factory.mktemp("ts")
    built, xml, bin_ = stage_add_model(root, HANDLERS)
    out = root / "store"
    build_mar(out, "fn", "1.0", xml, [bin_], handler=built / "fn_handler.py")
    build_mar(out / "v2", "fn", "2.0", xml, [bin_], handler=built / "fn_handler.py")
    build_mar(out, "counter", "1.0", xml, [bin_], handler=built / "class_handler.py",
              config_file=write_model_config(built / "counter", min_workers=1, max_workers=1))
    build_mar(out, "stream", "1.0", xml, [bin_], handler=built / "stream_handler.py")
    build_mar(out, "yielder", "1.0", xml, [bin_], handler=built / "yield_handler.py")
    build_mar(out, "slow", "1.0", xml, [bin_], handler=built / "slow_handler.py",
              config_file=write_model_config(built / "slow", min_workers=1, response_timeout=1))
    build_mar(out, "tensors", "1.0", xml, [bin_])  # no handler of its own: base_handler
    # the model file named as the model, beside another .xml the handler reads: the model is the serialized file
    named = built / "named"
    named.mkdir()
    (named / "add.xml").write_bytes(xml.read_bytes())
    (named / "add.bin").write_bytes(bin_.read_bytes())
    (named / "settings.xml").write_text("<settings/>")
    build_mar(out, "named", "3.1", named / "add.xml", [named / "add.bin", named / "settings.xml"])
    build_mar(out, "broken", "1.0", xml, [bin_], handler=built / "broken_handler.py")
    pair = models.save(models.two_in_two_out(), built, "pair") / "model.xml"
    build_mar(out, "pair", "1.0", pair, [pair.with_suffix(".bin")], handler=built / "pair_handler.py",
              config_file=write_model_config(built / "pair_config", min_workers=1, max_workers=1))
    build_mar(out, "sums", "1.0", xml, [bin_], handler=built / "stateful_handler.py",
              config_file=write_model_config(built / "sums", min_workers=2, max_workers=2, batch_size=2,
                                             max_batch_delay=5, sequence_batching=True,
                                             sequenceMaxIdleMSec=400, maxNumSequence=2))
    return out


@pytest.fixture(scope="module")
def server(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ts_server(tmp_path_factory, store) as proc:
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


def v2_body(values: list[float]) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": values}]}).encode()


# -- inference: the repository's models through the built-in handlers ---------------------------------

def test_ping_answers_torchserve_health_json(inference: Any) -> None:
    reply = inference.Ping(empty_pb2.Empty(), timeout=10)
    assert json.loads(reply.health) == {"status": "Healthy"}


def test_repository_model_answers_a_v2_tensor_document(inference: Any) -> None:
    doc = json.loads(predict(inference, "add", v2_body([float(i) for i in range(16)])))
    (out,) = doc["outputs"]
    assert out["name"] == "y" and out["shape"] == [1, 16]
    assert out["data"] == [float(i) + 1 for i in range(16)]


def test_repository_model_answers_v1_instances(inference: Any) -> None:
    doc = json.loads(predict(inference, "add", json.dumps({"instances": [[2.0] * 16]}).encode()))
    assert doc["predictions"] == [[3.0] * 16]


@pytest.mark.parametrize("model, version, code, words", [
    ("nope", "", grpc.StatusCode.NOT_FOUND, "nope"),              # TorchServe: INTERNAL
    ("add", "7", grpc.StatusCode.NOT_FOUND, "7"),
    ("", "", grpc.StatusCode.INVALID_ARGUMENT, "model_name"),     # TorchServe: INTERNAL
])
def test_unknown_or_unnamed_model_gets_the_right_code(inference: Any, model: str, version: str,
                                                      code: grpc.StatusCode, words: str) -> None:
    got, details = code_of(lambda: predict(inference, model, b"{}", version))
    assert got is code and words in details


def test_bad_tensor_document_is_invalid_argument_and_the_model_serves_on(inference: Any) -> None:
    got, details = code_of(lambda: predict(inference, "add", b"{not json"))
    assert got is grpc.StatusCode.INVALID_ARGUMENT, details
    got, details = code_of(lambda: predict(inference, "add", v2_body([1.0] * 15)))
    assert got is grpc.StatusCode.INVALID_ARGUMENT, details
    assert json.loads(predict(inference, "add", v2_body([0.0] * 16)))["outputs"][0]["data"] == [1.0] * 16


def test_32_concurrent_predictions_each_get_their_own_answer(inference: Any) -> None:
    results: dict[int, Any] = {}

    def one(i: int) -> None:
        results[i] = json.loads(predict(inference, "add", v2_body([float(i)] * 16)))["outputs"][0]["data"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: [float(i) + 1] * 16 for i in range(32)}


# -- registration, custom handlers, and the same model over KServe V2 -----------------------------------

def test_register_infer_over_both_apis_and_unregister(server: ServerProcess, inference: Any,
                                                      management: Any) -> None:
    msg = register(management, "fn.mar")
    try:
        _registered_fn_serves_both_apis(server, inference, management, msg)
    finally:  # whatever failed, the next test starts without it
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="fn"))
    got, _ = code_of(lambda: predict(inference, "fn", b"[]"))
    assert got is grpc.StatusCode.NOT_FOUND
    assert requests.get(f"{server.url}/v2/models/fn", timeout=10).status_code == 404


def _registered_fn_serves_both_apis(server: ServerProcess, inference: Any, management: Any, msg: str) -> None:
    assert msg == 'Model "fn" Version: 1.0 registered with 1 initial workers'
    doc = json.loads(predict(inference, "fn", json.dumps([1.0] * 16).encode()))
    assert doc == {"y": [2.0] * 16, "model": "fn", "version": "1.0"}
    # the registered model is a KServe V2 model too
    r = requests.post(f"{server.url}/v2/models/fn/infer", json=json.loads(v2_body([5.0] * 16)), timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [6.0] * 16 and r.json()["model_version"] == "1.0"
    listed = json.loads(management.ListModels(management_pb2.ListModelsRequest(), timeout=10).msg)
    assert {"modelName": "fn", "modelUrl": "fn.mar"} in listed["models"]
    (described,) = json.loads(management.DescribeModel(management_pb2.DescribeModelRequest(model_name="fn")).msg)
    assert described["modelVersion"] == "1.0" and len(described["workers"]) == 1
    assert described["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
    # the log says the version by the name it was registered under, as every answer does (issue 37, item 13)
    assert "model fn version 1.0: AVAILABLE" in server.wait_log("model fn version 1.0: AVAILABLE", timeout=5)
    got, details = code_of(lambda: register(management, "fn.mar"))
    assert got is grpc.StatusCode.ALREADY_EXISTS and "1.0" in details  # TorchServe: UNKNOWN, no details
    assert management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="fn")).msg == \
        'Model "fn" unregistered'
    register(management, "fn.mar")  # for the finally above


def test_versions_default_and_set_default(inference: Any, management: Any) -> None:
    register(management, "fn.mar")
    register(management, "v2/fn.mar")
    try:
        body = json.dumps([0.0] * 16).encode()
        assert json.loads(predict(inference, "fn", body))["version"] == "1.0"  # the first registered
        assert json.loads(predict(inference, "fn", body, version="2.0"))["version"] == "2.0"
        got, details = code_of(lambda: management.UnregisterModel(
            management_pb2.UnregisterModelRequest(model_name="fn")))
        assert got is grpc.StatusCode.FAILED_PRECONDITION, details  # TorchServe: UNKNOWN
        msg = management.SetDefault(management_pb2.SetDefaultRequest(model_name="fn", model_version="2.0")).msg
        assert msg == 'Default version successfully updated for model "fn" to "2.0"'
        assert json.loads(predict(inference, "fn", body))["version"] == "2.0"
        every = json.loads(management.DescribeModel(
            management_pb2.DescribeModelRequest(model_name="fn", model_version="all")).msg)
        assert sorted(d["modelVersion"] for d in every) == ["1.0", "2.0"]
    finally:
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="fn", model_version="1.0"))
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="fn", model_version="2.0"))


def test_class_handler_keeps_state_reads_headers_and_fails_alone(inference: Any, management: Any) -> None:
    register(management, "counter.mar", initial_workers=3)  # model-config.yaml's min/max 1 win
    try:
        first = json.loads(inference.Predictions(inference_pb2.PredictionsRequest(
            model_name="counter", input={"data": b"x"}), metadata=[("x-trace", "abc")], timeout=30).prediction)
        assert first["header"] == "abc" and first["batch"] == 1
        got, details = code_of(lambda: predict(inference, "counter", b"fail"))
        assert got is grpc.StatusCode.INTERNAL and "the handler refuses 'fail'" in details  # TorchServe: UNAVAILABLE
        got, details = code_of(lambda: predict(inference, "counter", b"status"))
        assert got is grpc.StatusCode.NOT_FOUND and "nothing here" in details
        again = json.loads(predict(inference, "counter", b"x"))
        assert again["calls"] == first["calls"] + 3  # one worker, its state kept across calls
        (described,) = json.loads(management.DescribeModel(
            management_pb2.DescribeModelRequest(model_name="counter")).msg)
        assert described["minWorkers"] == 1 and described["maxWorkers"] == 1
    finally:
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="counter"))


def test_stream_predictions_sends_intermediate_messages_in_order(inference: Any, management: Any) -> None:
    register(management, "stream.mar")
    register(management, "yielder.mar")
    try:
        replies = [bytes(r.prediction) for r in inference.StreamPredictions(
            inference_pb2.PredictionsRequest(model_name="stream", input={"data": b"3"}), timeout=30)]
        assert replies == [b"part 0", b"part 1", b"part 2", b"done"]
        replies = [bytes(r.prediction) for r in inference.StreamPredictions(
            inference_pb2.PredictionsRequest(model_name="yielder", input={"data": b""}), timeout=30)]
        assert replies == [b"one", b"two", b"three"]
        # a handler that never streams: its one message and OK (TorchServe: "Worker died")
        replies = [bytes(r.prediction) for r in inference.StreamPredictions(
            inference_pb2.PredictionsRequest(model_name="add", input={"data": v2_body([0.0] * 16)}), timeout=30)]
        assert len(replies) == 1 and json.loads(replies[0])["outputs"][0]["data"] == [1.0] * 16
    finally:
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="stream"))
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="yielder"))


def test_stream_predictions2_echoes_sequence_ids_and_answers_errors_in_band(inference: Any) -> None:
    def requests_() -> Iterator[Any]:
        yield inference_pb2.PredictionsRequest(model_name="add", input={"data": v2_body([1.0] * 16)},
                                               sequence_id="s-1")
        yield inference_pb2.PredictionsRequest(model_name="nope", input={"data": b"{}"}, sequence_id="s-2")
        yield inference_pb2.PredictionsRequest(model_name="add", input={"data": v2_body([2.0] * 16)},
                                               sequence_id="s-3")
        # the client half-closes here: every answer still comes

    replies = list(inference.StreamPredictions2(requests_(), timeout=30))
    assert [r.sequence_id for r in replies] == ["s-1", "s-2", "s-3"]
    assert json.loads(replies[0].prediction)["outputs"][0]["data"] == [2.0] * 16
    assert replies[1].status.code == grpc.StatusCode.NOT_FOUND.value[0] and "nope" in replies[1].status.message
    assert json.loads(replies[2].prediction)["outputs"][0]["data"] == [3.0] * 16


def test_slow_handler_times_out_and_its_worker_recovers(inference: Any, management: Any) -> None:
    register(management, "slow.mar")
    try:
        got, details = code_of(lambda: predict(inference, "slow", b"3"))
        assert got is grpc.StatusCode.DEADLINE_EXCEEDED and "response timeout" in details
        assert predict(inference, "slow", b"0") == b"slept"
    finally:
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="slow"))


def test_zero_workers_is_unavailable_until_scaled(inference: Any, management: Any) -> None:
    msg = register(management, "tensors.mar", initial_workers=0, synchronous=False)
    assert "0 initial workers" in msg
    try:
        got, details = code_of(lambda: predict(inference, "tensors", v2_body([0.0] * 16)))
        assert got is grpc.StatusCode.UNAVAILABLE and "workers" in details
        msg = management.ScaleWorker(management_pb2.ScaleWorkerRequest(
            model_name="tensors", min_worker=2, synchronous=True), timeout=30).msg
        assert "2" in msg
        assert json.loads(predict(inference, "tensors", v2_body([0.0] * 16)))["outputs"][0]["data"] == [1.0] * 16
        got, _ = code_of(lambda: management.ScaleWorker(management_pb2.ScaleWorkerRequest(
            model_name="tensors", min_worker=3, max_worker=2)))
        assert got is grpc.StatusCode.INVALID_ARGUMENT
    finally:
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="tensors"))


def test_list_models_pages(management: Any) -> None:
    doc = json.loads(management.ListModels(management_pb2.ListModelsRequest(limit=0)).msg)
    assert [m["modelName"] for m in doc["models"]] == ["add"] and "nextPageToken" not in doc  # TorchServe: empty
    got, _ = code_of(lambda: management.ListModels(management_pb2.ListModelsRequest(limit=1001)))
    assert got is grpc.StatusCode.INVALID_ARGUMENT


def test_management_refuses_bad_requests_by_name(management: Any) -> None:
    got, details = code_of(lambda: register(management, ""))
    assert got is grpc.StatusCode.INVALID_ARGUMENT and "url" in details
    for field in ("batch_size", "max_batch_delay", "response_timeout", "initial_workers"):
        got, details = code_of(lambda field=field: register(management, "fn.mar", **{field: -1}))
        assert got is grpc.StatusCode.INVALID_ARGUMENT and field in details
    got, details = code_of(lambda: management.ScaleWorker(management_pb2.ScaleWorkerRequest(
        model_name="add", min_worker=-2)))
    assert got is grpc.StatusCode.INVALID_ARGUMENT and "min_worker" in details
    got, details = code_of(lambda: management.DescribeModel(management_pb2.DescribeModelRequest(model_name="")))
    assert got is grpc.StatusCode.INVALID_ARGUMENT and "model_name" in details
    got, _ = code_of(lambda: management.DescribeModel(management_pb2.DescribeModelRequest(model_name="nope")))
    assert got is grpc.StatusCode.NOT_FOUND
    got, _ = code_of(lambda: management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="add")))
    assert got is grpc.StatusCode.FAILED_PRECONDITION


def test_registration_is_refused_without_the_model_api(store: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    models.save(models.add_one(), repo, "add")
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0",
                          "--ts-management-port", "0", "--model-store", str(store)]).wait_ready()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{proc.ports['ts-management']}") as channel:
            stub = management_pb2_grpc.ManagementAPIsServiceStub(channel)
            got, details = code_of(lambda: register(stub, "fn.mar"))
            assert got is grpc.StatusCode.PERMISSION_DENIED and "--ts-model-api" in details
            # reading is allowed
            listed = json.loads(stub.ListModels(management_pb2.ListModelsRequest()).msg)
            assert listed["models"][0]["modelName"] == "add"
        assert proc.ports.get("ts-inference") == 0  # not asked for: not there
    finally:
        proc.stop()


def test_requests_are_batched_for_the_handler_as_registered(inference: Any, management: Any) -> None:
    register(management, "counter.mar", batch_size=4, max_batch_delay=2000)
    try:
        replies: list[Any] = []

        def one() -> None:
            replies.append(json.loads(predict(inference, "counter", b"x")))

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # one worker (model-config.yaml), four requests within the delay: one handle() call for all four
        assert [r["batch"] for r in replies] == [4, 4, 4, 4]
        assert {r["batch_size"] for r in replies} == {4} and len({r["calls"] for r in replies}) == 1
    finally:
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="counter"))


@pytest.mark.parametrize("url, code", [
    ("http://127.0.0.1:9/fn.mar", grpc.StatusCode.PERMISSION_DENIED),    # SSRF (CVE-2023-43654)
    ("http://169.254.169.254/latest/meta-data", grpc.StatusCode.PERMISSION_DENIED),
    ("file:///etc/passwd", grpc.StatusCode.PERMISSION_DENIED),
    # '..' is refused however it is spelled, before anything is looked up (CVE-2024-35198)
    ("../store/fn.mar", grpc.StatusCode.INVALID_ARGUMENT),
    ("%2e%2e/store/fn.mar", grpc.StatusCode.INVALID_ARGUMENT),
    ("missing.mar", grpc.StatusCode.NOT_FOUND),
])
def test_register_refuses_urls_outside_the_store_and_the_allow_list(inference: Any, management: Any, url: str,
                                                                    code: grpc.StatusCode) -> None:
    got, details = code_of(lambda: register(management, url))
    assert got is code, details
    assert json.loads(predict(inference, "add", v2_body([0.0] * 16)))["outputs"][0]["data"] == [1.0] * 16


def test_sequences_keep_their_state_on_one_worker_and_idle_ones_are_released(inference: Any,
                                                                            management: Any) -> None:
    register(management, "sums.mar")
    try:
        def stream(*steps: tuple[str, int]) -> list[Any]:
            return list(inference.StreamPredictions2(iter([
                inference_pb2.PredictionsRequest(model_name="sums", input={"data": str(n).encode()}, sequence_id=seq)
                for seq, n in steps]), timeout=30))

        replies = stream(("a", 1), ("b", 10), ("a", 2), ("b", 20), ("a", 3))
        got = [r.prediction.decode().split(" by ") for r in replies]
        assert [g[0] for g in got] == ["a=1", "b=10", "a=3", "b=30", "a=6"]
        by_seq = {seq: {w for s, w in ((g[0][0], g[1]) for g in got) if s == seq} for seq in "ab"}
        assert len(by_seq["a"]) == 1 and len(by_seq["b"]) == 1 and by_seq["a"] != by_seq["b"]  # one worker each
        # two sequences are open (maxNumSequence 2): a third waits for one to be released
        (third,) = stream(("c", 5))
        assert third.status.code == grpc.StatusCode.UNAVAILABLE.value[0] and "maxNumSequence" in third.status.message
        (described,) = json.loads(management.DescribeModel(
            management_pb2.DescribeModelRequest(model_name="sums")).msg)
        assert described["sequenceBatching"] is True and described["openSequences"] == 2
        deadline = time.monotonic() + 10
        while described["openSequences"] and time.monotonic() < deadline:  # idle past 400 ms: released
            time.sleep(0.1)
            (described,) = json.loads(management.DescribeModel(
                management_pb2.DescribeModelRequest(model_name="sums")).msg)
        assert described["openSequences"] == 0
        (third,) = stream(("c", 5))
        assert third.prediction.decode().startswith("c=5")
    finally:
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="sums"))


def test_the_serialized_file_is_the_model_whatever_else_the_archive_holds(inference: Any, management: Any) -> None:
    assert register(management, "named.mar") == 'Model "named" Version: 3.1 registered with 1 initial workers'
    try:
        doc = json.loads(predict(inference, "named", v2_body([1.0] * 16), version="3.1"))
        assert doc["outputs"][0]["data"] == [2.0] * 16
    finally:
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="named"))


def test_ping_is_unhealthy_while_a_default_version_lacks_its_workers(inference: Any, management: Any) -> None:
    # synchronous: the failure is the answer; asynchronous: the model stays, without its worker
    got, details = code_of(lambda: register(management, "broken.mar"))
    assert got is grpc.StatusCode.INVALID_ARGUMENT and "no licence file" in details
    register(management, "broken.mar", synchronous=False)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            health = json.loads(inference.Ping(empty_pb2.Empty(), timeout=10).health)
            if health["status"] == "Unhealthy":
                break
            time.sleep(0.05)
        assert health == {"status": "Unhealthy"}
        got, details = code_of(lambda: predict(inference, "broken", b"x"))
        assert got is grpc.StatusCode.UNAVAILABLE and "no workers" in details
    finally:
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="broken"))
    assert json.loads(inference.Ping(empty_pb2.Empty(), timeout=10).health) == {"status": "Healthy"}


def test_a_failed_inference_in_a_handler_fails_no_later_request(inference: Any, management: Any) -> None:
    """Issue 32 on the TorchServe path: ``context.model`` runs through the server's own inference path, so an
    inference OpenVINO failed (``a`` [2,4] + ``b`` [3,4]) must not fail any later valid one."""
    assert "registered" in register(management, "pair.mar")
    rng = np.random.default_rng(7)

    def send(rows_b: int) -> tuple[dict[str, Any], np.ndarray]:
        a, b = rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal((rows_b, 4)).astype(np.float32)
        body = json.dumps({"a": a.tolist(), "b": b.tolist()}).encode()
        return json.loads(predict(inference, "pair", body)), a + b if rows_b == 2 else a

    try:
        for _ in range(4):
            doc, want = send(2)
            np.testing.assert_allclose(doc["sum"], want, rtol=1e-6)
        doc, _ = send(3)
        assert "cannot compute inputs of these shapes (a [2,4], b [3,4])" in doc["error"], doc
        for _ in range(12):  # the model's infer requests drawn many times over
            doc, want = send(2)
            assert "sum" in doc, doc
            np.testing.assert_allclose(doc["sum"], want, rtol=1e-6)
    finally:
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="pair"))
