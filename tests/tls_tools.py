"""What the TLS tests share: the model and its request, the flags of a set of certificates, waits and
requests over TLS, the certificate a new connection is given, and a folder laid out as kubelet lays out
a Secret volume (rotated the way kubelet rotates it)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
from pathlib import Path
from typing import TypeVar

import numpy as np
import requests
import tritonclient.grpc as tgrpc

from . import models
from .client_proxies import Certs
from .servers import ComponentProcess

P = TypeVar("P", bound=ComponentProcess)

HOST = "127.0.0.1"
X = np.arange(16, dtype=np.float32).reshape(2, 8)
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": X.reshape(-1).tolist()}]}
#: seconds a rotated certificate may take to reach new connections (the server looks every second)
ROTATION = 15


def expected() -> np.ndarray:
    w, b = models.matmul_weights()
    return X @ w + b


def tls_flags(c: Certs, client_ca: bool = True, folder: Path | None = None) -> list[str]:
    """--tls-* for set ``c`` (or, with ``folder``, for the files a Secret volume would hold there)."""
    cert, key, ca = ((folder / "tls.crt", folder / "tls.key", folder / "ca.crt") if folder is not None
                     else (c.server_cert, c.server_key, c.ca))
    return ["--tls-cert", str(cert), "--tls-key", str(key), *(["--tls-client-ca", str(ca)] if client_ca else [])]


def wait_https(proc: P, c: Certs, timeout: float = 60, client: Certs | None = None) -> P:
    """Until GET /v2/health/ready answers 200 over TLS, the server verified against ``c``'s CA, with
    ``client``'s client certificate (default: ``c``'s)."""
    proc.wait_ports(timeout)
    client = client or c

    def ready() -> bool:
        try:
            return requests.get(f"https://{HOST}:{proc.rest_port}/v2/health/ready", verify=str(c.ca),
                                cert=(str(client.client_cert), str(client.client_key)), timeout=5).status_code == 200
        except requests.RequestException:
            return False

    proc.wait_until(ready, "HTTPS ready", timeout)
    return proc


def curl(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """curl ``url``, printing the status last (``000`` when no HTTP answer came)."""
    return subprocess.run(["curl", "-sS", "--max-time", "20", "-w", "\n%{http_code}", *args, url],
                          capture_output=True, text=True, timeout=60, check=False)


def infer_with_curl(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return curl(f"https://localhost:{port}/v2/models/matmul/infer", "-H", "Content-Type: application/json",
                "-d", json.dumps(BODY), *args)


def served_certificate(port: int, ca: Path | None = None, alpn: str = "http/1.1") -> bytes:
    """The DER certificate a new TLS connection to ``port`` is given (verified against ``ca`` when given)."""
    ctx = ssl.create_default_context(cafile=str(ca)) if ca is not None else ssl._create_unverified_context()
    ctx.set_alpn_protocols([alpn])
    with socket.create_connection((HOST, port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return der


def der(pem: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.read_text())


def triton(port: int, c: Certs | None, client: Certs | None) -> tgrpc.InferenceServerClient:
    """tritonclient's gRPC client over TLS trusting ``c``'s CA, with ``client``'s certificate if given."""
    assert c is not None
    kw = {"private_key": str(client.client_key), "certificate_chain": str(client.client_cert)} if client else {}
    return tgrpc.InferenceServerClient(f"{HOST}:{port}", ssl=True, root_certificates=str(c.ca), **kw)


def triton_infer(client: tgrpc.InferenceServerClient) -> np.ndarray:
    tensor = tgrpc.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    result = client.infer("matmul", [tensor], client_timeout=20).as_numpy("y")
    assert result is not None
    return result


class SecretVolume:
    """A folder laid out as kubelet lays out a Secret volume: ``tls.crt``, ``tls.key`` and ``ca.crt`` are
    links through ``..data`` to a timestamped folder, and an update swaps ``..data`` in one rename.
    ``write(c)`` puts ``c``'s server certificate, key and CA there; ``client=True`` its client certificate."""

    def __init__(self, folder: Path, c: Certs, client: bool = False, ca: Path | None = None) -> None:
        self.folder = folder
        self.generation = 0
        self.write(c, client, ca)
        for name in ("tls.crt", "tls.key", "ca.crt"):
            (folder / name).symlink_to(Path("..data") / name)

    @property
    def cert(self) -> Path:
        return self.folder / "tls.crt"

    @property
    def key(self) -> Path:
        return self.folder / "tls.key"

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    def write(self, c: Certs, client: bool = False, ca: Path | None = None) -> None:
        """``c``'s files (``ca``: another CA file instead of ``c``'s)."""
        self.generation += 1
        data = self.folder / f"..2026_11_24_{self.generation:02d}"
        data.mkdir(parents=True)
        cert, key = (c.client_cert, c.client_key) if client else (c.server_cert, c.server_key)
        for name, source in (("tls.crt", cert), ("tls.key", key), ("ca.crt", ca or c.ca)):
            shutil.copyfile(source, data / name)
        link = self.folder / "..data_tmp"
        link.symlink_to(data.name)
        os.replace(link, self.folder / "..data")
