"""Safe by default (issue 34, part 3), as a TorchServe user meets it: a real ``ovserve serve`` on 127.0.0.1
driven through TorchServe's own stubs (tests/ts_stubs.py) and grpcio.

- ``--ts-model-api`` alone turns the model API on, as ``--metrics-enable`` does.

The missing ``--model-store`` is a usage error: tests/test_cli.py. The parser without a server:
tests/test_ts_safe_unit.py.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest

from . import models
from .servers import ServerProcess
from .ts_stubs import ts_stubs

pytestmark = pytest.mark.integration

ts = ts_stubs()
inference_pb2, inference_pb2_grpc = ts.inference_pb2, ts.inference_pb2_grpc
management_pb2, management_pb2_grpc = ts.management_pb2, ts.management_pb2_grpc


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("safe")
    models.save(models.add_one((-1, 4)), root / "repo", "add")
    models.save(models.add_one((-1, 4)), root / "store", "plus")  # an OVMS-style model folder RegisterModel takes
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    """Every listener; the model API turned on with the bare flag."""
    proc = ServerProcess(["--model-repository", str(repo / "repo"), "--poll-interval", "0",
                          "--ts-inference-port", "0", "--ts-management-port", "0",
                          "--model-store", str(repo / "store"), "--ts-model-api"])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def management(server: ServerProcess) -> Iterator[Any]:
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-management']}") as channel:
        yield management_pb2_grpc.ManagementAPIsServiceStub(channel)


@pytest.fixture(scope="module")
def inference(server: ServerProcess) -> Iterator[Any]:
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-inference']}") as channel:
        yield inference_pb2_grpc.InferenceAPIsServiceStub(channel)


# -- --ts-model-api, the flag alone ------------------------------------------------------------------

def test_the_bare_ts_model_api_flag_allows_registration(inference: Any, management: Any) -> None:
    reply = management.RegisterModel(management_pb2.RegisterModelRequest(url="plus", initial_workers=1,
                                                                         synchronous=True), timeout=60)
    assert "registered" in reply.msg
    try:
        body = json.dumps({"instances": [[1.0, 2.0, 3.0, 4.0]]}).encode()
        answer = inference.Predictions(inference_pb2.PredictionsRequest(model_name="plus", input={"data": body}),
                                       timeout=60)
        assert json.loads(answer.prediction)["predictions"] == [[2.0, 3.0, 4.0, 5.0]]
    finally:
        management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="plus"), timeout=60)
