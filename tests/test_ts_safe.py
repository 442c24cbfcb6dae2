"""Safe by default (issue 34, part 3), as a TorchServe user meets it: a real ``ovserve serve`` on 127.0.0.1
driven through TorchServe's own stubs (tests/ts_stubs.py) and grpcio.

- TorchServe's management listener (RegisterModel, UnregisterModel, ScaleWorker) binds 127.0.0.1 whatever
  ``--host`` says, as TorchServe's management_address does since its CVE-2024-35199 fix; its own
  ``--ts-management-host`` opens it, and the log warns while it is open without a token or TLS;
- ``--ts-model-api`` alone turns the model API on, as ``--metrics-enable`` does.

The missing ``--model-store`` is a usage error: tests/test_cli.py. The parser and the warning's cases without
a server: tests/test_ts_safe_unit.py.
"""
from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import pytest
import requests

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


def test_the_server_serves_on_and_logged_no_traceback(server: ServerProcess, inference: Any) -> None:
    body = json.dumps({"instances": [[0.0] * 4]}).encode()
    reply = inference.Predictions(inference_pb2.PredictionsRequest(model_name="add", input={"data": body}), timeout=30)
    assert json.loads(reply.prediction)["predictions"] == [[1.0] * 4]
    assert "Traceback" not in server.log, server.log[-3000:]
