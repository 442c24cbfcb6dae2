"""TLS and mutual TLS on every listener of ``ovserve serve`` (server/tls.py), through real clients.

Certificates are made by the ``openssl`` command (tests/client_proxies.py ``make_certs``: a CA, a server
certificate for localhost and 127.0.0.1, a client certificate); a second, unrelated set stands for what
cert-manager rotates in. The clients are curl, tritonclient's gRPC client, the kserve SDK (in a child
process: its stubs and tritonclient's define the same protobuf package), TorchServe's own gRPC stubs
(tests/ts_stubs.py) and Python's ssl module, which shows what certificate a new connection is given.
"""
from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from ovserve.server import tls as server_tls
from ovserve.server.config import TlsOverride, parse_tls_override

from . import models
from .client_proxies import CLIENT_CN, Certs, make_certs, needs_openssl
from .clients import curl_grpc
from .servers import EXACT, ServerProcess
from .tls_tools import (
    BODY,
    HOST,
    ROTATION,
    SecretVolume,
    X,
    curl,
    der,
    expected,
    infer_with_curl,
    served_certificate,
    tls_flags,
    triton,
    triton_infer,
    wait_https,
)

pytestmark = [needs_openssl, pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")]

@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs-a"))


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """Another CA's set: what a rotation brings, or an untrusted client."""
    return make_certs(tmp_path_factory.mktemp("certs-b"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tls-repo")
    models.save(models.matmul(), folder, "matmul")
    return folder


# -- one server: mTLS on REST, KServe gRPC and TorchServe's two listeners ----------------------------
#: the gRPC engines that serve TLS: auto (loop: the listener's ssl.SSLContext) and grpcio (dynamic credentials)
TLS_ENGINES = ["auto", "grpcio"]


@pytest.fixture(scope="module", params=TLS_ENGINES)
def mtls(repo: Path, certs: Certs, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT, *tls_flags(certs),
                          "--ts-inference-port", "0", "--ts-management-port", "0", "--grpc-engine", request.param,
                          "--ts-management-tls", "client-ca=off", "--metrics-enable", "--metrics-port", "0"])
    try:
        yield wait_https(proc, certs)
    finally:
        assert proc.stop() == 0


def test_listeners_say_they_serve_tls(mtls: ServerProcess, certs: Certs) -> None:
    for name in ("rest", "grpc", "ts-inference", "metrics"):
        line = mtls.wait_log(rf"\b{name} listening on ")
        assert f"mTLS, client certificates required (CA {certs.ca})" in line, line
    line = mtls.wait_log(r"\bts-management listening on ")
    assert "; TLS, certificate" in line and "client certificates" not in line, line
    asked = mtls.args[mtls.args.index("--grpc-engine") + 1]
    engines = [line.split("gRPC engine: ", 1)[1] for line in mtls.lines if "gRPC engine: " in line]
    assert len(engines) == 3 and all(e.startswith(("loop" if asked == "auto" else asked) + " (")
                                     for e in engines), engines


def test_curl_with_a_client_certificate_infers(mtls: ServerProcess, certs: Certs) -> None:
    out = infer_with_curl(mtls.rest_port, "--cacert", str(certs.ca), "--cert", str(certs.client_cert),
                          "--key", str(certs.client_key))
    body, _, status = out.stdout.rpartition("\n")
    assert status == "200", out
    np.testing.assert_allclose(np.array(json.loads(body)["outputs"][0]["data"]).reshape(2, 4), expected(), rtol=1e-5)


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
def test_curl_without_a_trusted_client_certificate_is_refused(mtls: ServerProcess, certs: Certs, other: Certs,
                                                              who: str) -> None:
    args = ["--cacert", str(certs.ca)]
    if who != "no certificate":
        args += ["--cert", str(other.client_cert), "--key", str(other.client_key)]
    out = infer_with_curl(mtls.rest_port, *args)
    assert out.returncode != 0 and out.stdout.endswith("000"), out  # no HTTP answer at all


def test_plain_http_gets_no_answer_from_a_tls_port(mtls: ServerProcess) -> None:
    out = curl(f"http://{HOST}:{mtls.rest_port}/v2/health/live")
    assert out.returncode != 0 and out.stdout.endswith("000"), out


def test_tritonclient_grpc_with_root_certificates_and_a_client_certificate(mtls: ServerProcess,
                                                                           certs: Certs) -> None:
    client = triton(mtls.grpc_port, certs, certs)
    try:
        assert client.is_server_ready()
        np.testing.assert_allclose(triton_infer(client), expected(), rtol=1e-5)
    finally:
        client.close()


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
def test_tritonclient_grpc_without_a_trusted_client_certificate_is_refused(mtls: ServerProcess, certs: Certs,
                                                                           other: Certs, who: str) -> None:
    client = triton(mtls.grpc_port, certs, None if who == "no certificate" else other)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.is_server_ready(client_timeout=10)
        assert info.value.status() == "StatusCode.UNAVAILABLE", info.value
    finally:
        client.close()


#: Run as ``python kserve_tls.py URL CA CERT KEY X_JSON``: the kserve SDK's REST client with and without the
#: client certificate; prints one JSON object.
KSERVE_CLIENT = r'''
import asyncio, json, ssl, sys

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

url, ca, cert, key, x = sys.argv[1:6]
x = np.asarray(json.loads(x), dtype=np.float32)
out = {}


async def main():
    tensor = InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    # RESTConfig's cert= never reaches httpx (kserve 0.21 builds a transport with it and drops it):
    # the client certificate goes in the SSLContext that verify= takes (docs/operations.md)
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)
    async with InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=20, verify=context)) as c:
        out["ready"] = await c.is_server_ready(url)
        resp = await c.infer(url, InferRequest("matmul", [tensor]), model_name="matmul")
        out["y"] = resp.outputs[0].as_numpy().tolist()
    async with InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=20, verify=ca)) as c:
        try:
            await c.is_server_ready(url)
            out["without"] = "answered"
        except Exception as exc:
            out["without"] = type(exc).__name__ + ": " + str(exc)


asyncio.run(main())
print(json.dumps(out))
'''


def test_kserve_sdk_rest_client_with_a_client_certificate(mtls: ServerProcess, certs: Certs, tmp_path: Path) -> None:
    script = tmp_path / "kserve_tls.py"
    script.write_text(KSERVE_CLIENT)
    proc = subprocess.run([sys.executable, str(script), f"https://localhost:{mtls.rest_port}", str(certs.ca),
                           str(certs.client_cert), str(certs.client_key), json.dumps(X.tolist())],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ready"] is True
    np.testing.assert_allclose(np.array(out["y"]), expected(), rtol=1e-5)
    assert out["without"] != "answered", out


def test_torchserve_stubs_over_tls(mtls: ServerProcess, certs: Certs) -> None:
    """TorchServe's inference listener demands the client certificate; the management listener's
    ``--ts-management-tls client-ca=off`` serves TLS without asking for one."""
    import grpc
    from google.protobuf import empty_pb2

    from .ts_stubs import ts_stubs

    ts = ts_stubs()
    mutual = grpc.ssl_channel_credentials(certs.ca.read_bytes(), certs.client_key.read_bytes(),
                                          certs.client_cert.read_bytes())
    with grpc.secure_channel(f"{HOST}:{mtls.ports['ts-inference']}", mutual) as channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        assert json.loads(stub.Ping(empty_pb2.Empty(), timeout=20).health)["status"] == "Healthy"
        reply = stub.Predictions(ts.inference_pb2.PredictionsRequest(
            model_name="matmul", input={"data": json.dumps(BODY).encode()}), timeout=20)
        y = np.array(json.loads(reply.prediction)["outputs"][0]["data"]).reshape(2, 4)
        np.testing.assert_allclose(y, expected(), rtol=1e-5)
    server_only = grpc.ssl_channel_credentials(certs.ca.read_bytes())
    with grpc.secure_channel(f"{HOST}:{mtls.ports['ts-inference']}", server_only) as channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predictions(ts.inference_pb2.PredictionsRequest(model_name="matmul"), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with grpc.secure_channel(f"{HOST}:{mtls.ports['ts-management']}", server_only) as channel:
        stub = ts.management_pb2_grpc.ManagementAPIsServiceStub(channel)
        reply = stub.ListModels(ts.management_pb2.ListModelsRequest(limit=10), timeout=20)
        assert "matmul" in reply.msg


def test_metrics_port_serves_mtls_with_the_rest(mtls: ServerProcess, certs: Certs) -> None:
    url = f"https://localhost:{mtls.ports['metrics']}/metrics"
    out = curl(url, "--cacert", str(certs.ca), "--cert", str(certs.client_cert), "--key", str(certs.client_key))
    assert out.stdout.endswith("200") and "ovms_requests_success" in out.stdout, out
    assert curl(url, "--cacert", str(certs.ca)).stdout.endswith("000")


def test_metrics_tls_off_lets_prometheus_scrape_in_plain_text(repo: Path, certs: Certs) -> None:
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *tls_flags(certs),
                          "--metrics-enable", "--metrics-port", "0", "--metrics-tls", "off"])
    try:
        wait_https(proc, certs)
        resp = requests.get(f"http://{HOST}:{proc.ports['metrics']}/metrics", timeout=10)
        assert resp.status_code == 200 and "ovms_requests_success" in resp.text
    finally:
        assert proc.stop() == 0


# -- the engine without TLS, and what cannot start -----------------------------------------------------
def test_the_native_engine_is_refused_with_tls_in_one_line(repo: Path, certs: Certs) -> None:
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", "--grpc-engine", "native",
                          *tls_flags(certs, client_ca=False)])
    assert proc.wait_exit(60) == 1
    errors = [line for line in proc.lines if " ERROR " in line]
    assert len(errors) == 1, proc.log
    assert "cannot start: grpc: the native gRPC engine (pygrpc-native " in errors[0]
    assert "serves no TLS; use --grpc-engine grpcio or loop, or --grpc-tls off" in errors[0]


def test_plain_grpc_and_http1_to_a_tls_grpc_port_are_refused_and_it_serves_on(
        mtls: ServerProcess, certs: Certs) -> None:
    """A client speaking plain-text HTTP/2, or TLS offering only HTTP/1.1, gets no gRPC answer; the failed
    handshakes are not errors in the server's log, and the next client with a certificate is served."""
    import grpc

    with grpc.insecure_channel(mtls.grpc_target) as channel:
        stub = channel.unary_unary("/inference.GRPCInferenceService/ServerReady")
        with pytest.raises(grpc.RpcError) as info:
            stub(b"", timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    out = curl(f"https://{HOST}:{mtls.grpc_port}/inference.GRPCInferenceService/ServerReady", "--http1.1",
               "--cacert", str(certs.ca), "--cert", str(certs.client_cert), "--key", str(certs.client_key))
    assert not out.stdout.endswith("200"), out
    client = triton(mtls.grpc_port, certs, certs)
    try:
        np.testing.assert_allclose(triton_infer(client), expected(), rtol=1e-5)
    finally:
        client.close()
    assert not [line for line in mtls.lines if " ERROR " in line], mtls.log


def test_native_grpc_engine_serves_plain_grpc_beside_tls_rest(repo: Path, certs: Certs) -> None:
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT, "--grpc-engine", "native",
                          *tls_flags(certs), "--grpc-tls", "off"])
    try:
        wait_https(proc, certs)
        client = tgrpc.InferenceServerClient(proc.grpc_target)
        try:
            np.testing.assert_allclose(triton_infer(client), expected(), rtol=1e-5)
        finally:
            client.close()
    finally:
        assert proc.stop() == 0


def test_the_default_engine_serves_a_listener_with_tls_and_one_without(repo: Path, certs: Certs) -> None:
    """``--grpc-engine auto`` (the default): the KServe gRPC listener serves TLS and the TorchServe inference
    listener, told ``--ts-inference-tls off``, plain text, both on the default engine (loop)."""
    import grpc
    from google.protobuf import empty_pb2

    from .ts_stubs import ts_stubs

    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT,
                          *tls_flags(certs, client_ca=False), "--ts-inference-port", "0", "--ts-inference-tls", "off"])
    try:
        wait_https(proc, certs)
        engines = [line.split("gRPC engine: ", 1)[1] for line in proc.lines if "gRPC engine: " in line]
        assert len(engines) == 2, proc.log
        (grpc_line,) = [e for e in engines if "for grpc (" in e]
        (ts_line,) = [e for e in engines if "for ts-inference (" in e]
        for line in (grpc_line, ts_line):
            assert line.startswith("loop (h2 ") and line.endswith("(auto)"), line
        client = triton(proc.grpc_port, certs, None)
        try:
            np.testing.assert_allclose(triton_infer(client), expected(), rtol=1e-5)
        finally:
            client.close()
        ts = ts_stubs()
        with grpc.insecure_channel(f"{HOST}:{proc.ports['ts-inference']}") as channel:
            stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
            assert json.loads(stub.Ping(empty_pb2.Empty(), timeout=20).health)["status"] == "Healthy"
    finally:
        assert proc.stop() == 0


@pytest.mark.parametrize("case", ["key of another certificate", "missing key", "CA file without a CA",
                                  "client CA without a certificate", "encrypted key"])
def test_unusable_tls_files_cannot_start(repo: Path, certs: Certs, other: Certs, tmp_path: Path, case: str) -> None:
    flags, says = {
        "key of another certificate": (["--tls-cert", str(certs.server_cert), "--tls-key", str(other.server_key)],
                                       f"the key {other.server_key} is not the key of the certificate"),
        "missing key": (["--tls-cert", str(certs.server_cert), "--tls-key", str(tmp_path / "nope.key")],
                        f"cannot read {tmp_path / 'nope.key'}: No such file or directory"),
        "CA file without a CA": ([*tls_flags(certs, client_ca=False), "--tls-client-ca", str(certs.server_key)],
                                 f"{certs.server_key}: no CA certificate in it"),
        "client CA without a certificate": (["--tls-client-ca", str(certs.ca)],
                                            "--tls-client-ca needs --tls-cert and --tls-key"),
        "encrypted key": (["--tls-cert", str(certs.server_cert), "--tls-key", str(tmp_path / "enc.key")],
                          "is encrypted: ovserve reads an unencrypted PEM key"),
    }[case]
    if case == "encrypted key":
        subprocess.run(["openssl", "pkey", "-in", str(certs.server_key), "-aes256", "-passout", "pass:secret",
                        "-out", str(tmp_path / "enc.key")], check=True, capture_output=True, timeout=60)
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *flags])
    assert proc.wait_exit(60) == 1
    errors = [line for line in proc.lines if " ERROR " in line]
    assert len(errors) == 1 and "cannot start: " in errors[0] and says in errors[0], proc.log


# -- rotation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", TLS_ENGINES)
def test_a_rotated_certificate_reaches_new_connections_while_open_ones_keep_working(
        repo: Path, certs: Certs, other: Certs, tmp_path: Path, engine: str) -> None:
    volume = SecretVolume(tmp_path, certs)
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT, "--grpc-engine", engine,
                          *tls_flags(certs, folder=tmp_path)])
    try:
        wait_https(proc, certs)
        # connections opened before the rotation: a keep-alive REST session and a gRPC channel
        # (verify= per request: a session's own gives way to REQUESTS_CA_BUNDLE where that is set)
        session = requests.Session()
        mine = {"verify": str(certs.ca), "cert": (str(certs.client_cert), str(certs.client_key)), "timeout": 20}
        rest = f"https://{HOST}:{proc.rest_port}/v2/models/matmul/infer"
        assert session.post(rest, json=BODY, **mine).status_code == 200
        old_grpc = triton(proc.grpc_port, certs, certs)
        np.testing.assert_allclose(triton_infer(old_grpc), expected(), rtol=1e-5)
        assert served_certificate(proc.rest_port, certs.ca) == der(certs.server_cert)

        volume.write(other)  # cert-manager renews: another CA's certificate, key and client CA

        def rotated() -> bool:
            return served_certificate(proc.rest_port) == der(other.server_cert)

        proc.wait_until(rotated, "the new certificate on a new REST connection", ROTATION)
        assert served_certificate(proc.grpc_port, alpn="h2") == der(other.server_cert)
        # new connections: the new certificate and the new client CA
        out = infer_with_curl(proc.rest_port, "--cacert", str(other.ca), "--cert", str(other.client_cert),
                              "--key", str(other.client_key))
        assert out.stdout.endswith("200"), out
        out = infer_with_curl(proc.rest_port, "--cacert", str(other.ca), "--cert", str(certs.client_cert),
                              "--key", str(certs.client_key))
        assert out.stdout.endswith("000"), out  # the old client CA is no longer trusted
        new_grpc = triton(proc.grpc_port, other, other)
        try:
            np.testing.assert_allclose(triton_infer(new_grpc), expected(), rtol=1e-5)
        finally:
            new_grpc.close()
        stale = triton(proc.grpc_port, certs, certs)
        try:
            with pytest.raises(InferenceServerException):
                stale.is_server_ready(client_timeout=10)
        finally:
            stale.close()
        # the connections opened before: still working (a new one could not verify the new certificate
        # against the old CA, so these answers come over the old connections)
        assert session.post(rest, json=BODY, **mine).status_code == 200
        np.testing.assert_allclose(triton_infer(old_grpc), expected(), rtol=1e-5)
        old_grpc.close()
        session.close()
        assert any("TLS: reloaded" in line for line in proc.lines), proc.log
    finally:
        assert proc.stop() == 0


def test_files_half_rewritten_keep_the_previous_material_until_they_load(
        certs: Certs, other: Certs, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A writer that replaces the certificate first and the key a moment later (not atomically): in
    between, new connections keep the previous certificate, the mismatch is logged once, and the pair
    is taken once both are there."""
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copyfile(certs.server_cert, cert)
    shutil.copyfile(certs.server_key, key)
    tls = server_tls.ServerTls(server_tls.TlsFiles(cert, key), check_interval=0)
    first = tls.material
    assert first.cert == certs.server_cert.read_bytes()
    assert tls.refresh() is first  # nothing changed
    shutil.copyfile(other.server_cert, cert)
    with caplog.at_level(logging.WARNING, logger="ovserve"):
        assert tls.refresh() is first
        assert tls.refresh() is first
    warnings = [r.getMessage() for r in caplog.records if "does not load" in r.getMessage()]
    assert len(warnings) == 1 and "is not the key of the certificate" in warnings[0], warnings
    shutil.copyfile(other.server_key, key)
    time.sleep(0.01)
    new = tls.refresh()
    assert new.version == 2 and new.cert == other.server_cert.read_bytes() and new.key == other.server_key.read_bytes()
    assert new.context is not first.context


@pytest.mark.parametrize("text, parsed", [
    ("off", TlsOverride(off=True)),
    ("cert=/a.pem,key=/a.key", TlsOverride(cert=Path("/a.pem"), key=Path("/a.key"))),
    ("client-ca=off", TlsOverride(no_client_ca=True)),
    ("client_ca=/ca.pem", TlsOverride(client_ca=Path("/ca.pem"))),
])
def test_listener_override_values(text: str, parsed: TlsOverride) -> None:
    assert parse_tls_override(text) == parsed


@pytest.mark.parametrize("text", ["on", "cert", "cert=", "cert=/a,cert=/b", "ca=/x"])
def test_listener_override_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected off, or cert=FILE|given twice"):
        parse_tls_override(text)


# -- the operator's probe for mutual TLS, run for real -------------------------------------------------
@pytest.mark.parametrize("path", ["/v2/health/ready", "/v2/health/live"])
def test_the_operators_mtls_exec_probe_passes_against_the_server_and_fails_untrusted(
        mtls: ServerProcess, certs: Certs, other: Certs, tmp_path: Path, path: str) -> None:
    """operator/tls.py's exec probe (what kubelet runs in an mTLS pod), with the Secret's files at a
    folder of the test's: 0 against the server with the pod's own certificate, nonzero when ca.crt is
    another CA's (the server is not verified)."""
    from ovserve.operator import tls as operator_tls

    probe = operator_tls.secure_probe({"httpGet": {"path": path, "port": "http"}, "periodSeconds": 5},
                                      operator_tls.Tls("secret", mutual=True), mtls.rest_port)
    for ca, ok in ((certs.ca, True), (other.ca, False)):
        folder = tmp_path / ("good" if ok else "bad")
        folder.mkdir()
        for name, source in (("tls.crt", certs.server_cert), ("tls.key", certs.server_key), ("ca.crt", ca)):
            shutil.copyfile(source, folder / name)
        python, *rest = probe["exec"]["command"]
        assert python == "python"
        command = [sys.executable, *(part.replace(operator_tls.MOUNT, str(folder)) for part in rest)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert (done.returncode == 0) is ok, done.stderr


def test_the_loop_engine_gives_a_handler_the_client_certificates_names(certs: Certs) -> None:
    """``context.auth_context()``, ``peer_identities()`` and ``peer_identity_key()`` on the loop engine, as
    grpcio gives them: the client certificate's subject alternative names, else its common name (the test
    client certificate has only a common name); the server certificate's for a client that presents none is
    not there to give, so a server-only TLS connection has no identities."""
    import asyncio
    import threading

    import grpc

    from ovserve.server.transports.grpc.loop import LoopServer

    def who(request: bytes, context: Any) -> bytes:
        auth = {k: [v.decode() for v in vs] for k, vs in context.auth_context().items()}
        identities = context.peer_identities()
        return json.dumps({"auth": auth, "key": context.peer_identity_key(),
                           "identities": None if identities is None else [i.decode() for i in identities]}).encode()

    handler = grpc.method_handlers_generic_handler("t.T", {"Who": grpc.unary_unary_rpc_method_handler(who)})
    results: dict[str, Any] = {}
    stop = threading.Event()

    def serve(mutual: bool) -> None:
        async def main() -> None:
            tls = server_tls.ServerTls(server_tls.TlsFiles(certs.server_cert, certs.server_key,
                                                           certs.ca if mutual else None))
            server = LoopServer()
            server.add_generic_rpc_handlers((handler,))
            results["port"] = server.add_secure_port(f"{HOST}:0", tls.ssl_context("h2"))
            await server.start()
            results["started"].set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await server.stop(1)
        asyncio.run(main())

    for mutual in (True, False):
        stop.clear()
        results["started"] = threading.Event()
        thread = threading.Thread(target=serve, args=(mutual,), daemon=True)
        thread.start()
        try:
            assert results["started"].wait(20)
            creds = grpc.ssl_channel_credentials(certs.ca.read_bytes(), *(
                (certs.client_key.read_bytes(), certs.client_cert.read_bytes()) if mutual else ()))
            with grpc.secure_channel(f"localhost:{results['port']}", creds) as channel:
                seen = json.loads(channel.unary_unary("/t.T/Who")(b"", timeout=20))
        finally:
            stop.set()
            thread.join(20)
        assert seen["auth"]["transport_security_type"] == ["ssl"], seen
        if mutual:
            assert seen["key"] == "x509_common_name" and seen["identities"] == [CLIENT_CN], seen
        else:
            assert seen["key"] is None and seen["identities"] is None, seen


def test_curl_over_http2_and_tls_gets_grpc_answers(mtls: ServerProcess, certs: Certs, tmp_path: Path) -> None:
    """curl (nghttp2) negotiating HTTP/2 by ALPN on the gRPC port, with the client certificate: a gRPC
    ServerReady answered, on either engine."""
    from tritonclient.grpc import service_pb2 as pb

    fields, reply = curl_grpc(f"https://localhost:{mtls.grpc_port}/inference.GRPCInferenceService/ServerReady",
                              b"\x00\x00\x00\x00\x00", tmp_path, "--http2", "--cacert", str(certs.ca),
                              "--cert", str(certs.client_cert), "--key", str(certs.client_key))
    assert fields.get("grpc-status") == "0", fields
    assert pb.ServerReadyResponse.FromString(reply[5:]).ready is True


@pytest.mark.timing  # a bound on time (tests/tiers.py): run alone
def test_sigterm_closes_idle_tls_connections_at_once_and_answers_the_busy_one(certs: Certs, tmp_path: Path) -> None:
    """An idle keep-alive TLS connection (a pooling client, a load balancer) does not hold the exit: it took
    the whole grace period (25 s) and logged "timeout graceful shutdown exceeded", since asyncio's TLS
    transport waits for a close_notify such a client never sends (server/transports/rest/closing.py). A
    request in flight on another TLS connection at SIGTERM is still answered whole."""
    import http.client
    import ssl
    import threading

    repo = tmp_path / "repo"
    models.put_version(models.slow(1), repo / "s", 1)
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT, *tls_flags(certs),
                          "--grace-period", "25", "--metrics-enable"])
    wait_https(proc, certs)
    context = ssl.create_default_context(cafile=str(certs.ca))
    context.load_cert_chain(str(certs.client_cert), str(certs.client_key))

    def connection() -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(HOST, proc.rest_port, context=context, timeout=60)

    idle = connection()
    idle.request("GET", "/v2/health/live")
    assert idle.getresponse().read() is not None
    x = np.random.default_rng(7).standard_normal((2048, models.SLOW_K)).astype(np.float32)  # about a second
    raw = x.tobytes()
    header = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    answer: dict[str, Any] = {}

    def busy() -> None:
        conn = connection()
        try:
            conn.request("POST", "/v2/models/s/infer", header + raw, headers={
                "Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"})
            resp = conn.getresponse()
            answer["status"], answer["body"] = resp.status, resp.read()
            answer["header"] = resp.getheader("Inference-Header-Content-Length")
        except Exception as exc:  # the finding, asserted below
            answer["error"] = repr(exc)
        finally:
            conn.close()

    thread = threading.Thread(target=busy)
    try:
        thread.start()
        deadline = time.monotonic() + 30
        while not _rest_in_flight(proc, certs):  # the request is the server's: refusing it now would be wrong
            assert time.monotonic() < deadline, "the inference never started"
            time.sleep(0.05)
        started = time.monotonic()
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(30) == 0, proc.log[-3000:]
        took = time.monotonic() - started
        thread.join(30)
    finally:
        idle.close()
        proc.stop()
    assert answer.get("status") == 200, answer.get("error") or answer
    n = int(answer["header"])
    np.testing.assert_array_equal(np.frombuffer(answer["body"][n:], np.float32).reshape(x.shape),
                                  models.slow_expected(x, 1))
    assert took < 10, f"{took:.1f} s to exit with an idle TLS connection open (grace 25 s)"
    assert "timeout graceful shutdown exceeded" not in proc.log, proc.log[-3000:]


def _rest_in_flight(proc: ServerProcess, certs: Certs) -> int:
    """ovserve_requests_in_flight{listener="rest"} less this scrape itself."""
    text = requests.get(f"https://{HOST}:{proc.rest_port}/metrics", verify=str(certs.ca),
                        cert=(str(certs.client_cert), str(certs.client_key)), timeout=5).text
    for line in text.splitlines():
        if line.startswith('ovserve_requests_in_flight{listener="rest"}'):
            return int(float(line.split()[-1])) - 1
    return 0
