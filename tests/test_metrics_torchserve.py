"""Metrics through TorchServe's gRPC inference API (api="TorchServe"), driven with the stubs a TorchServe
user generates (tests/ts_stubs.py): Predictions and each message of StreamPredictions2 counted, failures
of a loaded model too, and the handler's time in ovserve_handler_seconds."""
from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from . import models
from .test_metrics_server import scrape
from .ts_stubs import ts_stubs

pytestmark = pytest.mark.integration

ts = ts_stubs()
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}).encode()


def labels(method: str) -> str:
    return f'{{api="TorchServe",interface="gRPC",method="{method}",name="add",version="1"}}'


def test_torchserve_predictions_are_counted(start_server, tmp_path: Path) -> None:
    models.save(models.add_one(), tmp_path / "repo", "add")
    server = start_server("--model-repository", tmp_path / "repo", "--poll-interval", "0", "--metrics-enable",
                          "--ts-inference-port", "0")
    m = scrape(server.url + "/metrics")
    assert m["ovms_requests_success" + labels("Predictions")] == 0  # at 0 from load
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-inference']}") as channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        for _ in range(2):
            stub.Predictions(ts.inference_pb2.PredictionsRequest(model_name="add", input={"data": BODY}), timeout=60)
        with pytest.raises(grpc.RpcError) as err:
            stub.Predictions(ts.inference_pb2.PredictionsRequest(model_name="add", input={"data": b"{bad"}),
                             timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError):  # no such model: counted nowhere
            stub.Predictions(ts.inference_pb2.PredictionsRequest(model_name="nope", input={"data": BODY}), timeout=60)
        replies = list(stub.StreamPredictions2(iter([
            ts.inference_pb2.PredictionsRequest(model_name="add", input={"data": BODY}, sequence_id=f"s{i}")
            for i in range(3)]), timeout=60))
        assert len(replies) == 3 and all(not r.HasField("status") or r.status.code == 0 for r in replies)
    m = scrape(server.url + "/metrics")
    assert m["ovms_requests_success" + labels("Predictions")] == 2
    assert m["ovms_requests_fail" + labels("Predictions")] == 1
    assert m["ovms_requests_success" + labels("StreamPredictions2")] == 3
    assert not any('name="nope"' in s for s in m)
    assert m['ovms_request_time_us_count{interface="gRPC",name="add",version="1"}'] == 2 + 3
    # every handler call (the failing one too), and the inferences the handler ran through the model server
    assert m['ovserve_handler_seconds_count{name="add",version="1"}'] == 2 + 1 + 3
    assert m['ovserve_handler_seconds_sum{name="add",version="1"}'] > 0
    assert m['ovms_inference_time_us_count{name="add",version="1"}'] == 2 + 3


def test_set_default_moves_the_count_of_unversioned_predictions(start_server, tmp_path: Path) -> None:
    """SetDefault (TorchServe's management API) chooses the version a call naming none goes to; its metrics
    follow at once: the registry tells the metrics (``on_default``) to resolve "" afresh."""
    for version in (1, 2):
        models.save(models.add_one(), tmp_path / "repo", "add", version)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_config_list": [{"config": {
        "name": "add", "base_path": str(tmp_path / "repo" / "add"), "model_version_policy": {"all": {}}}}]}))
    server = start_server("--config", config, "--poll-interval", "0", "--metrics-enable",
                          "--ts-inference-port", "0", "--ts-management-port", "0")

    def counted(version: str) -> float:
        key = f'{{api="TorchServe",interface="gRPC",method="Predictions",name="add",version="{version}"}}'
        return scrape(server.url + "/metrics")["ovms_requests_success" + key]

    with grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-inference']}") as inference, \
            grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-management']}") as management:
        predict = ts.inference_pb2_grpc.InferenceAPIsServiceStub(inference).Predictions
        manage = ts.management_pb2_grpc.ManagementAPIsServiceStub(management)
        predict(ts.inference_pb2.PredictionsRequest(model_name="add", input={"data": BODY}), timeout=60)
        assert (counted("1"), counted("2")) == (0, 1)  # the latest, by default
        manage.SetDefault(ts.management_pb2.SetDefaultRequest(model_name="add", model_version="1"), timeout=10)
        for _ in range(2):
            predict(ts.inference_pb2.PredictionsRequest(model_name="add", input={"data": BODY}), timeout=60)
        assert (counted("1"), counted("2")) == (2, 1)
