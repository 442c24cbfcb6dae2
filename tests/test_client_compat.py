"""The same test code run with ``kserve``'s clients and with ``ovserve.client``'s (the import swapped) gives the
same answers from a real ovserve server.

:func:`cases` is written once against KServe's API; ``python -m tests.test_client_compat FLAVOUR ...`` runs it
with ``from kserve import ...`` or ``from ovserve.client import ...`` and prints every case's outcome as
JSON: ``{"ok": answer}`` or ``{"error": [kind, code]}``. Each flavour runs in a process of its own: kserve's
stubs and tritonclient's (in the suite's process) both define protobuf package ``inference`` in protobuf's
default pool (ovserve's client keeps its messages apart, tests/test_client_coexist.py), and both flavours
run alike.

The answers must be equal case by case, except where ovserve's client differs from KServe's on purpose
(docs/client.md): those cases assert both sides of the difference.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .client_proxies import TlsRelay, make_certs
from .servers import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
FLAVOURS = ("kserve", "ovserve")

#: case -> (kserve's outcome, ovserve's outcome) where ovserve's client differs on purpose ("ok": an answer,
#: "error": any error)
DIFFERENT = {
    # KServe documents a raw ModelInferRequest for infer, and its code refuses one
    "grpc_raw_model_infer_request": ({"error": ["InvalidInput", ""]}, "ok"),
    # KServe passes retries=1 to gRPC as maxAttempts 1, which makes every call fail; ovserve says so at once
    "grpc_retries_1": ({"error": ["RpcError", "INVALID_ARGUMENT"]}, {"error": ["ValueError", ""]}),
    # KServe sends a list as typed contents, and has no contents field for FP16; ovserve sends raw bytes
    "grpc_fp16_list": ({"error": ["InvalidInput", ""]}, "ok"),
    # KServe's RESTConfig builds a transport with cert and drops it: no client certificate, the endpoint of
    # mutual TLS refuses the handshake (httpx's RemoteProtocolError under TLS 1.3, ConnectError under 1.2)
    "rest_v2_mutual_tls": ("error", "ok"),
}


def run_flavour(flavour: str, server: ServerProcess, tls: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "tests.test_client_compat", flavour, server.grpc_target, server.url,
                           json.dumps(tls)], cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, f"{flavour} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"
    results: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


@pytest.fixture(scope="module")
def answers(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    if importlib.util.find_spec("kserve") is None:  # looked up, not imported: its stubs stay out of this process
        pytest.skip("the kserve package is not installed")
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    certs = make_certs(tmp_path_factory.mktemp("compat_certs"))
    with TlsRelay(certs, server.rest_port).start() as relay:
        tls = {"url": f"https://localhost:{relay.port}", "ca": str(certs.ca), "cert": str(certs.client_cert),
               "key": str(certs.client_key)}
        return {flavour: run_flavour(flavour, server, tls) for flavour in FLAVOURS}


def test_every_case_ran_in_both(answers: dict[str, dict[str, Any]]) -> None:
    assert set(answers["kserve"]) == set(answers["ovserve"])
    assert len(answers["ovserve"]) >= 30


def test_same_answers(answers: dict[str, dict[str, Any]]) -> None:
    kserve, ovserve = answers["kserve"], answers["ovserve"]
    differ = {case: (kserve[case], ovserve[case]) for case in kserve if case not in DIFFERENT
              and kserve[case] != ovserve[case]}
    assert not differ, json.dumps(differ, indent=1)[:6000]


@pytest.mark.parametrize("case", list(DIFFERENT))
def test_documented_differences(answers: dict[str, dict[str, Any]], case: str) -> None:
    kserve_said, ovserve_said = DIFFERENT[case]
    if kserve_said == "error":
        assert "error" in answers["kserve"][case], answers["kserve"][case]
    else:
        assert answers["kserve"][case] == kserve_said
    if ovserve_said == "ok":
        assert "ok" in answers["ovserve"][case], answers["ovserve"][case]
    else:
        assert answers["ovserve"][case] == ovserve_said


def test_answers_are_right(answers: dict[str, dict[str, Any]]) -> None:
    """Equal answers could be equally wrong: the values against numpy."""
    from . import models

    w, b = models.matmul_weights()
    x = np.arange(16, dtype=np.float32).reshape(2, 8) / 7
    for flavour in FLAVOURS:
        got = answers[flavour]
        for case in ("grpc_matmul_binary", "grpc_matmul_list", "rest_v2_matmul_binary", "rest_v2_matmul_json"):
            (y,) = got[case]["ok"]["outputs"]
            np.testing.assert_allclose(np.asarray(y["values"], np.float32), x @ w + b, rtol=1e-5, atol=1e-5)
        assert got["grpc_matmul_binary"]["ok"]["id"] == "compat-1"
        assert got["grpc_health"]["ok"] == [True, True, True]
        assert got["grpc_model_ready_unknown"] == {"error": ["RpcError", "NOT_FOUND"]}
        assert got["rest_v2_unknown_model"] == {"error": ["HTTPStatusError", 404]}
        assert got["grpc_dt_int8"]["ok"]["outputs"][0]["values"] == [[-4, -1, 2, 5], [8, 11, 14, 17]]
    ready, through_tls = answers["ovserve"]["rest_v2_mutual_tls"]["ok"]
    assert ready is True and through_tls["id"] == "tls"
    np.testing.assert_allclose(np.asarray(through_tls["outputs"][0]["values"], np.float32), x @ w + b, rtol=1e-5,
                               atol=1e-5)


# -- the cases: one text for both clients (run in a child process) ------------------------------------
def normal(resp: Any, version: bool = True) -> dict[str, Any]:
    """A response as plain JSON; BYTES elements as latin-1 text, parameters (KServe's may be a protobuf map)
    as plain values. ``version``: KServe's REST client drops the model version, so REST leaves it out."""

    def params(p: Any) -> dict[str, Any]:
        out = {}
        for k, v in (p or {}).items():
            out[k] = getattr(v, v.WhichOneof("parameter_choice")) if hasattr(v, "WhichOneof") else v
        return out

    def values(arr: np.ndarray) -> Any:
        if arr.dtype == object:
            rows = arr.reshape(len(arr), -1)
            return [[v.decode("latin-1") if isinstance(v, bytes) else v for v in row] for row in rows]
        return arr.tolist()

    doc = {"id": resp.id, "model_name": resp.model_name, "parameters": params(resp.parameters),
           "outputs": [{"name": o.name, "datatype": o.datatype, "shape": list(o.shape),
                        "parameters": params(o.parameters), "values": values(o.as_numpy())} for o in resp.outputs]}
    if version:
        doc["model_version"] = resp.model_version
    return doc


def outcome_of(exc: BaseException) -> list[Any]:
    """[kind, code]: the error's kind and, when it has one, its gRPC code or HTTP status."""
    import grpc

    if isinstance(exc, grpc.RpcError):
        return ["RpcError", exc.code().name]
    response = getattr(exc, "response", None)
    if response is not None and hasattr(response, "status_code"):
        return ["HTTPStatusError", response.status_code]
    kinds = ("InvalidInput", "InferenceError", "ConnectError", "ValueError", "TypeError")
    return [next((k for k in kinds if k in {c.__name__ for c in type(exc).__mro__}), type(exc).__name__), ""]


async def cases(grpc_target: str, rest_url: str, tls: dict[str, str]) -> dict[str, Any]:
    """Every case, written against KServe's API: the names below are whichever client the process imported."""
    results: dict[str, Any] = {}
    x = np.arange(16, dtype=np.float32).reshape(2, 8) / 7

    async def case(name: str, call: Any) -> None:
        try:
            results[name] = {"ok": await call}
        except Exception as exc:  # recorded: the other flavour must fail the same way
            results[name] = {"error": outcome_of(exc)}

    def matmul(request_id: str | None = None, binary: bool | None = True) -> Any:
        if binary is None:
            tensor = InferInput("x", [2, 8], "FP32", data=x.reshape(-1).tolist())
        else:
            tensor = InferInput("x", [2, 8], "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
        return InferRequest("matmul", [tensor], request_id=request_id)

    async def grpc_calls(c: Any) -> None:
        async def infer(request: Any, **kw: Any) -> dict[str, Any]:
            return normal(await c.infer(request, **kw))

        await case("grpc_health", gather(c.is_server_live(), c.is_server_ready(), c.is_model_ready("matmul")))
        await case("grpc_model_ready_unknown", c.is_model_ready("nope"))
        await case("grpc_matmul_binary", infer(matmul("compat-1")))
        await case("grpc_matmul_list", infer(matmul("compat-2", binary=None)))
        await case("grpc_matmul_headers_no_deadline", infer(matmul("compat-3"), timeout=None,
                                                              headers=[("x-tenant", "t-1")]))
        for datatype, dtype in (("BOOL", np.bool_), ("UINT8", np.uint8), ("UINT16", np.uint16),
                                ("UINT32", np.uint32), ("UINT64", np.uint64), ("INT8", np.int8),
                                ("INT16", np.int16), ("INT32", np.int32), ("INT64", np.int64),
                                ("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64)):
            arr = (np.arange(8).reshape(2, 4) * 3 + (1 if np.dtype(dtype).kind in "ub" else -5)).astype(dtype)
            tensor = InferInput("x", [2, 4], datatype)
            tensor.set_data_from_numpy(arr)
            await case(f"grpc_dt_{datatype.lower()}", infer(InferRequest(f"dt_{datatype.lower()}", [tensor])))
        text = InferInput("x", [2, 4], "BYTES")
        text.set_data_from_numpy(np.array([[b"a", b"", b"\x00\xff", "é".encode()], [b"x" * 300, b"y", b"z", b"w"]],
                                          dtype=object))
        await case("grpc_dt_bytes", infer(InferRequest("dt_bytes", [text])))
        words = InferInput("x", [2, 4], "BYTES", data=["a", "b", "cc", "dd", "e", "f", "g", "h"])
        await case("grpc_dt_bytes_list", infer(InferRequest("dt_bytes", [words])))
        ints = InferInput("x", [2, 4], "INT32", data=[1, 2, 3, 4, 5, 6, 7, -8])
        await case("grpc_dt_int32_list", infer(InferRequest("dt_int32", [ints])))
        halves = InferInput("x", [1, 4], "FP16", data=[0.5, 1.5, 2.0, -1.0])
        await case("grpc_fp16_list", infer(InferRequest("dt_fp16", [halves])))
        a, b = InferInput("a", [2, 4], "FP32"), InferInput("b", [2, 4], "FP32")
        a.set_data_from_numpy(x[:, :4].copy())
        b.set_data_from_numpy(x[:, 4:].copy())
        await case("grpc_two_outputs", infer(InferRequest("two", [a, b], request_id="two")))
        prod = [RequestedOutput("prod")]
        await case("grpc_requested_output", infer(InferRequest("two", [a, b], request_outputs=prod)))
        narrow = InferInput("x", [2, 3], "FP32")
        narrow.set_data_from_numpy(np.ones((2, 3), np.float32))
        await case("grpc_wrong_shape", infer(InferRequest("matmul", [narrow])))
        unknown = InferInput("x", [2, 8], "FP32")
        unknown.set_data_from_numpy(x)
        await case("grpc_unknown_model", infer(InferRequest("nope", [unknown])))
        await case("grpc_raw_model_infer_request", infer(matmul("raw").to_grpc()))

    async with InferenceGRPCClient(grpc_target) as c:
        await grpc_calls(c)

    async def retries_1() -> bool:
        async with InferenceGRPCClient(grpc_target, retries=1) as c:
            return bool(await c.is_server_live())

    await case("grpc_retries_1", retries_1())

    async with InferenceRESTClient(RESTConfig(protocol="v2", timeout=30)) as c:
        async def infer_rest(request: Any, model: str) -> dict[str, Any]:
            return normal(await c.infer(rest_url, request, model_name=model), version=False)

        await case("rest_v2_health", gather(c.is_server_live(rest_url), c.is_server_ready(rest_url),
                                            c.is_model_ready(rest_url, "matmul"), c.is_model_ready(rest_url, "nope")))
        await case("rest_v2_matmul_binary", infer_rest(matmul("rest-1"), "matmul"))
        await case("rest_v2_matmul_json", infer_rest(matmul("rest-2", binary=False), "matmul"))
        ints = InferInput("x", [2, 4], "INT64")
        ints.set_data_from_numpy(np.arange(8, dtype=np.int64).reshape(2, 4) - 3)
        await case("rest_v2_dt_int64", infer_rest(InferRequest("dt_int64", [ints], request_id="i"), "dt_int64"))
        await case("rest_v2_unknown_model", infer_rest(matmul(), "nope"))

    async def mutual_tls() -> list[Any]:
        config = RESTConfig(protocol="v2", retries=0, timeout=30, cert=(tls["cert"], tls["key"]), verify=tls["ca"])
        async with InferenceRESTClient(config) as c:
            return [await c.is_server_ready(tls["url"]),
                    normal(await c.infer(tls["url"], matmul("tls"), model_name="matmul"), version=False)]

    await case("rest_v2_mutual_tls", mutual_tls())
    async with InferenceRESTClient(RESTConfig(protocol="v1", timeout=30)) as c:
        await case("rest_v1_health", gather(c.is_server_live(rest_url), c.is_model_ready(rest_url, "matmul")))
        await case("rest_v1_predict", c.infer(rest_url, {"instances": x.tolist()}, model_name="matmul"))
    return results


async def gather(*calls: Any) -> list[Any]:
    return [await c for c in calls]


if __name__ == "__main__":
    flavour, grpc_target, rest_url, tls_json = sys.argv[1:5]
    if flavour == "kserve":
        from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
        from kserve.protocol.infer_type import RequestedOutput
    else:
        from ovserve.client import (
            InferenceGRPCClient,
            InferenceRESTClient,
            InferInput,
            InferRequest,
            RequestedOutput,
            RESTConfig,
        )
    print(json.dumps(asyncio.run(cases(grpc_target, rest_url, json.loads(tls_json)))))
