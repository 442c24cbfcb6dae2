"""ovserve's gRPC clients share a process with tritonclient's, kserve's and a TorchServe user's own stubs.

tritonclient.grpc, the kserve SDK and ovserve's server stubs all define protobuf package ``inference`` in
protobuf's default descriptor pool, and a TorchServe user's generated stubs define
``org.pytorch.serve.grpc.*`` there as ovserve's server stubs do. ``ovserve.client`` keeps its messages in a
pool of its own (client/proto.py), so it imports beside any of them.

Each test runs one process (``python -m tests.test_client_coexist FLAVOUR ...``, a fresh interpreter, so
that what the suite's process already holds proves nothing either way) that imports everything first,
ovserve's ``InferenceGRPCClient`` and ``TorchServeGRPCClient`` loaded, then calls one real ``ovserve serve``
with each client: the third party's V2 client, ovserve's (with an ``InferRequest`` and with the third
party's own ``ModelInferRequest``), the TorchServe user's stubs and ovserve's TorchServe client (with the
user's own ``PredictionsRequest``). tritonclient.grpc and kserve cannot be imported into one process
whatever ovserve does (their own files, ``grpc_service.proto`` and ``grpc_predict_v2.proto``, define the
same ``inference`` symbols: :func:`test_tritonclient_and_kserve_clash_with_each_other`), so the three are
two processes: tritonclient's (ovserve's client imported first) and kserve's (ovserve's imported last).
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .servers import ServerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
#: the add model's input (y = x + 1)
X = np.arange(16, dtype=np.float32).reshape(1, 16)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``add`` over KServe V2 gRPC and TorchServe's inference and management gRPC APIs."""
    from . import models

    repo = tmp_path_factory.mktemp("coexist")
    models.save(models.add_one(), repo, "add")
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0",
                          "--ts-inference-port", "0", "--ts-management-port", "0"])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def run(flavour: str, server: ServerProcess) -> dict[str, Any]:
    """Run :func:`one_process` for ``flavour`` in a fresh interpreter; what each client got."""
    targets = [server.grpc_target, f"127.0.0.1:{server.ports['ts-inference']}",
               f"127.0.0.1:{server.ports['ts-management']}"]
    done = subprocess.run([sys.executable, "-m", "tests.test_client_coexist", flavour, *targets], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, f"{flavour} (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-6000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines and lines[-1] == f"{flavour}: ok", done.stdout + done.stderr
    got: dict[str, Any] = json.loads(lines[-2])
    return got


@pytest.mark.parametrize("flavour", ["tritonclient", "kserve"])
def test_one_process_with_each_client(server: ServerProcess, flavour: str) -> None:
    if importlib.util.find_spec(flavour) is None:
        pytest.skip(f"the {flavour} package is not installed")
    got = run(flavour, server)
    expected = (X + 1).tolist()
    v2 = [flavour, "ovserve", f"ovserve with {flavour}'s ModelInferRequest", f"{flavour}'s reply decoded by ovserve"]
    assert set(got["v2"]) == set(v2), got
    for who in v2:
        assert got["v2"][who] == expected, (who, got["v2"][who])
    ts = got["torchserve"]
    assert ts["user's stubs"]["ping"] == ts["ovserve"]["ping"] == {"status": "Healthy"}, ts
    assert ts["user's stubs"]["models"] == ts["ovserve"]["models"] == ["add"], ts
    for who in ("user's stubs", "ovserve", "ovserve with the user's PredictionsRequest"):
        assert ts[who]["y"] == expected, (who, ts[who])
    # what the process held: each third party's modules, none of ovserve's stubs, the client's own pool
    assert got["modules"] == {"ovserve's stubs": [], "client": True, "third party": True, "user's stubs": True}, got


def test_tritonclient_and_kserve_clash_with_each_other() -> None:
    """Why the three are two processes: without ovserve at all, tritonclient.grpc and kserve refuse to share one.
    (If this fails, they have made peace: merge the two flavours into one process.)"""
    if importlib.util.find_spec("kserve") is None:  # looked up, not imported: its stubs stay out of this process
        pytest.skip("the kserve package is not installed")
    done = subprocess.run([sys.executable, "-c", "import tritonclient.grpc\nimport kserve"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and "duplicate symbol 'inference." in done.stderr, done.stderr[-3000:]


# -- the one process (a child: python -m tests.test_client_coexist FLAVOUR V2 TS_INFERENCE TS_MANAGEMENT) --
def import_all(flavour: str) -> Any:
    """Everything at once, before any call: the third party's gRPC client, a TorchServe user's stubs, ovserve's
    two gRPC clients (their modules loaded). tritonclient after ovserve's client, kserve before it, so that
    neither order is left out. Returns the third party's module."""
    from .ts_stubs import ts_stubs

    if flavour == "kserve":
        import kserve

        other: Any = kserve
    ts_stubs()
    from ovserve.client import InferenceGRPCClient, TorchServeGRPCClient  # lazily exported: this loads them

    assert InferenceGRPCClient and TorchServeGRPCClient
    if flavour == "tritonclient":
        import tritonclient.grpc

        other = tritonclient.grpc
    return other


def third_party_v2(flavour: str, target: str) -> dict[str, Any]:
    """The third party's own client; its generated stub's raw reply decoded by ovserve's types; its raw
    ModelInferRequest sent by ovserve's client, beside an InferRequest."""
    import grpc

    from ovserve.client import InferenceGRPCClient, InferInput, InferRequest, InferResponse

    got: dict[str, Any] = {}
    if flavour == "tritonclient":
        from tritonclient.grpc import InferenceServerClient
        from tritonclient.grpc import InferInput as TritonInput
        from tritonclient.grpc import service_pb2 as other_pb
        from tritonclient.grpc import service_pb2_grpc as other_grpc

        x = TritonInput("x", list(X.shape), "FP32")
        x.set_data_from_numpy(X)
        got[flavour] = InferenceServerClient(target).infer("add", [x]).as_numpy("y").tolist()
    else:
        import kserve
        from kserve.protocol.grpc import grpc_predict_v2_pb2 as other_pb
        from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as other_grpc

        async def kserve_infer() -> list[Any]:
            async with kserve.InferenceGRPCClient(target) as client:
                x = kserve.InferInput("x", list(X.shape), "FP32")
                x.set_data_from_numpy(X)
                response = await client.infer(kserve.InferRequest("add", [x]))
                values: list[Any] = response.outputs[0].as_numpy().tolist()
                return values

        got[flavour] = asyncio.run(kserve_infer())

    def raw_request(request_id: str) -> Any:
        """The third party's own message, typed contents (as KServe's docs show a raw request)."""
        raw = other_pb.ModelInferRequest(model_name="add", id=request_id)
        raw.inputs.add(name="x", datatype="FP32", shape=list(X.shape)).contents.fp32_contents.extend(X.reshape(-1))
        return raw

    with grpc.insecure_channel(target) as channel:
        reply = other_grpc.GRPCInferenceServiceStub(channel).ModelInfer(raw_request("stub"))
    assert type(reply) is other_pb.ModelInferResponse, type(reply)
    got[f"{flavour}'s reply decoded by ovserve"] = InferResponse.from_grpc(reply).outputs[0].as_numpy().tolist()

    async def ovserve_infer() -> None:
        x = InferInput("x", list(X.shape), "FP32")
        x.set_data_from_numpy(X)
        async with InferenceGRPCClient(target) as client:
            got["ovserve"] = (await client.infer(InferRequest("add", [x]))).outputs[0].as_numpy().tolist()
            answer = await client.infer(raw_request("raw"))
            assert answer.id == "raw", answer.id
            got[f"ovserve with {flavour}'s ModelInferRequest"] = answer.outputs[0].as_numpy().tolist()

    asyncio.run(ovserve_infer())
    return got


def torchserve(inference: str, management: str) -> dict[str, Any]:
    """A TorchServe user's generated stubs, then ovserve's TorchServe client, with the user's own request."""
    import grpc
    from google.protobuf import empty_pb2

    from ovserve.client import TorchServeGRPCClient

    from .ts_stubs import ts_stubs

    ts = ts_stubs()
    body = json.dumps({"inputs": [{"name": "x", "shape": list(X.shape), "datatype": "FP32",
                                   "data": X.reshape(-1).tolist()}]}).encode()

    def y(answer: bytes) -> Any:
        return np.asarray(json.loads(answer)["outputs"][0]["data"], np.float32).reshape(X.shape).tolist()

    got: dict[str, Any] = {}
    with grpc.insecure_channel(inference) as i_channel, grpc.insecure_channel(management) as m_channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(i_channel)
        models = ts.management_pb2_grpc.ManagementAPIsServiceStub(m_channel).ListModels(
            ts.management_pb2.ListModelsRequest(limit=10))
        got["user's stubs"] = {
            "ping": json.loads(stub.Ping(empty_pb2.Empty()).health),
            "y": y(stub.Predictions(ts.inference_pb2.PredictionsRequest(model_name="add", input={"data": body}))
                   .prediction),
            "models": [m["modelName"] for m in json.loads(models.msg)["models"]],
        }

    async def ovserve_calls() -> None:
        async with TorchServeGRPCClient(inference, management) as client:
            got["ovserve"] = {"ping": await client.ping(), "y": y(await client.predictions("add", {"data": body})),
                              "models": [m["modelName"] for m in (await client.list_models())["models"]]}
            users = ts.inference_pb2.PredictionsRequest(model_name="add", input={"data": body}, sequence_id="u-1")
            answers = [item async for item in client.stream_predictions2([users])]
            assert [seq for seq, _ in answers] == ["u-1"], answers
            got["ovserve with the user's PredictionsRequest"] = {"y": y(answers[0][1])}

    asyncio.run(ovserve_calls())
    return got


def one_process(flavour: str, v2_target: str, ts_inference: str, ts_management: str) -> dict[str, Any]:
    import_all(flavour)
    got = {"v2": third_party_v2(flavour, v2_target), "torchserve": torchserve(ts_inference, ts_management)}
    from google.protobuf import descriptor_pool

    from ovserve.client import proto

    assert proto.v2.ModelInferRequest.DESCRIPTOR.file.pool is proto.POOL is not descriptor_pool.Default()
    got["modules"] = {
        "ovserve's stubs": sorted(m for m in sys.modules if m.startswith("ovserve.common.proto") and "_pb2" in m),
        "client": "ovserve.client.kserve_grpc" in sys.modules and "ovserve.client.torchserve" in sys.modules,
        "third party": ("kserve" if flavour == "kserve" else "tritonclient.grpc.service_pb2") in sys.modules,
        "user's stubs": "inference_pb2" in sys.modules and "management_pb2" in sys.modules,
    }
    return got


if __name__ == "__main__":
    name = sys.argv[1]
    print(json.dumps(one_process(name, *sys.argv[2:5])))
    print(f"{name}: ok")
