"""Bearer-token authentication on every listener, driven by real clients against a real server.

curl and ``requests`` over REST, tritonclient over REST and gRPC (``headers``), the kserve SDK (in a
child process: its stubs and tritonclient's share the protobuf package ``inference``), TorchServe's
gRPC stubs as a TorchServe user generates them (tests/ts_stubs.py) with metadata
``authorization: Bearer ...``, and a transformer calling a token-protected predictor with its own
token. Health stays open on every protocol; a rotated token file takes effect without a restart.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from google.protobuf import empty_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from . import models
from .servers import ServerProcess, TransformerProcess
from .ts_stubs import ts_stubs

ts = ts_stubs()

INFERENCE_TOKENS = ["inference-token-1", "inference-token-2"]  # both valid: a rotation in progress
MANAGEMENT_TOKEN = "management-token-1"
REFUSED = "unauthenticated: this call needs a valid bearer token (authorization: Bearer <token>)"
X = np.arange(16, dtype=np.float32).reshape(1, 16)


def bearer(token: str) -> dict[str, str]:
    """The header, as HTTP clients spell it and gRPC metadata must (keys in lower case)."""
    return {"authorization": f"Bearer {token}"}


def write_tokens(path: Path, *tokens: str) -> Path:
    """Replace the file at once (a new inode, as a Secret update or ``mv`` does)."""
    tmp = path.with_suffix(".new")
    tmp.write_text("# ovserve tokens\n" + "\n".join(tokens) + "\n")
    os.replace(tmp, path)
    return path


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    models.save(models.add_one(), repo, "add")
    return repo


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tokens")
    return write_tokens(d / "inference", *INFERENCE_TOKENS), write_tokens(d / "management", MANAGEMENT_TOKEN)


@pytest.fixture(scope="module")
def server(repo: Path, tokens: tuple[Path, Path]) -> Iterator[ServerProcess]:
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0",
                          "--auth-token-file", str(tokens[0]), "--auth-management-token-file", str(tokens[1]),
                          "--ts-inference-port", "0", "--ts-management-port", "0", "--metrics-enable"])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def v2_body() -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                                   "data": X.ravel().tolist()}]}).encode()


# -- REST ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/", "/v2/health/live", "/v2/health/ready"])
def test_health_is_open(server: ServerProcess, path: str) -> None:
    assert requests.get(server.url + path, timeout=10).status_code == 200


CLOSED = [
    ("GET", "/v2"), ("GET", "/v2/models"), ("GET", "/v2/models/add"), ("GET", "/v2/models/add/ready"),
    ("POST", "/v2/models/add/infer"), ("GET", "/v1/models"), ("GET", "/v1/models/add"),
    ("POST", "/v1/models/add:predict"), ("POST", "/v2/repository/index"), ("POST", "/v2/repository/models/add/load"),
    ("GET", "/no/such/route"),  # 401 before 404: no route is named to a client without a token
    ("HEAD", "/v2/health/livez"),
]
WRONG = {
    "missing": {},
    "wrong token": bearer("inference-token-3"),
    "a prefix of a token": bearer("inference-token-"),
    "another scheme": {"Authorization": f"Basic {INFERENCE_TOKENS[0]}"},
    "no scheme": {"Authorization": INFERENCE_TOKENS[0]},
    "empty bearer": {"Authorization": "Bearer "},
}


@pytest.mark.parametrize("method, path", CLOSED, ids=[f"{m} {p}" for m, p in CLOSED])
@pytest.mark.parametrize("how", list(WRONG))
def test_rest_without_a_valid_token_is_401_saying_nothing_more(server: ServerProcess, method: str, path: str,
                                                                 how: str) -> None:
    resp = requests.request(method, server.url + path, headers=WRONG[how], data=v2_body(), timeout=10)
    assert resp.status_code == 401
    assert resp.headers["www-authenticate"].startswith("Bearer")
    if method != "HEAD":
        assert resp.json() == {"error": REFUSED}  # the same words whatever was wrong


@pytest.mark.parametrize("token", INFERENCE_TOKENS)
def test_curl_with_either_inference_token_infers(server: ServerProcess, token: str) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    out = subprocess.run([curl, "-s", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {token}",
                          "--data-binary", v2_body().decode(), f"{server.url}/v2/models/add/infer"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    body, _, status = out.rpartition("\n")
    assert status == "200", body
    assert json.loads(body)["outputs"][0]["data"] == (X + 1).ravel().tolist()


def test_curl_bearer_scheme_in_lower_case(server: ServerProcess) -> None:
    resp = requests.get(f"{server.url}/v2/models/add", headers={"authorization": f"bearer {INFERENCE_TOKENS[1]}"},
                        timeout=10)
    assert resp.status_code == 200 and resp.json()["name"] == "add"


def test_metrics_on_the_rest_port_take_an_inference_token(server: ServerProcess) -> None:
    assert requests.get(f"{server.url}/metrics", timeout=10).status_code == 401
    resp = requests.get(f"{server.url}/metrics", headers=bearer(INFERENCE_TOKENS[0]), timeout=10)
    assert resp.status_code == 200 and "ovms_requests_success" in resp.text


def test_repository_api_takes_the_management_token_only(server: ServerProcess) -> None:
    index = f"{server.url}/v2/repository/index"
    assert requests.post(index, headers=bearer(INFERENCE_TOKENS[0]), timeout=10).status_code == 401
    resp = requests.post(index, headers=bearer(MANAGEMENT_TOKEN), timeout=10)
    assert resp.status_code == 200 and resp.json()[0]["name"] == "add"
    # and a management token opens no inference
    resp = requests.post(f"{server.url}/v2/models/add/infer", headers=bearer(MANAGEMENT_TOKEN), data=v2_body(),
                         timeout=10)
    assert resp.status_code == 401


def test_tritonclient_http_sends_the_token_in_headers(server: ServerProcess) -> None:
    client = thttp.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
    assert client.is_server_live() and client.is_server_ready()  # open: no headers
    inp = thttp.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(X, binary_data=True)
    with pytest.raises(InferenceServerException) as err:
        client.infer("add", [inp])
    assert "401" in str(err.value.status()) or "unauthenticated" in str(err.value)
    y = client.infer("add", [inp], headers=bearer(INFERENCE_TOKENS[0])).as_numpy("y")
    np.testing.assert_array_equal(y, X + 1)


# -- gRPC ----------------------------------------------------------------------------------------------

def test_tritonclient_grpc_sends_the_token_in_metadata(server: ServerProcess) -> None:
    client = tgrpc.InferenceServerClient(server.grpc_target)
    assert client.is_server_live() and client.is_server_ready()  # /v2/health/*'s twins: open
    with pytest.raises(InferenceServerException) as err:
        client.is_model_ready("add")
    assert err.value.status() == "StatusCode.UNAUTHENTICATED"
    assert err.value.message() == REFUSED
    inp = tgrpc.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(X)
    with pytest.raises(InferenceServerException) as err:
        client.infer("add", [inp], headers=bearer("wrong"))
    assert err.value.status() == "StatusCode.UNAUTHENTICATED" and err.value.message() == REFUSED
    y = client.infer("add", [inp], headers=bearer(INFERENCE_TOKENS[1])).as_numpy("y")
    np.testing.assert_array_equal(y, X + 1)
    with pytest.raises(InferenceServerException) as err:  # the repository extension: management only
        client.get_model_repository_index(headers=bearer(INFERENCE_TOKENS[0]))
    assert err.value.status() == "StatusCode.UNAUTHENTICATED"
    index = client.get_model_repository_index(headers=bearer(MANAGEMENT_TOKEN))
    assert [m.name for m in index.models] == ["add"]


def test_grpc_stream_needs_the_token(server: ServerProcess) -> None:
    results: list[Any] = []
    client = tgrpc.InferenceServerClient(server.grpc_target)
    inp = tgrpc.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(X)
    client.start_stream(callback=lambda result, error: results.append((result, error)), headers=bearer("nope"))
    try:
        client.async_stream_infer("add", [inp])
    except InferenceServerException as exc:  # the stream may be refused before the request is queued
        assert "no longer in valid state" in str(exc)
    client.stop_stream()
    assert len(results) == 1 and results[0][1] is not None
    assert "UNAUTHENTICATED" in str(results[0][1].status())
    results.clear()
    client.start_stream(callback=lambda result, error: results.append((result, error)),
                        headers=bearer(INFERENCE_TOKENS[0]))
    client.async_stream_infer("add", [inp])
    client.stop_stream()
    assert results[0][1] is None
    np.testing.assert_array_equal(results[0][0].as_numpy("y"), X + 1)


def test_native_grpc_engine_checks_tokens_too(repo: Path, tokens: tuple[Path, Path], start_server) -> None:
    pytest.importorskip("pygrpc_native")
    server = start_server("--model-repository", repo, "--poll-interval", "0", "--grpc-engine", "native",
                          "--auth-token-file", tokens[0])
    client = tgrpc.InferenceServerClient(server.grpc_target)
    assert client.is_server_live()
    inp = tgrpc.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(X)
    with pytest.raises(InferenceServerException) as err:
        client.infer("add", [inp])
    assert err.value.status() == "StatusCode.UNAUTHENTICATED" and err.value.message() == REFUSED
    y = client.infer("add", [inp], headers=bearer(INFERENCE_TOKENS[0])).as_numpy("y")
    np.testing.assert_array_equal(y, X + 1)


@pytest.mark.parametrize("listener", ["grpc", "ts-inference", "ts-management"])
def test_grpc_health_is_open_on_every_listener(server: ServerProcess, listener: str) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.ports[listener]}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_torchserve_stubs_send_the_token_as_torchserve_clients_do(server: ServerProcess) -> None:
    inference_pb2, inference_pb2_grpc = ts.inference_pb2, ts.inference_pb2_grpc
    request = inference_pb2.PredictionsRequest(model_name="add", input={"data": v2_body()})
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-inference']}") as channel:
        stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        assert json.loads(stub.Ping(empty_pb2.Empty(), timeout=10).health) == {"status": "Healthy"}  # open
        for metadata in ([], [("authorization", "Bearer wrong")], [("authorization", f"Bearer {MANAGEMENT_TOKEN}")]):
            with pytest.raises(grpc.RpcError) as err:
                stub.Predictions(request, metadata=metadata, timeout=30)
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED and err.value.details() == REFUSED
        reply = stub.Predictions(request, metadata=[("authorization", f"Bearer {INFERENCE_TOKENS[0]}")], timeout=30)
        assert json.loads(reply.prediction)["outputs"][0]["data"] == (X + 1).ravel().tolist()
        with pytest.raises(grpc.RpcError) as err:  # the streams too
            list(stub.StreamPredictions2(iter([request]), timeout=30))
        assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
        (answer,) = stub.StreamPredictions2(iter([request]), timeout=30,
                                            metadata=[("authorization", f"Bearer {INFERENCE_TOKENS[1]}")])
        assert json.loads(answer.prediction)["outputs"][0]["data"] == (X + 1).ravel().tolist()


def test_torchserve_management_takes_the_management_token(server: ServerProcess) -> None:
    management_pb2, management_pb2_grpc = ts.management_pb2, ts.management_pb2_grpc
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['ts-management']}") as channel:
        stub = management_pb2_grpc.ManagementAPIsServiceStub(channel)
        for metadata in ([], [("authorization", f"Bearer {INFERENCE_TOKENS[0]}")]):
            with pytest.raises(grpc.RpcError) as err:
                stub.ListModels(management_pb2.ListModelsRequest(), metadata=metadata, timeout=10)
            assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED and err.value.details() == REFUSED
        reply = stub.ListModels(management_pb2.ListModelsRequest(), timeout=10,
                                metadata=[("authorization", f"Bearer {MANAGEMENT_TOKEN}")])
        assert [m["modelName"] for m in json.loads(reply.msg)["models"]] == ["add"]


# -- the kserve SDK --------------------------------------------------------------------------------------

SDK_CLIENT = r'''
import asyncio, json, sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

rest, target, token = sys.argv[1], sys.argv[2], sys.argv[3]
x = np.arange(16, dtype=np.float32).reshape(1, 16)
results = {}


async def check(name, coro):
    try:
        results[name] = {"ok": await coro}
    except Exception as exc:
        results[name] = {"error": repr(exc)}


def request():
    tensor = InferInput("x", [1, 16], "FP32")
    tensor.set_data_from_numpy(x, binary_data=False)
    return InferRequest("add", [tensor])


async def rest_infer(c, headers):
    return (await c.infer(rest, request(), model_name="add", headers=headers)).outputs[0].as_numpy().tolist()


async def grpc_infer(c, headers):
    return (await c.infer(request(), headers=headers)).outputs[0].as_numpy().tolist()


async def main():
    auth = {"Authorization": f"Bearer {token}"}
    async with InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=20)) as c:
        await check("rest_live", c.is_server_live(rest))
        await check("rest_infer_without", rest_infer(c, None))
        await check("rest_infer", rest_infer(c, auth))
    async with InferenceGRPCClient(target, retries=0, timeout=20) as c:
        await check("grpc_live", c.is_server_live())
        await check("grpc_infer_without", grpc_infer(c, None))
        await check("grpc_infer", grpc_infer(c, [("authorization", f"Bearer {token}")]))


asyncio.run(main())
print(json.dumps(results))
'''


def test_kserve_sdk_sends_the_token(server: ServerProcess, tmp_path: Path) -> None:
    script = tmp_path / "sdk_client.py"
    script.write_text(SDK_CLIENT)
    proc = subprocess.run([sys.executable, str(script), server.url, server.grpc_target, INFERENCE_TOKENS[0]],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["rest_live"] == {"ok": True} and got["grpc_live"] == {"ok": True}
    assert "401" in got["rest_infer_without"]["error"], got
    assert "UNAUTHENTICATED" in got["grpc_infer_without"]["error"], got
    assert got["rest_infer"]["ok"] == (X + 1).tolist() == got["grpc_infer"]["ok"], got


# -- rotation, start-up, components -----------------------------------------------------------------------

def test_a_rotated_token_file_takes_effect_without_a_restart(repo: Path, tmp_path: Path, start_server) -> None:
    token_file = write_tokens(tmp_path / "tokens", "old-token")
    server = start_server("--model-repository", repo, "--poll-interval", "0", "--auth-token-file", token_file)
    grpc_client = tgrpc.InferenceServerClient(server.grpc_target)

    def rest_status(token: str) -> int:
        return requests.get(f"{server.url}/v2/models/add", headers=bearer(token), timeout=10).status_code

    def grpc_ok(token: str) -> bool:
        try:
            return bool(grpc_client.is_model_ready("add", headers=bearer(token)))
        except InferenceServerException as exc:
            assert exc.status() == "StatusCode.UNAUTHENTICATED"
            return False

    assert rest_status("old-token") == 200 and grpc_ok("old-token")
    assert rest_status("new-token") == 401 and not grpc_ok("new-token")
    write_tokens(token_file, "old-token", "new-token")  # the overlap: both work
    assert rest_status("old-token") == 200 and rest_status("new-token") == 200
    write_tokens(token_file, "new-token")
    assert rest_status("old-token") == 401 and not grpc_ok("old-token")
    assert rest_status("new-token") == 200 and grpc_ok("new-token")
    # rewritten in place (an editor, `echo > file`), same inode
    token_file.write_text("third-token\n")
    assert rest_status("new-token") == 401 and rest_status("third-token") == 200
    # removed mid-rotation, or emptied: the last tokens read stay, nobody is locked out
    token_file.unlink()
    assert rest_status("third-token") == 200
    token_file.write_text("\n")
    assert rest_status("third-token") == 200
    assert "keeping the tokens read before" in server.output.text
    write_tokens(token_file, "fourth-token")
    assert rest_status("fourth-token") == 200 and rest_status("third-token") == 401
    assert server.alive  # one process throughout
    assert "old-token" not in server.output.text and "fourth-token" not in server.output.text  # never logged


@pytest.mark.parametrize("content, words", [
    (None, "cannot read token file"),
    ("# only a comment\n\n", "holds no token"),
    ("good-token\nnot a token\n", "line 2 is not a bearer token"),
])
def test_an_unusable_token_file_stops_the_start_naming_it(repo: Path, tmp_path: Path, start_server,
                                                           content: str | None, words: str) -> None:
    token_file = tmp_path / "tokens"
    if content is not None:
        token_file.write_text(content)
    server = start_server("--model-repository", repo, "--auth-token-file", token_file, ready=False)
    assert server.wait_exit(60) != 0
    assert words in server.output.text and str(token_file) in server.output.text
    assert "good-token" not in server.output.text


def test_transformer_sends_its_predictor_token_and_checks_its_own(repo: Path, tmp_path: Path, start_server) -> None:
    predictor_tokens = write_tokens(tmp_path / "predictor", "predictor-token")
    own_tokens = write_tokens(tmp_path / "own", "transformer-token")
    predictor = start_server("--model-repository", repo, "--poll-interval", "0", "--auth-token-file",
                             predictor_tokens)
    for protocol, host in (("v2", f"127.0.0.1:{predictor.rest_port}"), ("grpc-v2", predictor.grpc_target)):
        with TransformerProcess("--model_name", "add", "--predictor_host", host, "--predictor_protocol", protocol,
                                "--predictor_token_file", str(predictor_tokens),
                                "--auth-token-file", str(own_tokens)) as transformer:
            transformer.wait_ready()
            url = f"{transformer.url}/v2/models/add/infer"
            assert requests.post(url, data=v2_body(), headers=bearer("predictor-token"), timeout=30).status_code == 401
            resp = requests.post(url, data=v2_body(), headers=bearer("transformer-token"), timeout=30)
            assert resp.status_code == 200, resp.text
            assert resp.json()["outputs"][0]["data"] == (X + 1).ravel().tolist()
    # without its predictor token the predictor refuses it, and the transformer says so
    with TransformerProcess("--model_name", "add", "--predictor_host", f"127.0.0.1:{predictor.rest_port}") as bare:
        bare.wait_ready()
        resp = requests.post(f"{bare.url}/v2/models/add/infer", data=v2_body(), timeout=30)
        assert resp.status_code == 401 and resp.json()["error"].startswith("predictor: unauthenticated")
