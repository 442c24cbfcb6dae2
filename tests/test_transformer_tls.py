"""``--predictor_use_ssl``: the transformer reaches its predictor over real TLS.

ovserve's predictor speaks plain HTTP (TLS is the mesh's or the ingress's job),
so a TLS-terminating TCP relay runs here, in a thread, with a self-signed
certificate made by the ``openssl`` command; the transformer trusts it through
``SSL_CERT_FILE``, as it would trust a cluster CA.
"""
from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import requests

from . import models
from .servers import EXACT, ServerProcess, TransformerProcess

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
