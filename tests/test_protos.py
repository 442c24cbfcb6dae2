"""The committed gRPC stubs are exactly what scripts/gen_protos.py produces."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_stubs_are_up_to_date(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the [dev] extra) regenerates the stubs")
    written = _load_generator().generate(tmp_path)
    assert written
    for fresh in written:
        committed = ROOT / "common" / "proto" / fresh.name
        assert committed.read_text() == fresh.read_text(), (
            f"{committed} is stale: run python scripts/gen_protos.py"
        )


def test_field_numbers_follow_the_public_protocol() -> None:
    """Spot-check the wire contract against the numbers in PROTOCOLS.md, from the .proto text."""
    text = (ROOT / "common" / "proto" / "grpc_predict_v2.proto").read_text()
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
