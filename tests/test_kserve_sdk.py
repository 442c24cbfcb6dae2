"""The server as users reach it: the kserve SDK's clients, and plain curl.

The kserve SDK's gRPC stubs define the protobuf package ``inference``, as
tritonclient's do: both in one process fail with duplicate symbols. So the SDK
runs in a child Python process (the script below) that prints one JSON object
of results; the assertions, and the expected values, stay here.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from . import models

TIMEOUT = 60

#: Run as ``python sdk_client.py REST_URL GRPC_TARGET X_JSON``. Every check is
#: recorded as {"ok": value} or {"error": repr}, so that one failure hides no other.
SDK_CLIENT = r'''
import asyncio, json, sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

rest, target, x = sys.argv[1], sys.argv[2], np.asarray(json.loads(sys.argv[3]), dtype=np.float32)
results = {}


async def check(name, coro):
    try:
        results[name] = {"ok": await coro}
    except Exception as exc:  # reported to the test, which names the failure
        results[name] = {"error": repr(exc)}


def request(request_id, binary=False):
    tensor = InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return InferRequest("matmul", [tensor], request_id=request_id)


async def infer_rest(client, request_id, binary):
    resp = await client.infer(rest, request(request_id, binary), model_name="matmul")
    return {"id": resp.id, "y": resp.outputs[0].as_numpy().tolist()}


async def infer_grpc(client, request_id):
    resp = await client.infer(request(request_id))
    return {"id": resp.id, "y": resp.outputs[0].as_numpy().tolist()}


async def main():
    async with InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=20)) as c:
        await check("v2_live", c.is_server_live(rest))
        await check("v2_ready", c.is_server_ready(rest))
        await check("v2_model_ready", c.is_model_ready(rest, "matmul"))
        await check("v2_model_ready_unknown", c.is_model_ready(rest, "nope"))
        await check("v2_infer_json", infer_rest(c, "sdk-json", False))
        await check("v2_infer_binary", infer_rest(c, "sdk-binary", True))
    async with InferenceRESTClient(RESTConfig(protocol="v1", retries=0, timeout=20)) as c:
        await check("v1_live", c.is_server_live(rest))
        await check("v1_model_ready", c.is_model_ready(rest, "matmul"))
        await check("v1_infer", c.infer(rest, {"instances": x.tolist()}, model_name="matmul"))
    async with InferenceGRPCClient(target, retries=0, timeout=20) as c:
        await check("grpc_live", c.is_server_live())
        await check("grpc_ready", c.is_server_ready())
        await check("grpc_model_ready", c.is_model_ready("matmul"))
        await check("grpc_infer", infer_grpc(c, "sdk-grpc"))


asyncio.run(main())
print(json.dumps(results))
'''


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(11).standard_normal((3, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def expected(x: np.ndarray) -> np.ndarray:
    w, b = models.matmul_weights()
    return x @ w + b


@pytest.fixture(scope="module")
def sdk(server, x: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The kserve SDK's results against the shared server, from a child process."""
    script = tmp_path_factory.mktemp("sdk") / "sdk_client.py"
    script.write_text(SDK_CLIENT)
    proc = subprocess.run([sys.executable, str(script), server.url, server.grpc_target, json.dumps(x.tolist())],
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ok(sdk: dict, name: str):
    assert "ok" in sdk[name], f"{name}: {sdk[name]['error']}"
    return sdk[name]["ok"]


@pytest.mark.parametrize("check", ["v2_live", "v2_ready", "v2_model_ready", "v1_live", "v1_model_ready",
                                   "grpc_live", "grpc_ready", "grpc_model_ready"])
def test_sdk_health(sdk: dict, check: str) -> None:
    assert ok(sdk, check) is True


def test_sdk_v2_unknown_model_is_not_ready(sdk: dict) -> None:
    assert ok(sdk, "v2_model_ready_unknown") is False


@pytest.mark.parametrize("check, request_id", [("v2_infer_json", "sdk-json"), ("v2_infer_binary", "sdk-binary"),
                                               ("grpc_infer", "sdk-grpc")])
def test_sdk_v2_infer_matmul(sdk: dict, expected: np.ndarray, check: str, request_id: str) -> None:
    result = ok(sdk, check)
    assert result["id"] == request_id
    np.testing.assert_allclose(np.asarray(result["y"], dtype=np.float32), expected, rtol=1e-5, atol=1e-5)


def test_sdk_v1_infer_matmul(sdk: dict, expected: np.ndarray) -> None:
    result = ok(sdk, "v1_infer")
    np.testing.assert_allclose(np.asarray(result["predictions"], dtype=np.float32), expected, rtol=1e-5, atol=1e-5)


# -- curl ------------------------------------------------------------------------
CURL = shutil.which("curl")
needs_curl = pytest.mark.skipif(CURL is None, reason="the curl binary is not installed")


def curl_post(url: str, body: Path) -> tuple[int, dict, str]:
    """POST a file with curl and no Content-Type header; (status, JSON body, curl's trace)."""
    out = body.with_suffix(".out")
    proc = subprocess.run(
        [CURL, "-sS", "-v", "--max-time", "20", "-X", "POST", "-H", "Content-Type:",
         "--data-binary", f"@{body}", "-o", str(out), "-w", "%{http_code}", url],
        capture_output=True, text=True, timeout=TIMEOUT,
     check=False)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout), json.loads(out.read_text()), proc.stderr


@needs_curl
def test_curl_v2_json_without_content_type(server, x: np.ndarray, expected: np.ndarray, tmp_path: Path) -> None:
    body = tmp_path / "v2.json"
    body.write_text(json.dumps({"id": "curl-1", "inputs": [
        {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}]}))
    status, doc, trace = curl_post(f"{server.url}/v2/models/matmul/infer", body)
    assert "> content-type" not in trace.lower()  # really sent without one
    assert status == 200, doc
    assert doc["id"] == "curl-1" and doc["model_name"] == "matmul"
    (out,) = doc["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("y", "FP32", [3, 4])
    np.testing.assert_allclose(np.asarray(out["data"], dtype=np.float32).reshape(3, 4), expected,
                               rtol=1e-5, atol=1e-5)


@needs_curl
def test_curl_v1_predict(server, x: np.ndarray, expected: np.ndarray, tmp_path: Path) -> None:
    body = tmp_path / "v1.json"
    body.write_text(json.dumps({"instances": x.tolist()}))
    status, doc, _ = curl_post(f"{server.url}/v1/models/matmul:predict", body)
    assert status == 200, doc
    np.testing.assert_allclose(np.asarray(doc["predictions"], dtype=np.float32), expected, rtol=1e-5, atol=1e-5)
