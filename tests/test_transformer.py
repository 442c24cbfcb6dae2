"""``ovserve transformer`` in front of a real predictor: both real processes on ephemeral ports.

The handler ``Double`` doubles every input before the predictor and adds 100
to every output after it; the predictor's ``matmul`` is y = x @ W + b with
seeded weights, so every answer is computable here with numpy:
y = (2 x) @ W + b + 100. Clients are the ones users have: tritonclient (HTTP
with the binary extension, and gRPC), requests, curl.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from . import models
from .clients import post
from .inflight import Uploads
from .servers import EXACT, ServerProcess, TransformerProcess

HANDLERS = textwrap.dedent('''
    import asyncio
    import numpy as np
    from ovserve.server import Transformer
    from ovserve.server.components.transformer import tensor

    class Double(Transformer):
        def preprocess(self, request, headers):           # sync: runs in a worker thread
            for t in request.inputs:
                t.data = t.data * 2
            return request

        async def postprocess(self, response, headers):   # async: runs on the loop
            for t in response.outputs:
                t.data = t.data + 100
            return response

    class Boom(Transformer):
        def preprocess(self, request, headers):
            if headers.get("x-boom") == "no":
                return request
            raise ValueError("cannot handle this request")

    class SlowBoom(Transformer):
        async def postprocess(self, response, headers):
            await asyncio.sleep(0)
            raise KeyError("logits")

    class Broken(Transformer):
        def __init__(self):
            raise RuntimeError("labels file missing")

    class NotAHandler:
        pass

    class Sleepy(Transformer):
        async def preprocess(self, request, headers):
            await asyncio.sleep(1.0)
            return request

    class Tagged(Transformer):
        """Every output says what it holds: an output's own parameters reach the client."""
        async def postprocess(self, response, headers):
            for t in response.outputs:
                t.parameters["unit"] = "logit"
                t.parameters["top_k"] = 3
            return response

    class Both(Transformer):
        """predict overridden: two predictor calls, x and -x, and extra outputs."""
        async def predict(self, request, headers):
            first = await self.predictor.infer(request)
            request.inputs[0].data = -request.inputs[0].data
            second = await self.predictor.infer(request)
            first.outputs.append(tensor("y_neg", second.outputs[0].data))
            first.outputs.append(tensor("note", [["two calls"]] * len(second.outputs[0].data)))
            return first
''')


def expected(x: np.ndarray) -> np.ndarray:
    w, b = models.matmul_weights()
    return (2 * x) @ w + b + 100


X = np.arange(16, dtype=np.float32).reshape(2, 8) / 7


@pytest.fixture(scope="module")
def handlers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("handlers")
    (folder / "handlers.py").write_text(HANDLERS)
    return folder


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("transformer_repo")
    models.save(models.matmul(), repo, "matmul")
    models.save(models.two_in_two_out(), repo, "two")
    return repo


@pytest.fixture(scope="module")
def predictor(repo: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT])
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def predictor_host(predictor: ServerProcess, protocol: str) -> str:
    return predictor.grpc_target if protocol == "grpc-v2" else f"127.0.0.1:{predictor.rest_port}"


@contextlib.contextmanager
def handler_in_front(handler: str, predictor: ServerProcess, handlers: Path) -> Iterator[TransformerProcess]:
    """``handlers:<handler>`` in front of ``matmul`` over V2 REST; it must stop cleanly (exit 0)."""
    proc = TransformerProcess("--handler", f"handlers:{handler}", "--model_name", "matmul",
                              "--predictor_host", f"127.0.0.1:{predictor.rest_port}",
                              env={"PYTHONPATH": str(handlers)}).wait_ready()
    try:
        yield proc
    finally:
        assert proc.stop() == 0


@pytest.fixture(scope="module", params=["v1", "v2", "grpc-v2"])
def transformer(request: pytest.FixtureRequest, predictor: ServerProcess,
                handlers: Path) -> Iterator[TransformerProcess]:
    """``Double`` in front of ``matmul``, loaded by module name, over each predictor protocol."""
    protocol = request.param
    proc = TransformerProcess("--handler", "handlers:Double", "--model_name", "matmul",
                              "--predictor_host", predictor_host(predictor, protocol),
                              "--predictor_protocol", protocol, env={"PYTHONPATH": str(handlers)})
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.output.text


# -- inference through the transformer, per predictor protocol -----------------
def test_v2_rest_json(transformer: TransformerProcess) -> None:
    body = {"id": "r-1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": X.reshape(-1).tolist()}]}
    resp = requests.post(transformer.url + "/v2/models/matmul/infer", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["model_name"] == "matmul" and doc["id"] == "r-1"
    (out,) = doc["outputs"]
    assert out["name"] == "y" and out["shape"] == [2, 4] and out["datatype"] == "FP32"
    np.testing.assert_allclose(np.array(out["data"]).reshape(2, 4), expected(X), rtol=1e-5)


def test_tritonclient_http_binary(transformer: TransformerProcess) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(transformer.url.removeprefix("http://"))
    inp = httpclient.InferInput("x", [2, 8], "FP32")
    inp.set_data_from_numpy(X, binary_data=True)
    result = client.infer("matmul", [inp], outputs=[httpclient.InferRequestedOutput("y", binary_data=True)])
    np.testing.assert_allclose(result.as_numpy("y"), expected(X), rtol=1e-5)
    assert client.is_server_ready() and client.is_model_ready("matmul")
    client.close()


def test_tritonclient_grpc(transformer: TransformerProcess) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(transformer.grpc_target)
    inp = grpcclient.InferInput("x", [2, 8], "FP32")
    inp.set_data_from_numpy(X)
    result = client.infer("matmul", [inp])
    np.testing.assert_allclose(result.as_numpy("y"), expected(X), rtol=1e-5)
    md = client.get_model_metadata("matmul", as_json=True)
    assert md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "8"]}]
    client.close()


def test_grpc_on_the_native_engine(predictor: ServerProcess, handlers: Path) -> None:
    """``--grpc_engine native``: the transformer's gRPC port on pygrpc-native, metadata and errors alike."""
    pytest.importorskip("pygrpc_native", reason="pygrpc-native (the grpc-native extra) is not installed")
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    proc = TransformerProcess("--handler", "handlers:Double", "--model_name", "matmul", "--grpc_engine", "native",
                              "--predictor_host", predictor.grpc_target, "--predictor_protocol", "grpc-v2",
                              env={"PYTHONPATH": str(handlers)}).wait_ready()
    try:
        assert "native (experimental: pygrpc-native " in proc.wait_log("gRPC engine: ")
        client = grpcclient.InferenceServerClient(proc.grpc_target)
        inp = grpcclient.InferInput("x", [2, 8], "FP32")
        inp.set_data_from_numpy(X)
        np.testing.assert_allclose(client.infer("matmul", [inp]).as_numpy("y"), expected(X), rtol=1e-5)
        assert client.get_model_metadata("matmul", as_json=True)["name"] == "matmul"
        bad = grpcclient.InferInput("x", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
        with pytest.raises(InferenceServerException) as err:
            client.infer("matmul", [bad])
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and "predictor: " in err.value.message()
        client.close()
    finally:
        assert proc.stop() == 0, proc.output.text


def test_v1_predict_with_curl(transformer: TransformerProcess) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    body = json.dumps({"instances": X.tolist()})
    out = subprocess.run([curl, "-s", "-m", "20", "-X", "POST", "-H", "Content-Type: application/json",
                          "-d", body, transformer.url + "/v1/models/matmul:predict"],
                         capture_output=True, text=True, timeout=30, check=False)
    preds = json.loads(out.stdout)["predictions"]
    np.testing.assert_allclose(np.array(preds), expected(X), rtol=1e-5)


def test_metadata_is_the_predictors(transformer: TransformerProcess, predictor: ServerProcess) -> None:
    mine = requests.get(transformer.url + "/v2/models/matmul", timeout=10).json()
    theirs = requests.get(predictor.url + "/v2/models/matmul", timeout=10).json()
    # how the predictor compiled its model (precision, hint, streams: issue 36) is the predictor's to say;
    # V2 gRPC's metadata cannot carry it, so a transformer answers the model's own fields on every protocol
    compiled = theirs.pop("parameters")
    assert compiled["inference_precision"] == "f32" and compiled["precision_chosen_by"] == "plugin_config"
    assert mine == theirs
    assert requests.get(transformer.url + "/v2/models/matmul/ready", timeout=10).json()["ready"] is True
    status = requests.get(transformer.url + "/v1/models/matmul", timeout=10)
    assert status.status_code == 200 and status.json()["ready"] is True
    assert requests.get(transformer.url + "/v2/health/live", timeout=10).status_code == 200
    assert requests.get(transformer.url + "/v2/models", timeout=10).json() == {"models": ["matmul"]}
    # no repository of its own, and no explainer: clear 501s
    index = requests.post(transformer.url + "/v2/repository/index", json={}, timeout=10)
    assert index.status_code == 501 and "no model repository" in index.json()["error"]
    explain = requests.post(transformer.url + "/v1/models/matmul:explain", json={"instances": [[0] * 8]}, timeout=10)
    assert explain.status_code == 501


# -- errors: the predictor's reach the client, marked ------------------------------
def test_bad_input_is_the_predictors_400(transformer: TransformerProcess) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    resp = requests.post(transformer.url + "/v2/models/matmul/infer", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"].startswith("predictor: ")
    assert "shape" in resp.json()["error"] or "[1, 3]" in resp.json()["error"]


def test_bad_input_over_grpc_is_invalid_argument(transformer: TransformerProcess) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(transformer.grpc_target)
    inp = grpcclient.InferInput("x", [1, 3], "FP32")
    inp.set_data_from_numpy(np.ones((1, 3), np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("matmul", [inp])
    assert "INVALID_ARGUMENT" in str(err.value.status()) and "predictor: " in err.value.message()
    client.close()


def test_unknown_model_on_the_transformer_is_404(transformer: TransformerProcess) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0] * 8}]}
    resp = requests.post(transformer.url + "/v2/models/nope/infer", json=body, timeout=10)
    assert resp.status_code == 404 and "nope" in resp.json()["error"]


@pytest.mark.parametrize("protocol", ["v1", "v2", "grpc-v2"])
def test_model_unknown_to_the_predictor(protocol: str, predictor: ServerProcess) -> None:
    proc = TransformerProcess("--model_name", "ghost", "--predictor_host", predictor_host(predictor, protocol),
                              "--predictor_protocol", protocol)
    try:
        proc.wait_ready()  # no health check: up even though the predictor lacks the model
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0] * 8}]}
        resp = requests.post(proc.url + "/v2/models/ghost/infer", json=body, timeout=10)
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"].startswith("predictor: ") and "ghost" in resp.json()["error"]
        # and the metadata the predictor cannot give is "not yet", not a crash
        assert requests.get(proc.url + "/v2/models/ghost", timeout=10).status_code == 503
    finally:
        assert proc.stop() == 0


def test_pass_through_two_inputs_two_outputs(predictor: ServerProcess) -> None:
    """No --handler: the base Transformer passes requests and replies through unchanged."""
    proc = TransformerProcess("--model_name", "two", "--predictor_host",
                              f"127.0.0.1:{predictor.rest_port}").wait_ready()
    try:
        a, b = np.arange(8, dtype=np.float32).reshape(2, 4), np.full((2, 4), 3, np.float32)
        body = {"inputs": [{"name": "a", "datatype": "FP32", "shape": [2, 4], "data": a.reshape(-1).tolist()},
                           {"name": "b", "datatype": "FP32", "shape": [2, 4], "data": b.reshape(-1).tolist()}],
                "outputs": [{"name": "prod"}]}
        doc = requests.post(proc.url + "/v2/models/two/infer", json=body, timeout=10).json()
        assert [o["name"] for o in doc["outputs"]] == ["prod"]
        assert doc["outputs"][0]["data"] == (a * b).reshape(-1).tolist()
        rows = {"instances": [{"a": a[i].tolist(), "b": b[i].tolist()} for i in range(2)]}
        preds = requests.post(proc.url + "/v1/models/two:predict", json=rows, timeout=10).json()["predictions"]
        assert [p["sum"] for p in preds] == (a + b).tolist() and [p["prod"] for p in preds] == (a * b).tolist()
    finally:
        assert proc.stop() == 0


# -- handler problems ------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["v2", "grpc-v2"])
def test_handler_exception_is_a_500_naming_it(protocol: str, predictor: ServerProcess, handlers: Path) -> None:
    proc = TransformerProcess("--handler", f"{handlers / 'handlers.py'}:Boom", "--model_name", "matmul",
                              "--predictor_host", predictor_host(predictor, protocol),
                              "--predictor_protocol", protocol).wait_ready()
    try:
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": X.reshape(-1).tolist()}]}
        resp = requests.post(proc.url + "/v2/models/matmul/infer", json=body, timeout=10)
        assert resp.status_code == 500
        msg = resp.json()["error"]
        assert "Boom.preprocess" in msg and "ValueError" in msg and "cannot handle this request" in msg
        assert "Traceback" not in msg
        v1 = requests.post(proc.url + "/v1/models/matmul:predict", json={"instances": X.tolist()}, timeout=10)
        assert v1.status_code == 500 and "Boom.preprocess" in v1.json()["error"]
        # still serving; the handler sees the headers (gRPC: the call's metadata)
        ok = requests.post(proc.url + "/v2/models/matmul/infer", json=body, headers={"x-boom": "no"}, timeout=10)
        assert ok.status_code == 200, ok.text
        np.testing.assert_allclose(np.array(ok.json()["outputs"][0]["data"]).reshape(2, 4),
                                   expected(X / 2) - 100, rtol=1e-5)
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        client = grpcclient.InferenceServerClient(f"127.0.0.1:{proc.output.ports.grpc}")
        inp = grpcclient.InferInput("x", [2, 8], "FP32")
        inp.set_data_from_numpy(X)
        with pytest.raises(InferenceServerException, match=r"Boom\.preprocess"):
            client.infer("matmul", [inp])
        got = client.infer("matmul", [inp], headers={"x-boom": "no"}).as_numpy("y")
        np.testing.assert_allclose(got, expected(X / 2) - 100, rtol=1e-5)
        client.close()
    finally:
        assert proc.stop() == 0


def test_async_handler_exception_over_grpc_is_internal(predictor: ServerProcess, handlers: Path) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with handler_in_front("SlowBoom", predictor, handlers) as proc:
        client = grpcclient.InferenceServerClient(proc.grpc_target)
        inp = grpcclient.InferInput("x", [2, 8], "FP32")
        inp.set_data_from_numpy(X)
        for _ in range(2):  # twice: the first failure changed nothing
            with pytest.raises(InferenceServerException) as err:
                client.infer("matmul", [inp])
            assert "INTERNAL" in str(err.value.status())
            assert "SlowBoom.postprocess" in err.value.message() and "KeyError" in err.value.message()
        assert client.is_server_live()
        client.close()


@pytest.mark.parametrize("spec, words", [
    ("no_such_module:X", ["no module named 'no_such_module'"]),
    ("/nowhere/handler.py:X", ["no such file"]),
    ("handlers:Missing", ["has no attribute 'Missing'"]),
    ("handlers:NotAHandler", ["not a subclass"]),
    ("handlers:Broken", ["Broken()", "RuntimeError", "labels file missing"]),
    ("handlers", ["MODULE:CLASS"]),
])
def test_bad_handler_exits_at_start(spec: str, words: list[str], handlers: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "ovserve.server", "transformer", "--handler", spec,
                          "--model_name", "m", "--predictor_host", "127.0.0.1:9", "--http_port", "0"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(handlers)},
                         check=False)
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_handler_with_a_syntax_error(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("def broken(:\n")
    out = subprocess.run([sys.executable, "-m", "ovserve.server", "transformer", "--handler",
                          f"{tmp_path / 'bad.py'}:X", "--model_name", "m", "--predictor_host", "h"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0 and "SyntaxError" in out.stderr and len(out.stderr.strip().splitlines()) == 1


# -- the predictor goes away and comes back ------------------------------------------------
@pytest.mark.parametrize("protocol", ["v2", "grpc-v2"])
def test_predictor_down_then_back(protocol: str, repo: Path) -> None:
    first = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT]).wait_ready()
    rest, grpc_port = first.rest_port, first.grpc_port
    port = grpc_port if protocol == "grpc-v2" else rest
    proc = TransformerProcess("--model_name", "matmul", "--predictor_host", f"127.0.0.1:{port}",
                              "--predictor_protocol", protocol, "--enable_predictor_health_check").wait_ready()
    second = None
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": X.reshape(-1).tolist()}]}
    try:
        assert requests.post(proc.url + "/v2/models/matmul/infer", json=body, timeout=10).status_code == 200
        first.proc.kill()
        first.proc.wait(10)
        started = time.monotonic()
        resp = requests.post(proc.url + "/v2/models/matmul/infer", json=body, timeout=30)
        took = time.monotonic() - started
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"].startswith("predictor: ") and took < 5, (took, resp.text)
        # the health check notices within a few polls
        deadline = time.monotonic() + 10
        while requests.get(proc.url + "/v2/health/ready", timeout=5).status_code != 400:  # V2: 4xx is false
            assert time.monotonic() < deadline, "still ready with the predictor down"
            time.sleep(0.1)
        assert requests.get(proc.url + "/v2/health/live", timeout=5).status_code == 200
        # the predictor comes back on the same ports: the transformer serves again by itself
        # (later flags win: the fixture's "--rest-port 0" is overridden)
        second = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT,
                                "--rest-port", str(rest), "--grpc-port", str(grpc_port)]).wait_ready()
        deadline = time.monotonic() + 15
        while True:
            resp = requests.post(proc.url + "/v2/models/matmul/infer", json=body, timeout=10)
            if resp.status_code == 200:
                break
            assert time.monotonic() < deadline, resp.text
            time.sleep(0.2)
        np.testing.assert_allclose(np.array(resp.json()["outputs"][0]["data"]).reshape(2, 4),
                                   expected(X / 2) - 100, rtol=1e-5)
        deadline = time.monotonic() + 10
        while requests.get(proc.url + "/v2/health/ready", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "not ready again"
            time.sleep(0.1)
    finally:
        assert proc.stop() == 0
        first.stop()
        if second is not None:
            second.stop()


@pytest.mark.timing  # a bound on time (tests/tiers.py): run alone
def test_sigterm_exits_zero_within_seconds(predictor: ServerProcess) -> None:
    proc = TransformerProcess("--model_name", "matmul", "--predictor_host",
                              f"127.0.0.1:{predictor.rest_port}").wait_ready()
    started = time.monotonic()
    assert proc.stop() == 0
    assert time.monotonic() - started < 10
    assert "stopped" in proc.output.text


def test_predict_override_calls_the_predictor_twice(predictor: ServerProcess, handlers: Path) -> None:
    with handler_in_front("Both", predictor, handlers) as proc:
        w, b = models.matmul_weights()
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": X.reshape(-1).tolist()}]}
        doc = requests.post(proc.url + "/v2/models/matmul/infer", json=body, timeout=10).json()
        out = {o["name"]: o for o in doc["outputs"]}
        np.testing.assert_allclose(np.array(out["y"]["data"]).reshape(2, 4), X @ w + b, rtol=1e-5)
        np.testing.assert_allclose(np.array(out["y_neg"]["data"]).reshape(2, 4), -X @ w + b, rtol=1e-5)
        assert out["note"]["datatype"] == "BYTES" and out["note"]["data"] == ["two calls"] * 2
        preds = requests.post(proc.url + "/v1/models/matmul:predict", json={"instances": X.tolist()},
                              timeout=10).json()["predictions"]
        assert [p["note"] for p in preds] == [["two calls"]] * 2
        np.testing.assert_allclose(np.array([p["y_neg"] for p in preds]), -X @ w + b, rtol=1e-5)


def test_output_parameters_set_by_the_handler_reach_every_protocol(predictor: ServerProcess, handlers: Path) -> None:
    import tritonclient.grpc as grpcclient

    with handler_in_front("Tagged", predictor, handlers) as proc:
        tags = {"unit": "logit", "top_k": 3}
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": X.reshape(-1).tolist()}],
                "outputs": [{"name": "y", "parameters": {"binary_data": False, "client_note": "not echoed"}}]}
        (out,) = requests.post(proc.url + "/v2/models/matmul/infer", json=body, timeout=10).json()["outputs"]
        assert out["parameters"] == tags
        body["outputs"] = [{"name": "y", "parameters": {"binary_data": True}}]
        resp = requests.post(proc.url + "/v2/models/matmul/infer", json=body, timeout=10)
        header = json.loads(resp.content[:int(resp.headers["Inference-Header-Content-Length"])])
        assert header["outputs"][0]["parameters"] == {**tags, "binary_data_size": 2 * 4 * 4}
        client = grpcclient.InferenceServerClient(proc.grpc_target)
        inp = grpcclient.InferInput("x", [2, 8], "FP32")
        inp.set_data_from_numpy(X)
        params = client.infer("matmul", [inp]).get_response().outputs[0].parameters
        assert (params["unit"].string_param, params["top_k"].int64_param) == ("logit", 3)
        client.close()


def test_the_server_does_not_echo_a_clients_output_parameters(predictor: ServerProcess) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": X.reshape(-1).tolist()}],
            "outputs": [{"name": "y", "parameters": {"binary_data": False, "classification": 0}}]}
    (out,) = requests.post(predictor.url + "/v2/models/matmul/infer", json=body, timeout=10).json()["outputs"]
    assert "parameters" not in out and len(out["data"]) == 8


def test_concurrent_requests_through_one_transformer(transformer: TransformerProcess) -> None:
    """64 requests, 8 at a time, each with its own input: every answer is its own."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> bool:
        x = X + i
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": x.reshape(-1).tolist()}]}
        with requests.Session() as session:
            doc = session.post(transformer.url + "/v2/models/matmul/infer", json=body, timeout=30).json()
        return np.allclose(np.array(doc["outputs"][0]["data"]).reshape(2, 4), expected(x), rtol=1e-5)

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(one, range(64)))


@pytest.mark.timing  # a bound on time (tests/tiers.py): run alone
def test_predictor_that_hangs_is_a_504_not_a_hang(repo: Path) -> None:
    slow = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT]).wait_ready()
    proc = TransformerProcess("--model_name", "matmul", "--predictor_host", f"127.0.0.1:{slow.rest_port}",
                              "--predictor_request_timeout_seconds", "1").wait_ready()
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": X.reshape(-1).tolist()}]}
    try:
        slow.proc.send_signal(signal.SIGSTOP)  # accepts connections (the kernel does), never answers
        started = time.monotonic()
        resp = requests.post(proc.url + "/v2/models/matmul/infer", json=body, timeout=30)
        assert resp.status_code == 504 and resp.json()["error"].startswith("predictor: "), resp.text
        assert time.monotonic() - started < 5
        slow.proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while requests.post(proc.url + "/v2/models/matmul/infer", json=body, timeout=30).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        slow.proc.send_signal(signal.SIGCONT)
        assert proc.stop() == 0
        slow.stop()


@pytest.mark.timing  # a bound on time (tests/tiers.py): run alone
def test_sigterm_lets_the_request_in_flight_finish(predictor: ServerProcess, handlers: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    proc = TransformerProcess("--handler", "handlers:Sleepy", "--model_name", "matmul",
                              "--predictor_host", f"127.0.0.1:{predictor.rest_port}",
                              env={"PYTHONPATH": str(handlers)}).wait_ready()
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8],
                                   "data": X.reshape(-1).tolist()}]}).encode()
    uploads, sent = Uploads(proc.rest_port), threading.Event()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, proc.url + "/v2/models/matmul/infer", body, {"Content-Type": "application/json"},
                              sent, 30)
        uploads.wait(sent=sent.is_set)  # the server has read it: inside the handler's 1 s sleep
        started = time.monotonic()
        assert proc.stop() == 0
        status, _, answer = pending.result(30)
    assert status == 200, answer
    np.testing.assert_allclose(np.array(json.loads(answer)["outputs"][0]["data"]).reshape(2, 4),
                               expected(X / 2) - 100, rtol=1e-5)
    assert time.monotonic() - started < 10
