"""V2 clients of a model ``x`` FP32 -> ``y`` FP32 (tests/models.py), shared by the lifecycle and engine tests."""
from __future__ import annotations

import json

import numpy as np
import requests
import tritonclient.grpc as tgrpc


def grpc_infer(client: tgrpc.InferenceServerClient, model: str, x: np.ndarray, version: str = "") -> np.ndarray:
    """``y`` for ``x`` through tritonclient's gRPC client."""
    inp = tgrpc.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], model_version=version, client_timeout=30).as_numpy("y")


def binary_infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    """POST /infer with the binary tensor data extension, through plain requests."""
    raw = np.ascontiguousarray(x, np.float32).tobytes()
    header = json.dumps({
        "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }).encode()
    resp = requests.post(f"{url}/v2/models/{model}/infer", data=header + raw, timeout=60,
                         headers={"Inference-Header-Content-Length": str(len(header)),
                                  "Content-Type": "application/octet-stream"})
    assert resp.status_code == 200, resp.text
    n = int(resp.headers["Inference-Header-Content-Length"])
    out = json.loads(resp.content[:n])["outputs"][0]
    return np.frombuffer(resp.content[n:], np.float32).reshape(out["shape"])
