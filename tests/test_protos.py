"""The committed gRPC stubs are exactly what scripts/gen_protos.py produces, and the .proto copies say what
the public protocols say (KServe V2; TorchServe 0.12's inference and management APIs)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "common" / "proto"


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_stubs_are_up_to_date(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the [dev] extra) regenerates the stubs")
    written = _load_generator().generate(tmp_path)
    fresh = {p.relative_to(tmp_path) for p in written}
    # every .proto has its three stubs, every committed stub has its .proto (no stale leftovers)
    for proto in [*PROTO.glob("*.proto"), *PROTO.glob("torchserve/*.proto")]:
        stem = proto.relative_to(PROTO).with_suffix("")
        assert {Path(f"{stem}_pb2.py"), Path(f"{stem}_pb2.pyi"), Path(f"{stem}_pb2_grpc.py")} <= fresh, proto
    committed = {p.relative_to(PROTO) for p in PROTO.rglob("*_pb2*.py*") if "__pycache__" not in p.parts}
    committed.add(Path("descriptor_set.py"))  # the client's private pool is built from it (client/proto.py)
    assert committed == fresh
    for rel in sorted(fresh):
        assert (PROTO / rel).read_text() == (tmp_path / rel).read_text(), (
            f"common/proto/{rel} is stale: run python scripts/gen_protos.py"
        )


def test_field_numbers_follow_the_public_protocol() -> None:
    """Spot-check the wire contract against the numbers in PROTOCOLS.md, from the .proto text."""
    text = (PROTO / "grpc_predict_v2.proto").read_text()
    for line in [
        "repeated bytes raw_input_contents = 7;",
        "repeated bytes raw_output_contents = 6;",
        "InferTensorContents contents = 5;",
        "string error_message = 1;",
        "ModelInferResponse infer_response = 2;",
        "repeated bytes bytes_contents = 8;",
        "rpc ModelStreamInfer(stream ModelInferRequest) returns (stream ModelStreamInferResponse) {}",
    ]:
        assert line in text


# ---- TorchServe: the copies against TorchServe 0.12's inference.proto and management.proto, compiled ----

TS_INFERENCE = "org.pytorch.serve.grpc.inference"
TS_MANAGEMENT = "org.pytorch.serve.grpc.management"

#: TorchServe 0.12: service -> [(method, request, response, client streams, server streams)]
TS_SERVICES = {
    f"{TS_INFERENCE}.InferenceAPIsService": [
        ("Ping", ".google.protobuf.Empty", f".{TS_INFERENCE}.TorchServeHealthResponse", False, False),
        ("Predictions", f".{TS_INFERENCE}.PredictionsRequest", f".{TS_INFERENCE}.PredictionResponse", False, False),
        ("StreamPredictions", f".{TS_INFERENCE}.PredictionsRequest", f".{TS_INFERENCE}.PredictionResponse",
         False, True),
        ("StreamPredictions2", f".{TS_INFERENCE}.PredictionsRequest", f".{TS_INFERENCE}.PredictionResponse",
         True, True),
    ],
    f"{TS_MANAGEMENT}.ManagementAPIsService": [
        (method, f".{TS_MANAGEMENT}.{method}Request", f".{TS_MANAGEMENT}.ManagementResponse", False, False)
        for method in ("DescribeModel", "ListModels", "RegisterModel", "ScaleWorker", "SetDefault",
                       "UnregisterModel")
    ],
}

#: TorchServe 0.12: message -> {field number: "name type"} ("optional" for proto3 explicit presence)
TS_MESSAGES = {
    f"{TS_INFERENCE}.PredictionsRequest": {
        1: "model_name string", 2: "model_version string", 3: "input map<string,bytes>",
        4: "sequence_id optional string",
    },
    f"{TS_INFERENCE}.PredictionResponse": {
        1: "prediction bytes", 2: "sequence_id optional string", 3: "status optional .google.rpc.Status",
    },
    f"{TS_INFERENCE}.TorchServeHealthResponse": {1: "health string"},
    f"{TS_MANAGEMENT}.ManagementResponse": {1: "msg string"},
    f"{TS_MANAGEMENT}.DescribeModelRequest": {1: "model_name string", 2: "model_version string", 3: "customized bool"},
    f"{TS_MANAGEMENT}.ListModelsRequest": {1: "limit int32", 2: "next_page_token int32"},
    f"{TS_MANAGEMENT}.RegisterModelRequest": {
        1: "batch_size int32", 2: "handler string", 3: "initial_workers int32", 4: "max_batch_delay int32",
        5: "model_name string", 6: "response_timeout int32", 7: "runtime string", 8: "synchronous bool",
        9: "url string", 10: "s3_sse_kms bool", 11: "startup_timeout int32",
    },
    f"{TS_MANAGEMENT}.ScaleWorkerRequest": {
        1: "model_name string", 2: "model_version string", 3: "max_worker int32", 4: "min_worker int32",
        5: "number_gpu int32", 6: "synchronous bool", 7: "timeout int32",
    },
    f"{TS_MANAGEMENT}.SetDefaultRequest": {1: "model_name string", 2: "model_version string"},
    f"{TS_MANAGEMENT}.UnregisterModelRequest": {1: "model_name string", 2: "model_version string"},
}


def _torchserve_descriptors(tmp_path: Path):
    """The two .proto copies compiled to a FileDescriptorSet (parsed apart from protobuf's default pool, so
    this process can still load either set of TorchServe stubs later: tests/ts_stubs.py)."""
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the [dev] extra) compiles the .proto files")
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    out = tmp_path / "ts.desc"
    includes = _load_generator().include_dirs()
    args = ["protoc", f"-I{PROTO / 'torchserve'}", *(f"-I{d}" for d in includes), f"--descriptor_set_out={out}",
            str(PROTO / "torchserve" / "inference.proto"), str(PROTO / "torchserve" / "management.proto")]
    assert protoc.main(args) == 0
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file


def _field(field, nested: dict) -> str:
    from google.protobuf import descriptor_pb2

    fd = descriptor_pb2.FieldDescriptorProto
    names = {v: k.removeprefix("TYPE_").lower() for k, v in fd.Type.items()}
    if field.type == fd.TYPE_MESSAGE and field.type_name.rpartition(".")[2] in nested:
        entry = nested[field.type_name.rpartition(".")[2]]
        assert entry.options.map_entry
        key, value = entry.field
        return f"{field.name} map<{names[key.type]},{names[value.type]}>"
    kind = field.type_name if field.type == fd.TYPE_MESSAGE else names[field.type]
    label = "repeated " if field.label == fd.LABEL_REPEATED else "optional " if field.proto3_optional else ""
    return f"{field.name} {label}{kind}"


def test_torchserve_copies_have_torchserves_services_messages_and_field_numbers(tmp_path: Path) -> None:
    files = {f.name: f for f in _torchserve_descriptors(tmp_path)}
    # registered under TorchServe's file names, as the stubs a TorchServe user generates are
    assert files["inference.proto"].package == TS_INFERENCE
    assert files["management.proto"].package == TS_MANAGEMENT
    assert list(files["inference.proto"].dependency) == ["google/protobuf/empty.proto", "google/rpc/status.proto"]
    assert list(files["management.proto"].dependency) == []

    services, messages = {}, {}
    for name in ("inference.proto", "management.proto"):
        f = files[name]
        for s in f.service:
            services[f"{f.package}.{s.name}"] = [
                (m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming) for m in s.method
            ]
        for m in f.message_type:
            nested = {n.name: n for n in m.nested_type}
            messages[f"{f.package}.{m.name}"] = {fld.number: _field(fld, nested) for fld in m.field}
    assert services == TS_SERVICES
    assert messages == TS_MESSAGES


@pytest.mark.integration
def test_test_time_stubs_and_ovserves_are_one_per_process() -> None:
    """tests/ts_stubs.py generates the user's stubs from the copies, and refuses to share a process with
    ovserve's own stubs either way round (each case in a fresh interpreter: the rule is per process)."""
    cases = {
        "user's stubs": """
            from tests.ts_stubs import ts_stubs
            ts = ts_stubs()
            assert ts_stubs() is ts
            assert ts.inference_pb2.__name__ == "inference_pb2"
            assert ts.inference_pb2_grpc.InferenceAPIsServiceStub and ts.management_pb2_grpc.ManagementAPIsServiceStub
            r = ts.inference_pb2.PredictionsRequest(model_name="m", input={"data": b"x"}, sequence_id="s")
            assert r.HasField("sequence_id") and not ts.inference_pb2.PredictionResponse().HasField("status")
            assert ts.management_pb2.RegisterModelRequest(startup_timeout=5).startup_timeout == 5
        """,
        "ovserve's, then the user's": """
            from ovserve.common.proto.torchserve import inference_pb2
            from tests.ts_stubs import MixedStubsError, ts_stubs
            try:
                ts_stubs()
            except MixedStubsError as e:
                assert "ovserve.common.proto.torchserve.inference_pb2" in str(e), e
            else:
                raise AssertionError("mixed")
        """,
        "the user's, then ovserve's": """
            from tests.ts_stubs import MixedStubsError, ts_stubs
            ts_stubs()
            try:
                from ovserve.common.proto.torchserve import management_pb2
            except MixedStubsError as e:
                assert "one set of TorchServe stubs" in str(e), e
            else:
                raise AssertionError("mixed")
        """,
        "ovserve's alone": """
            from ovserve.common.proto.torchserve import inference_pb2, inference_pb2_grpc, management_pb2_grpc
            assert inference_pb2.DESCRIPTOR.package == "org.pytorch.serve.grpc.inference"
            assert inference_pb2_grpc.inference__pb2 is inference_pb2
            assert management_pb2_grpc.ManagementAPIsServiceServicer
        """,
    }
    for what, code in cases.items():
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, (what, done.stderr)
