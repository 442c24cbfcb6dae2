"""Regenerate the gRPC stubs in common/proto from the .proto sources.

``ovserve.common.proto`` is the one copy of protobuf package ``inference``: server and client both import it.

Run: python scripts/gen_protos.py  (needs grpcio-tools, part of the [dev] extra).
tests/test_protos.py checks the committed stubs match what this produces.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent.parent / "common" / "proto"


def generate(out_dir: Path = PROTO_DIR) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc  # imported lazily: dev-only dependency

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    written: list[Path] = []
    for proto in sorted(PROTO_DIR.glob("*.proto")):
        args = [
            "protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
        stem = proto.stem
        grpc_file = out_dir / f"{stem}_pb2_grpc.py"
        # protoc emits absolute imports; the stubs live inside a package.
        text = grpc_file.read_text()
        text = re.sub(rf"^import {stem}_pb2 as", f"from . import {stem}_pb2 as", text, flags=re.M)
        grpc_file.write_text(text)
        written += [out_dir / f"{stem}_pb2.py", out_dir / f"{stem}_pb2.pyi", grpc_file]
    return written


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_DIR):
        print(path)
