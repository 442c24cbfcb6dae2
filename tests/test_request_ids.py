"""One request id through the chain: a transformer and an explainer send the request's ``x-request-id`` on
to their predictor (a REST header, gRPC metadata), so the access log line of every hop names the same id.

Real processes on ephemeral ports: a predictor (``ovserve serve``) and, in front of it, a transformer whose
handler calls the predictor twice, and an explainer, each with its own ``--access-log``. The id is the
client's when it sends one, else the one the first hop made (returned to the client); without an access log
on the transformer the client's id still goes on.
"""
from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
from tritonclient.grpc import service_pb2, service_pb2_grpc

from . import models
from .servers import EXACT, ExplainerProcess, ServerProcess, TransformerProcess

pytestmark = pytest.mark.integration

HANDLERS = textwrap.dedent('''
    from ovserve.server import Transformer

    class Twice(Transformer):
        """predict overridden, as users do: two predictor calls for one request (x, then -x)."""
        async def predict(self, request, headers):
            first = await self.predictor.infer(request)
            request.inputs[0].data = -request.inputs[0].data
            await self.predictor.infer(request)
            return first

    class Handing(Transformer):
        """A plain def (run in a worker thread) handing back the predictor's call, awaited on the loop."""
        def predict(self, request, headers):
            return self.predictor.infer(request)
''')

X = np.arange(16, dtype=np.float32).reshape(2, 8) / 7


def lines(log: Path, request_id: str, want: int, timeout: float = 10) -> list[dict[str, Any]]:
    """The log's lines of one request id, once there are ``want`` of them (written at the end of a loop turn:
    waited for, at most ``timeout`` seconds; fewer are returned if they never come)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [json.loads(line) for line in log.read_text().splitlines() if request_id in line] \
            if log.exists() else []
        found = [f for f in found if f["request_id"] == request_id]
        if len(found) >= want or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rid")
    (root / "handlers").mkdir()
    (root / "handlers" / "rid_handlers.py").write_text(HANDLERS)
    return root


@pytest.fixture(scope="module")
def predictor(folder: Path) -> Iterator[ServerProcess]:
    repo = folder / "repo"
    models.save(models.matmul(), repo, "matmul")
    server = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT,
                            "--access-log", str(folder / "predictor.log")])
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def transformer(predictor: ServerProcess, folder: Path, protocol: str, handler: str, *extra: str) -> TransformerProcess:
    host = predictor.grpc_target if protocol == "grpc-v2" else f"127.0.0.1:{predictor.rest_port}"
    return TransformerProcess("--handler", f"rid_handlers:{handler}", "--model_name", "matmul",
                              "--predictor_host", host, "--predictor_protocol", protocol, *extra,
                              env={"PYTHONPATH": str(folder / "handlers")}).wait_ready()


def v2_body() -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": X.reshape(-1).tolist()}]}


def predictor_infers(predictor_log: Path, rid: str, want: int, timeout: float = 10) -> list[tuple[str, str, str]]:
    """(listener, method, status) of the predictor's calls on the model logged under ``rid``, once ``want`` of
    them are inferences (a metadata look-up on the same id is not one: counting it returned before the last
    inference's line was written)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [(line["listener"], line["method"], str(line["status"])) for line in lines(predictor_log, rid, want)
                 if line["model"] == "matmul"]
        if sum(1 for f in found if f[1] in ("POST", "ModelInfer")) >= want or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.mark.parametrize("protocol", ["v2", "grpc-v2"])
def test_a_clients_id_goes_through_the_transformer_to_every_predictor_call(
        predictor: ServerProcess, folder: Path, protocol: str) -> None:
    log = folder / f"transformer-{protocol}.log"
    proc = transformer(predictor, folder, protocol, "Twice", "--access-log", str(log))
    try:
        rid = f"chain-{protocol}"
        resp = requests.post(f"{proc.url}/v2/models/matmul/infer", json=v2_body(), headers={"x-request-id": rid},
                             timeout=30)
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-request-id"] == rid
        (own,) = lines(log, rid, 1)
        assert (own["listener"], own["path"], own["status"]) == ("rest", "/v2/models/matmul/infer", 200)
        # the handler's two calls, each logged by the predictor under the client's id
        hop = ("rest", "POST", "200") if protocol == "v2" else ("grpc", "ModelInfer", "OK")
        assert predictor_infers(folder / "predictor.log", rid, 2) == [hop, hop]
    finally:
        assert proc.stop() == 0, proc.output.text


def test_an_id_the_transformer_made_is_the_predictors_too(predictor: ServerProcess, folder: Path) -> None:
    log = folder / "transformer-made.log"
    proc = transformer(predictor, folder, "v2", "Handing", "--access-log", str(log))
    try:
        with grpc.insecure_channel(proc.grpc_target) as channel:  # over gRPC, sending no id
            request = service_pb2.ModelInferRequest(model_name="matmul")
            tensor = request.inputs.add(name="x", datatype="FP32", shape=[2, 8])
            tensor.contents.fp32_contents.extend(X.ravel().tolist())
            _, call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.with_call(request, timeout=30)
        made = dict(call.trailing_metadata())["x-request-id"]
        assert len(made) == 32
        (own,) = lines(log, made, 1)
        assert (own["listener"], own["method"], own["status"]) == ("grpc", "ModelInfer", "OK")
        assert predictor_infers(folder / "predictor.log", made, 1) == [("rest", "POST", "200")]
    finally:
        assert proc.stop() == 0, proc.output.text


def test_without_its_own_access_log_the_transformer_still_sends_the_clients_id(predictor: ServerProcess,
                                                                               folder: Path) -> None:
    proc = transformer(predictor, folder, "v2", "Twice")
    try:
        resp = requests.post(f"{proc.url}/v1/models/matmul:predict", json={"instances": X.tolist()},
                             headers={"x-request-id": "no-log-1"}, timeout=30)
        assert resp.status_code == 200, resp.text
        assert "x-request-id" not in resp.headers  # the transformer itself logs nothing and returns nothing
        assert predictor_infers(folder / "predictor.log", "no-log-1", 2) == [("rest", "POST", "200")] * 2
        # an id no log should hold (not printable ASCII) is not sent on
        bad = requests.post(f"{proc.url}/v1/models/matmul:predict", json={"instances": X.tolist()},
                            headers={"x-request-id": "tab\there"}, timeout=30)
        assert bad.status_code == 200
        assert lines(folder / "predictor.log", "tab\there", 1, timeout=1) == []
    finally:
        assert proc.stop() == 0, proc.output.text


@pytest.mark.parametrize("protocol", ["v2", "grpc-v2"])
def test_every_predictor_call_of_an_explanation_carries_its_id(predictor: ServerProcess, folder: Path,
                                                                protocol: str) -> None:
    log = folder / f"explainer-{protocol}.log"
    host = predictor.grpc_target if protocol == "grpc-v2" else f"127.0.0.1:{predictor.rest_port}"
    proc = ExplainerProcess("matmul", host, "--predictor_protocol", protocol, "--access-log", str(log)).wait_ready()
    try:
        rid = f"explain-{protocol}"
        resp = requests.post(f"{proc.url}/v1/models/matmul:explain", json={"instances": X.tolist()},
                             headers={"x-request-id": rid}, timeout=60)
        assert resp.status_code == 200, resp.text
        calls = resp.json()["predictor_calls"]
        assert calls >= 2
        (own,) = lines(log, rid, 1)
        assert (own["path"], own["status"]) == ("/v1/models/matmul:explain", 200)
        hop = ("rest", "POST", "200") if protocol == "v2" else ("grpc", "ModelInfer", "OK")
        logged = predictor_infers(folder / "predictor.log", rid, calls)
        # every inference the explanation asked for (and its metadata look-up, on the same id)
        assert logged.count(hop) == calls, logged
    finally:
        proc.stop()
