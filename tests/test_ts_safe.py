"""Safe by default (issue 34, part 3), as a TorchServe user meets it: a real ``ovserve serve`` on 127.0.0.1
driven through TorchServe's own stubs (tests/ts_stubs.py) and grpcio.

- TorchServe's management listener (RegisterModel, UnregisterModel, ScaleWorker) binds 127.0.0.1 whatever
  ``--host`` says, as TorchServe's management_address does since its CVE-2024-35199 fix; its own
  ``--ts-management-host`` opens it, and the log warns while it is open without a token or TLS;
- ``--ts-model-api`` alone turns the model API on, as ``--metrics-enable`` does;
- a name or URL of 20,000 characters is answered with a short message (NOT_FOUND or INVALID_ARGUMENT under
  2 KB) on every TorchServe RPC and on KServe V2 gRPC and REST: a 20 KB ``grpc-message`` is past the 16 KiB
  of headers gRPC clients take, and the client saw its own RESOURCE_EXHAUSTED instead of the error.

The missing ``--model-store`` is a usage error: tests/test_cli.py. The parser and the warning's cases without
a server: tests/test_ts_safe_unit.py.
"""
from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests
from tritonclient.grpc import service_pb2 as kserve_pb
from tritonclient.grpc import service_pb2_grpc as kserve_pb_grpc

from . import models
from .client_proxies import Certs, make_certs
from .servers import ComponentProcess, ServerProcess
from .ts_stubs import ts_stubs

pytestmark = pytest.mark.integration

ts = ts_stubs()
inference_pb2, inference_pb2_grpc = ts.inference_pb2, ts.inference_pb2_grpc
management_pb2, management_pb2_grpc = ts.management_pb2, ts.management_pb2_grpc

#: another address of this machine's loopback: a listener on 0.0.0.0 answers it, one on 127.0.0.1 does not
OTHER_LOOPBACK = "127.0.0.2"
WARNING = "TorchServe's management API listens beyond loopback"
LONG = "m" * 20_000
#: what an error may say at most (common/errors.py's LONGEST_MESSAGE and its "(N characters cut)")
SHORT = 2100


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


@pytest.fixture(scope="module")
def kserve(server: ServerProcess) -> Iterator[Any]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield kserve_pb_grpc.GRPCInferenceServiceStub(channel)


def refused(host: str, port: int) -> bool:
    """Whether a TCP connection to ``host:port`` is refused (nothing listens there for that address)."""
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def list_models(target: str, **channel: Any) -> list[str]:
    make = channel.pop("secure", None)
    with (make(target) if make else grpc.insecure_channel(target)) as ch:
        reply = management_pb2_grpc.ManagementAPIsServiceStub(ch).ListModels(management_pb2.ListModelsRequest(),
                                                                            timeout=20, **channel)
    return [m["modelName"] for m in json.loads(reply.msg)["models"]]


# -- the management listener's address --------------------------------------------------------------

def test_the_management_listener_binds_loopback_while_every_other_listener_binds_all(repo: Path) -> None:
    """The docs' own command, without --host: REST, gRPC and TorchServe's inference API bind 0.0.0.0 (the
    default), the management API 127.0.0.1 only: another address of the machine reaches the others, not it."""
    proc = ComponentProcess(["serve", "--rest-port", "0", "--grpc-port", "0", "--model-repository",
                             str(repo / "repo"), "--poll-interval", "0", "--ts-inference-port", "0",
                             "--ts-management-port", "0", "--model-store", str(repo / "store"), "--ts-model-api"])
    try:
        proc.wait_ready()
        port = proc.ports["ts-management"]
        assert f"ts-management listening on 127.0.0.1:{port} " in proc.log, proc.log
        assert f"ts-inference listening on 0.0.0.0:{proc.ports['ts-inference']} " in proc.log, proc.log
        assert list_models(f"127.0.0.1:{port}") == ["add"]
        assert refused(OTHER_LOOPBACK, port)
        # the same other address does reach a listener on every interface: the refusal above is the address's
        assert requests.get(f"http://{OTHER_LOOPBACK}:{proc.rest_port}/v2/health/ready", timeout=10).status_code == 200
        assert not refused(OTHER_LOOPBACK, proc.ports["ts-inference"])
        assert WARNING not in proc.log, proc.log
    finally:
        proc.stop()


def test_ts_management_host_opens_it_and_the_log_warns_without_a_token_or_tls(
        start_server: Callable[..., ServerProcess], repo: Path) -> None:
    proc = start_server("--model-repository", repo / "repo", "--poll-interval", "0", "--ts-management-port", "0",
                        "--ts-management-host", "0.0.0.0")
    port = proc.ports["ts-management"]
    assert f"ts-management listening on 0.0.0.0:{port} " in proc.log, proc.log
    assert f"rest listening on 127.0.0.1:{proc.rest_port} " in proc.log  # --host is the others' still
    assert list_models(f"{OTHER_LOOPBACK}:{port}") == ["add"]
    (line,) = [line for line in proc.log.splitlines() if WARNING in line]
    assert "WARNING" in line and "--ts-management-host 0.0.0.0" in line and "without a token or TLS" in line, line


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_opened_with_a_token_and_tls_it_serves_without_a_warning(start_server: Callable[..., ServerProcess],
                                                                 repo: Path, certs: Certs, tmp_path: Path) -> None:
    token = tmp_path / "management.token"
    token.write_text("manage-me\n")
    proc = start_server("--model-repository", repo / "repo", "--poll-interval", "0", "--ts-management-port", "0",
                        "--ts-management-host", "0.0.0.0", "--auth-management-token-file", token,
                        "--tls-cert", certs.server_cert, "--tls-key", certs.server_key, "--rest-tls", "off",
                        "--grpc-tls", "off")
    assert WARNING not in proc.log, proc.log
    credentials = grpc.ssl_channel_credentials(root_certificates=certs.ca.read_bytes())

    def secure(target: str) -> grpc.Channel:
        return grpc.secure_channel(target, credentials, options=[("grpc.ssl_target_name_override", "localhost")])

    target = f"{OTHER_LOOPBACK}:{proc.ports['ts-management']}"
    assert list_models(target, secure=secure, metadata=[("authorization", "Bearer manage-me")]) == ["add"]
    with pytest.raises(grpc.RpcError) as err:
        list_models(target, secure=secure)
    assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_with_a_token_but_no_tls_the_log_warns_of_plain_text(start_server: Callable[..., ServerProcess],
                                                            repo: Path, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t\n")
    proc = start_server("--model-repository", repo / "repo", "--poll-interval", "0", "--ts-management-port", "0",
                        "--ts-management-host", "0.0.0.0", "--auth-token-file", tmp_path / "token")
    (line,) = [line for line in proc.log.splitlines() if WARNING in line]
    assert "without TLS" in line and "plain text" in line, line


def test_a_taken_management_port_names_its_own_host_flag(start_server: Callable[..., ServerProcess],
                                                         repo: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = start_server("--model-repository", repo / "repo", "--host", "0.0.0.0", "--ts-management-port", port,
                            ready=False)
        assert proc.proc.wait(60) == 1
    said = (f"cannot start: ts-management cannot listen on 127.0.0.1:{port} "
            "(--ts-management-port, --ts-management-host): ")
    assert said in proc.log, proc.log


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


# -- long names and URLs: a short message, the right code ------------------------------------------------

def _ts_calls(inference: Any, management: Any) -> dict[str, Callable[[], Any]]:
    m = management_pb2
    return {
        "Predictions": lambda: inference.Predictions(inference_pb2.PredictionsRequest(model_name=LONG,
                                                                                      input={"data": b"{}"})),
        "Predictions version": lambda: inference.Predictions(inference_pb2.PredictionsRequest(
            model_name="add", model_version=LONG, input={"data": b"{}"})),
        "StreamPredictions": lambda: list(inference.StreamPredictions(inference_pb2.PredictionsRequest(
            model_name=LONG, input={"data": b"{}"}))),
        "RegisterModel model_name": lambda: management.RegisterModel(m.RegisterModelRequest(url="plus",
                                                                                             model_name=LONG)),
        "RegisterModel url": lambda: management.RegisterModel(m.RegisterModelRequest(url=LONG)),
        "RegisterModel url in the store": lambda: management.RegisterModel(m.RegisterModelRequest(url=LONG[:4000])),
        "RegisterModel file url": lambda: management.RegisterModel(m.RegisterModelRequest(
            url="file:///" + LONG[:4000])),
        "RegisterModel http url": lambda: management.RegisterModel(m.RegisterModelRequest(
            url="https://" + LONG[:4000] + ".example/m.mar")),
        "DescribeModel": lambda: management.DescribeModel(m.DescribeModelRequest(model_name=LONG)),
        "DescribeModel version": lambda: management.DescribeModel(m.DescribeModelRequest(model_name="add",
                                                                                         model_version=LONG)),
        "UnregisterModel": lambda: management.UnregisterModel(m.UnregisterModelRequest(model_name=LONG)),
        "ScaleWorker": lambda: management.ScaleWorker(m.ScaleWorkerRequest(model_name=LONG, min_worker=1)),
        "SetDefault": lambda: management.SetDefault(m.SetDefaultRequest(model_name=LONG, model_version="1")),
        "SetDefault version": lambda: management.SetDefault(m.SetDefaultRequest(model_name="add",
                                                                                model_version=LONG)),
    }


TS_CALLS = list(_ts_calls(None, None))


def _short_error(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    details = err.value.details() or ""
    assert len(details.encode()) < SHORT, (err.value.code(), len(details), details[:300])
    return err.value.code(), details


@pytest.mark.parametrize("name", TS_CALLS)
def test_a_20000_character_name_or_url_gets_a_short_message_on_torchserve(inference: Any, management: Any,
                                                                          name: str) -> None:
    code, details = _short_error(_ts_calls(inference, management)[name])
    if name.endswith(("file url", "http url")):  # outside the store, and no --allowed-urls: refused unopened
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED), (code, details)
    else:
        assert code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), (code, details)
    assert "mmmm" in details or "url" in details, details


def test_a_20000_character_name_on_stream_predictions2_is_answered_in_band_shortly(inference: Any) -> None:
    request = inference_pb2.PredictionsRequest(model_name=LONG, input={"data": b"{}"}, sequence_id="s")
    (reply,) = list(inference.StreamPredictions2(iter([request]), timeout=30))
    assert reply.status.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert "mmmm" in reply.status.message and len(reply.status.message) < SHORT, len(reply.status.message)


def _kserve_calls(kserve: Any) -> dict[str, Callable[[], Any]]:
    x = kserve_pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 4])
    x.contents.fp32_contents.extend([0.0] * 4)
    return {
        "ModelInfer": lambda: kserve.ModelInfer(kserve_pb.ModelInferRequest(model_name=LONG, inputs=[x])),
        "ModelInfer version": lambda: kserve.ModelInfer(kserve_pb.ModelInferRequest(model_name="add",
                                                                                    model_version=LONG, inputs=[x])),
        "ModelMetadata": lambda: kserve.ModelMetadata(kserve_pb.ModelMetadataRequest(name=LONG)),
        "ModelReady": lambda: kserve.ModelReady(kserve_pb.ModelReadyRequest(name=LONG)),
        "RepositoryModelLoad": lambda: kserve.RepositoryModelLoad(kserve_pb.RepositoryModelLoadRequest(
            model_name=LONG)),
        "RepositoryModelUnload": lambda: kserve.RepositoryModelUnload(kserve_pb.RepositoryModelUnloadRequest(
            model_name=LONG)),
        "ModelStatistics": lambda: kserve.ModelStatistics(kserve_pb.ModelStatisticsRequest(name=LONG)),
        "ModelStatistics version": lambda: kserve.ModelStatistics(kserve_pb.ModelStatisticsRequest(
            name="add", version=LONG)),
    }


@pytest.mark.parametrize("name", list(_kserve_calls(None)))
def test_a_20000_character_name_gets_a_short_message_on_kserve_grpc(kserve: Any, name: str) -> None:
    code, details = _short_error(_kserve_calls(kserve)[name])
    assert code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), (code, details)


def test_a_20000_character_name_in_model_stream_infer_is_answered_in_band_shortly(kserve: Any) -> None:
    (reply,) = list(kserve.ModelStreamInfer(iter([kserve_pb.ModelInferRequest(model_name=LONG)]), timeout=30))
    assert "mmmm" in reply.error_message and len(reply.error_message) < SHORT, len(reply.error_message)


BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 4}]}


@pytest.mark.parametrize("method, path", [
    ("POST", f"/v2/models/{LONG}/infer"),
    ("POST", f"/v2/models/add/versions/{LONG}/infer"),
    ("GET", f"/v2/models/{LONG}"),
    ("GET", f"/v2/models/{LONG}/ready"),
    ("GET", f"/v2/models/{LONG}/stats"),
    ("GET", f"/v2/models/add/versions/{LONG}/stats"),
    ("POST", f"/v1/models/{LONG}:predict"),
    ("POST", f"/v2/repository/models/{LONG}/load"),
    ("GET", f"/v2/models/{LONG}/no-such-route"),  # no route: the path is quoted, and cut
    ("GET", f"/{LONG}"),
])
def test_a_20000_character_name_gets_a_short_message_over_rest(server: ServerProcess, method: str, path: str) -> None:
    resp = requests.request(method, server.url + path, json=BODY if method == "POST" else None, timeout=20)
    assert resp.status_code in (400, 404), (resp.status_code, resp.text[:300])
    assert len(resp.content) < SHORT, (len(resp.content), resp.text[:300])


def test_the_server_serves_on_and_logged_no_traceback(server: ServerProcess, inference: Any) -> None:
    body = json.dumps({"instances": [[0.0] * 4]}).encode()
    reply = inference.Predictions(inference_pb2.PredictionsRequest(model_name="add", input={"data": body}), timeout=30)
    assert json.loads(reply.prediction)["predictions"] == [[1.0] * 4]
    assert "Traceback" not in server.log, server.log[-3000:]
