"""Regenerate the gRPC stubs in common/proto from the .proto sources.

``ovserve.common.proto`` is the one copy of protobuf package ``inference`` (KServe V2): server and client
both import it. ``ovserve.common.proto.torchserve`` holds TorchServe's two APIs (packages
``org.pytorch.serve.grpc.inference`` and ``org.pytorch.serve.grpc.management``); their .proto files are
compiled from their own folder, so they register as ``inference.proto`` and ``management.proto``, the
names a TorchServe user's stubs register too.

Run: python scripts/gen_protos.py [OUT_DIR]  (needs grpcio-tools, part of the [dev] extra, and
googleapis-common-protos, which ships google/rpc/status.proto). With OUT_DIR, the stubs are written there
in the same layout (OUT_DIR/torchserve/...) instead of into common/proto.
tests/test_protos.py checks the committed stubs match what this produces.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent.parent / "common" / "proto"

#: the folders under PROTO_DIR compiled, each a Python package of its own ("" is PROTO_DIR itself)
PACKAGES = ("", "torchserve")


def include_dirs() -> list[str]:
    """Where protoc finds the imported well-known protos: google/protobuf/* from grpcio-tools,
    google/rpc/status.proto from googleapis-common-protos (the package whose status_pb2 the generated
    code imports at run time, so the two cannot disagree)."""
    import grpc_tools  # imported lazily: dev-only dependency
    from google.rpc import status_pb2

    return [
        str(Path(grpc_tools.__file__).parent / "_proto"),
        # status_pb2 lives at <root>/google/rpc/status_pb2.py, beside status.proto
        str(Path(status_pb2.__file__).resolve().parents[2]),
    ]


def generate(out_dir: Path = PROTO_DIR) -> list[Path]:
    """Compile every .proto of :data:`PACKAGES` into ``out_dir`` (same layout); the files written."""
    from grpc_tools import protoc  # imported lazily: dev-only dependency

    includes = [f"-I{d}" for d in include_dirs()]
    written: list[Path] = []
    for package in PACKAGES:
        src = PROTO_DIR / package
        dst = out_dir / package
        dst.mkdir(parents=True, exist_ok=True)
        for proto in sorted(src.glob("*.proto")):
            args = [
                "protoc",
                f"-I{src}",
                *includes,
                f"--python_out={dst}",
                f"--pyi_out={dst}",
                f"--grpc_python_out={dst}",
                str(proto),
            ]
            if protoc.main(args) != 0:
                raise RuntimeError(f"protoc failed on {proto}")
            stem = proto.stem
            grpc_file = dst / f"{stem}_pb2_grpc.py"
            # protoc emits absolute imports of the sibling message module; the stubs live inside a package.
            text = grpc_file.read_text()
            text = re.sub(rf"^import {stem}_pb2 as", f"from . import {stem}_pb2 as", text, flags=re.M)
            grpc_file.write_text(text)
            written += [dst / f"{stem}_pb2.py", dst / f"{stem}_pb2.pyi", grpc_file]
    return written


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_DIR):
        print(path)
