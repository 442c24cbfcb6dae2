"""A server with TorchServe's two gRPC APIs, and the calls a TorchServe user makes, for the TorchServe tests.

``ts_server`` starts ``ovserve serve`` on a repository holding the ``add`` model (x [-1,16] -> x + 1)
with both TorchServe listeners, a model store and registration allowed; ``stubs`` opens a channel
to each listener with TorchServe's own stubs (tests/ts_stubs.py). The helpers make one call each and
answer what a user would look at: the prediction's bytes, the management message, the JSON of
DescribeModel, the status code and details of a failed call.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from . import models
from .servers import ServerProcess
from .ts_stubs import ts_stubs

ts = ts_stubs()
inference_pb2, inference_pb2_grpc = ts.inference_pb2, ts.inference_pb2_grpc
management_pb2, management_pb2_grpc = ts.management_pb2, ts.management_pb2_grpc


@contextlib.contextmanager
def ts_server(tmp_path_factory: pytest.TempPathFactory, store: Path, *extra: str) -> Iterator[ServerProcess]:
    """A ready server: the ``add`` model in its repository, TorchServe's listeners, ``store`` as its model
    store, registration allowed, then ``extra`` flags."""
    repo = tmp_path_factory.mktemp("repo")
    models.save(models.add_one(), repo, "add")
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0",
                          "--ts-inference-port", "0", "--ts-management-port", "0",
                          "--model-store", str(store), "--ts-model-api", *extra])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@contextlib.contextmanager
def stubs(server: ServerProcess) -> Iterator[tuple[Any, Any]]:
    """TorchServe's inference and management stubs, each on a channel of its own."""
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-inference']}") as inference, \
            grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-management']}") as management:
        yield (inference_pb2_grpc.InferenceAPIsServiceStub(inference),
               management_pb2_grpc.ManagementAPIsServiceStub(management))


def predict(stub: Any, model: str, data: bytes, version: str = "", **more: bytes) -> bytes:
    reply = stub.Predictions(inference_pb2.PredictionsRequest(model_name=model, model_version=version,
                                                              input={"data": data, **more}), timeout=60)
    return bytes(reply.prediction)


def register(management: Any, url: str, **fields: Any) -> str:
    """RegisterModel, synchronous with one worker unless ``fields`` say otherwise; its message."""
    fields.setdefault("synchronous", True)
    fields.setdefault("initial_workers", 1)
    return str(management.RegisterModel(management_pb2.RegisterModelRequest(url=url, **fields), timeout=60).msg)


def describe(management: Any, name: str, version: str = "") -> list[dict[str, Any]]:
    reply = management.DescribeModel(management_pb2.DescribeModelRequest(model_name=name, model_version=version),
                                     timeout=10)
    doc: list[dict[str, Any]] = json.loads(reply.msg)
    return doc


def code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    """The status code and details of a call that must fail."""
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()
