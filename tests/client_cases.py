"""The client compatibility cases, written once against KServe's client API, and their runner: the same case
code run with ``from kserve import ...`` and with ``from ovserve.client import ...`` (the import swapped), each
flavour in a Python process of its own, against a given server's gRPC target and REST URL.

``python -m tests.client_cases FLAVOUR GRPC_TARGET REST_URL TLS_JSON [EXCLUDED_JSON]`` prints every case's
outcome as JSON: ``{"ok": answer}`` or ``{"error": [kind, code]}``; a case named in ``EXCLUDED_JSON`` is not
run. Each flavour runs in a process of its own: kserve's stubs and tritonclient's (in the suite's process)
both define protobuf package ``inference`` in protobuf's default pool (ovserve's client keeps its messages
apart, tests/test_client_coexist.py), and both flavours run alike.

Used by tests/test_client_compat.py (against ovserve) and tests/test_client_kserve_server.py (against
KServe's own Python model server).
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FLAVOURS = ("kserve", "ovserve")

#: ``matmul``'s input in every case
X = np.arange(16, dtype=np.float32).reshape(2, 8) / 7

#: case -> (kserve's outcome, ovserve's outcome) where ovserve's client differs on purpose, whatever the server
#: ("ok": an answer, "error": any error)
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


def run_flavour(flavour: str, grpc_target: str, rest_url: str, tls: dict[str, str],
                excluded: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every case but ``excluded``, run with ``flavour``'s client in a child Python."""
    done = subprocess.run([sys.executable, "-m", "tests.client_cases", flavour, grpc_target, rest_url,
                           json.dumps(tls), json.dumps(list(excluded))],
                          cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, f"{flavour} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"
    results: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def differing(answers: dict[str, dict[str, Any]], besides: tuple[str, ...] = ()) -> dict[str, Any]:
    """The cases (outside :data:`DIFFERENT` and ``besides``) where the two flavours' answers are not equal."""
    kserve, ovserve = answers["kserve"], answers["ovserve"]
    return {case: (kserve[case], ovserve.get(case)) for case in kserve if case not in DIFFERENT
            and case not in besides and kserve[case] != ovserve.get(case)}


def check_documented_difference(answers: dict[str, dict[str, Any]], case: str) -> None:
    """Both sides of a difference on purpose (:data:`DIFFERENT`)."""
    kserve_said, ovserve_said = DIFFERENT[case]
    if kserve_said == "error":
        assert "error" in answers["kserve"][case], answers["kserve"][case]
    else:
        assert answers["kserve"][case] == kserve_said
    if ovserve_said == "ok":
        assert "ok" in answers["ovserve"][case], answers["ovserve"][case]
    else:
        assert answers["ovserve"][case] == ovserve_said


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


async def cases(grpc_target: str, rest_url: str, tls: dict[str, str], excluded: frozenset[str] = frozenset()) \
        -> dict[str, Any]:
    """Every case but ``excluded``, written against KServe's API: the names below are whichever client the process
    imported."""
    results: dict[str, Any] = {}
    x = X

    async def case(name: str, call: Any) -> None:
        if name in excluded:
            call.close()  # never awaited: not run
            return
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
    excluded = frozenset(json.loads(sys.argv[5]) if len(sys.argv) > 5 else [])
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
    print(json.dumps(asyncio.run(cases(grpc_target, rest_url, json.loads(tls_json), excluded))))
