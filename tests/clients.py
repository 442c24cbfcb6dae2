"""Clients shared by several test modules: a REST POST that says when its request has been sent,
and V2 clients of a model ``x`` FP32 -> ``y`` FP32 (tests/models.py)."""
from __future__ import annotations

import http.client
import json
import subprocess
import threading
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import tritonclient.grpc as tgrpc


def post(url: str, body: bytes, headers: dict[str, str], sent: threading.Event | None = None,
         timeout: float = 60) -> tuple[int, http.client.HTTPMessage, bytes]:
    """POST ``body`` on a new connection: (status, headers, body) of the answer. ``sent`` is set once the
    whole request has been handed to the kernel (``request()`` returns after writing it), before the
    answer is awaited: with tests/inflight.py, a test then knows when the server has read it all."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", parts.path, body=body, headers=headers)
        if sent is not None:
            sent.set()
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def grpc_infer(client: tgrpc.InferenceServerClient, model: str, x: np.ndarray, version: str = "") -> np.ndarray:
    """``y`` for ``x`` through tritonclient's gRPC client."""
    inp = tgrpc.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], model_version=version, client_timeout=30).as_numpy("y")


def binary_infer(url: str, model: str, x: np.ndarray, sent: threading.Event | None = None) -> np.ndarray:
    """POST /infer with the binary tensor data extension (``sent``: see :func:`post`)."""
    raw = np.ascontiguousarray(x, np.float32).tobytes()
    header = json.dumps({
        "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }).encode()
    status, headers, content = post(f"{url}/v2/models/{model}/infer", header + raw, sent=sent, headers={
        "Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"})
    assert status == 200, content[:2000]
    n = int(headers["Inference-Header-Content-Length"])
    out = json.loads(content[:n])["outputs"][0]
    return np.frombuffer(content[n:], np.float32).reshape(out["shape"])


def curl_grpc(url: str, request: bytes, tmp_path: Path, *args: str) -> tuple[dict[str, str], bytes]:
    """One unary gRPC call made by curl: another HTTP/2 implementation than grpcio's (nghttp2). The
    headers and trailers it printed, by name, and the reply's body."""
    body, head, out = tmp_path / "request.bin", tmp_path / "headers.txt", tmp_path / "reply.bin"
    body.write_bytes(request)
    done = subprocess.run(["curl", "-sS", "--max-time", "20", *args, "-H", "content-type: application/grpc",
                           "-H", "te: trailers", "--data-binary", f"@{body}", "-D", str(head), "-o", str(out), url],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    fields = {}
    for line in head.read_text().splitlines():
        name, sep, value = line.partition(":")
        if sep and not line.startswith("HTTP/"):
            fields[name.strip().lower()] = value.strip()
    return fields, out.read_bytes()
