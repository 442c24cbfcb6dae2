"""The transformer and the explainer over TLS: to the predictor, and on their own listeners.

- ``--predictor_use_ssl`` alone: the system's CAs, which ``SSL_CERT_FILE`` names (as it would name a
  cluster CA), checked through a TLS-terminating relay in front of a plain predictor;
- ``--predictor_ca``/``--predictor_cert``/``--predictor_key``: mutual TLS to an ovserve predictor serving
  ``--tls-*`` itself, over REST and gRPC, with a client certificate rotated in place (as cert-manager
  does) that the component takes for its new connections;
- the components serve ``--tls-*`` as ``ovserve serve`` does (server/tls.py).

Certificates are made by the ``openssl`` command (tests/client_proxies.py).
"""
from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from ovserve.server.child import free_ports

from . import models
from .client_proxies import Certs, make_certs
from .servers import EXACT, ExplainerProcess, ServerProcess, TransformerProcess
from .tls_tools import (
    BODY as MATMUL_BODY,
)
from .tls_tools import (
    HOST,
    ROTATION,
    SecretVolume,
    expected,
    infer_with_curl,
    tls_flags,
    triton,
    triton_infer,
    wait_https,
)

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed")


class TlsRelay:
    """Accepts TLS on 127.0.0.1:<port> and relays the plain bytes to the predictor."""

    def __init__(self, cert: Path, key: Path, upstream: int) -> None:
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(cert, key)
        self.upstream = upstream
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                writer.close()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        async def start() -> None:
            server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=self.ctx)
            self.port = server.sockets[0].getsockname()[1]
            self.ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.fixture(scope="module")
def relay(cert: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRelay]:
    repo = tmp_path_factory.mktemp("tls_repo")
    models.save(models.matmul(), repo, "matmul")
    server = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0", *EXACT]).wait_ready()
    relay = TlsRelay(*cert, upstream=server.rest_port)
    try:
        yield relay
    finally:
        relay.close()
        server.stop()


BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": list(range(8))}]}


def test_inference_over_tls(relay: TlsRelay, cert: tuple[Path, Path]) -> None:
    proc = TransformerProcess("--model_name", "matmul", "--predictor_host", f"localhost:{relay.port}",
                              "--predictor_use_ssl", "true", "--enable_predictor_health_check",
                              env={"SSL_CERT_FILE": str(cert[0])}).wait_ready()
    try:
        resp = requests.post(proc.url + "/v2/models/matmul/infer", json=BODY, timeout=10)
        assert resp.status_code == 200, resp.text
        w, b = models.matmul_weights()
        x = np.arange(8, dtype=np.float32)[None]
        np.testing.assert_allclose(np.array(resp.json()["outputs"][0]["data"]), (x @ w + b).reshape(-1), rtol=1e-5)
    finally:
        assert proc.stop() == 0


def test_untrusted_certificate_is_a_clear_503(relay: TlsRelay) -> None:
    proc = TransformerProcess("--model_name", "matmul", "--predictor_host", f"localhost:{relay.port}",
                              "--predictor_use_ssl").wait_ready()
    try:
        resp = requests.post(proc.url + "/v2/models/matmul/infer", json=BODY, timeout=10)
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"].startswith("predictor: ") and "certificate" in resp.json()["error"].lower()
    finally:
        assert proc.stop() == 0


# -- mutual TLS to an ovserve predictor that serves --tls-* itself ------------------------------------
@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs-a"))


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs-b"))


@pytest.fixture(scope="module")
def matmul_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("mtls_repo")
    models.save(models.matmul(), folder, "matmul")
    return folder


@pytest.fixture(scope="module")
def predictor(matmul_repo: Path, certs: Certs) -> Iterator[ServerProcess]:
    """``ovserve serve`` demanding client certificates of ``certs``' CA on REST and gRPC."""
    proc = ServerProcess(["--model-repository", str(matmul_repo), "--poll-interval", "0", *EXACT, *tls_flags(certs)])
    try:
        yield wait_https(proc, certs)
    finally:
        assert proc.stop() == 0


def predictor_port(proc: ServerProcess, protocol: str) -> int:
    return proc.grpc_port if protocol == "grpc-v2" else proc.rest_port


def client_flags(ca: Path, cert: Path | None = None, key: Path | None = None) -> list[str]:
    return ["--predictor_ca", str(ca), *(["--predictor_cert", str(cert), "--predictor_key", str(key)] if cert else [])]


@pytest.mark.parametrize("protocol", ["v2", "grpc-v2"])
def test_transformer_serves_mtls_and_reaches_its_predictor_with_a_client_certificate(
        predictor: ServerProcess, certs: Certs, protocol: str) -> None:
    proc = TransformerProcess("--model_name", "matmul", "--predictor_host",
                              f"localhost:{predictor_port(predictor, protocol)}", "--predictor_protocol", protocol,
                              *client_flags(certs.ca, certs.client_cert, certs.client_key),
                              "--enable_predictor_health_check", *tls_flags(certs))
    try:
        wait_https(proc, certs)  # ready: the predictor's model answered ready over mutual TLS
        out = infer_with_curl(proc.rest_port, "--cacert", str(certs.ca), "--cert", str(certs.client_cert),
                              "--key", str(certs.client_key))
        body, _, status = out.stdout.rpartition("\n")
        assert status == "200", out
        np.testing.assert_allclose(np.array(json.loads(body)["outputs"][0]["data"]).reshape(2, 4), expected(),
                                   rtol=1e-5)
        client = triton(proc.grpc_port, certs, certs)
        try:
            np.testing.assert_allclose(triton_infer(client), expected(), rtol=1e-5)
        finally:
            client.close()
        assert infer_with_curl(proc.rest_port, "--cacert", str(certs.ca)).stdout.endswith("000")
    finally:
        assert proc.stop() == 0


@pytest.mark.parametrize("protocol", ["v2", "grpc-v2"])
def test_transformer_without_a_client_certificate_is_refused_by_the_predictor(
        predictor: ServerProcess, certs: Certs, protocol: str) -> None:
    proc = TransformerProcess("--model_name", "matmul", "--predictor_host",
                              f"localhost:{predictor_port(predictor, protocol)}", "--predictor_protocol", protocol,
                              "--predictor_request_retries", "0", *client_flags(certs.ca)).wait_ready()
    try:
        resp = requests.post(proc.url + "/v2/models/matmul/infer", json=MATMUL_BODY, timeout=30)
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"].startswith("predictor: "), resp.text
    finally:
        assert proc.stop() == 0


def test_explainer_serves_mtls_and_reaches_its_predictor_with_a_client_certificate(
        predictor: ServerProcess, certs: Certs) -> None:
    proc = ExplainerProcess("matmul", f"localhost:{predictor.rest_port}",
                            *client_flags(certs.ca, certs.client_cert, certs.client_key), *tls_flags(certs))
    try:
        wait_https(proc, certs)
        x = np.arange(8, dtype=np.float32)[None] - 3
        resp = requests.post(f"https://{HOST}:{proc.rest_port}/v1/models/matmul:explain",
                             json={"instances": x.tolist()}, verify=str(certs.ca),
                             cert=(str(certs.client_cert), str(certs.client_key)), timeout=60)
        assert resp.status_code == 200, resp.text
        w, b = models.matmul_weights()
        (explanation,) = resp.json()["explanations"]
        target = int(np.argmax(x @ w + b))
        assert explanation["target"] == target
        np.testing.assert_allclose(explanation["attributions"], w[:, target] * x[0], rtol=1e-4, atol=1e-4)
    finally:
        assert proc.stop() == 0


@pytest.mark.parametrize("case, flags, says", [
    ("certificate without its key", ["--predictor_cert", "{cert}"], "a client certificate needs its key"),
    ("CA file missing", ["--predictor_ca", "{missing}"], "cannot read {missing}"),
])
def test_unusable_predictor_tls_files_cannot_start(certs: Certs, tmp_path: Path, case: str, flags: list[str],
                                                   says: str) -> None:
    names = {"cert": str(certs.client_cert), "missing": str(tmp_path / "nope.pem")}
    proc = TransformerProcess("--model_name", "matmul", "--predictor_host", "localhost:1",
                              *(f.format(**names) for f in flags))
    assert proc.wait_exit(60) == 1
    errors = [line for line in proc.lines if " ERROR " in line]
    assert len(errors) == 1, proc.log
    assert "cannot start: --predictor_ca/--predictor_cert/--predictor_key: " + says.format(**names) in errors[0]


@pytest.mark.parametrize("protocol", ["v2", "grpc-v2"])
def test_a_rotated_client_certificate_is_used_for_new_connections(
        matmul_repo: Path, certs: Certs, other: Certs, tmp_path: Path, protocol: str) -> None:
    """The predictor is replaced by one that trusts only the new client CA (its old connections gone):
    the transformer whose certificate files were rotated in place reaches it; one that kept the old
    files is refused (the control that shows the test could fail)."""
    rest, grpc_port = free_ports(2)
    fixed = ["--rest-port", str(rest), "--grpc-port", str(grpc_port)]
    port = grpc_port if protocol == "grpc-v2" else rest

    def start_predictor(client_ca: Path, client: Certs) -> ServerProcess:
        proc = ServerProcess(["--model-repository", str(matmul_repo), "--poll-interval", "0", *EXACT, *fixed,
                              "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
                              "--tls-client-ca", str(client_ca)])
        return wait_https(proc, certs, client=client)

    volume = SecretVolume(tmp_path / "volume", certs, client=True)
    predictor = start_predictor(certs.ca, certs)
    common = ["--model_name", "matmul", "--predictor_host", f"localhost:{port}", "--predictor_protocol", protocol]
    rotated = TransformerProcess(*common, *client_flags(certs.ca, volume.cert, volume.key)).wait_ready()
    kept = TransformerProcess(*common, "--predictor_request_retries", "0",
                              *client_flags(certs.ca, certs.client_cert, certs.client_key)).wait_ready()

    def infer(proc: TransformerProcess) -> requests.Response:
        return requests.post(proc.url + "/v2/models/matmul/infer", json=MATMUL_BODY, timeout=30)

    try:
        assert infer(rotated).status_code == 200 and infer(kept).status_code == 200
        volume.write(other, client=True, ca=certs.ca)  # the transformer's new client certificate, another CA's
        assert predictor.stop() == 0
        predictor = start_predictor(other.ca, other)  # trusts only the new client CA
        rotated.wait_until(lambda: infer(rotated).status_code == 200, "an answer with the new certificate",
                           ROTATION)
        np.testing.assert_allclose(np.array(infer(rotated).json()["outputs"][0]["data"]).reshape(2, 4),
                                   expected(), rtol=1e-5)
        refused = infer(kept)
        assert refused.status_code == 503 and refused.json()["error"].startswith("predictor: "), refused.text
        assert any("predictor TLS: " in line and "read again (version 2)" in line for line in rotated.lines), \
            rotated.log
    finally:
        assert rotated.stop() == 0
        assert kept.stop() == 0
        assert predictor.stop() == 0


def test_transformer_takes_its_tls_from_the_environment_as_the_operator_passes_it(
        predictor: ServerProcess, certs: Certs) -> None:
    """operator/tls.py's mutual TLS: one Secret's tls.crt/tls.key serve the transformer's listeners and are
    its client certificate to the predictor, ca.crt verifies both ways; all through OVSERVE_* variables."""
    env = {"OVSERVE_TLS_CERT": str(certs.server_cert), "OVSERVE_TLS_KEY": str(certs.server_key),
           "OVSERVE_TLS_CLIENT_CA": str(certs.ca), "OVSERVE_PREDICTOR_CA": str(certs.ca),
           "OVSERVE_PREDICTOR_CERT": str(certs.server_cert), "OVSERVE_PREDICTOR_KEY": str(certs.server_key)}
    proc = TransformerProcess("--model_name", "matmul", "--predictor_host", f"localhost:{predictor.rest_port}",
                              "--enable_predictor_health_check", env=env)
    try:
        wait_https(proc, certs)
        out = infer_with_curl(proc.rest_port, "--cacert", str(certs.ca), "--cert", str(certs.client_cert),
                              "--key", str(certs.client_key))
        assert out.stdout.endswith("200"), out
    finally:
        assert proc.stop() == 0
