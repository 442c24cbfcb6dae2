"""TorchServe-style gRPC client stubs, generated at test time from the project's .proto copies.

A TorchServe user generates their client with ``python -m grpc_tools.protoc`` from TorchServe's
``inference.proto`` and ``management.proto`` and imports the result under plain names
(``import inference_pb2, inference_pb2_grpc``: TorchServe's own ``ts_scripts/torchserve_grpc_client.py``
does). :func:`ts_stubs` does the same with the files in common/proto/torchserve, so the tests drive ovserve
through what such a user has, not through ovserve's own generated modules::

    from .ts_stubs import ts_stubs

    ts = ts_stubs()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = ts.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        reply = stub.Predictions(ts.inference_pb2.PredictionsRequest(model_name="m", input={"data": b"..."}))

The stubs are generated once per process (protoc runs in-process, through grpc_tools, with the arguments
a user passes on the command line) and the same namespace is returned after that.

Pitfall, one set of stubs per process: these modules register the protobuf symbols
``org.pytorch.serve.grpc.inference.*`` and ``org.pytorch.serve.grpc.management.*`` in protobuf's default
descriptor pool, exactly as ovserve's own stubs (``ovserve.common.proto.torchserve.*_pb2``) do. A test
process must import only one of the two sets: with both, either protobuf refuses the second ("duplicate
symbol"/"duplicate file name") or, when the two descriptors happen to be byte-identical, the "user's"
classes silently become ovserve's, and the test no longer checks what it claims. So the server under test
runs in its own process (as every server test here does), and :func:`ts_stubs` raises
:class:`MixedStubsError` when ovserve's TorchServe stubs are already imported; once it has run, importing
them raises the same error. ovserve's client (``TorchServeGRPCClient``) imports neither set: its messages
are in a descriptor pool of its own (client/proto.py), so it shares a process with these stubs.
"""
from __future__ import annotations

import atexit
import importlib
import importlib.abc
import importlib.machinery
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
#: the project's copies of TorchServe's .proto files
PROTO_DIR = ROOT / "common" / "proto" / "torchserve"
#: the package of ovserve's own generated TorchServe stubs (the other set)
OVSERVE_PACKAGE = "ovserve.common.proto.torchserve"
#: the plain module names a TorchServe user imports
MODULES = ("inference_pb2", "inference_pb2_grpc", "management_pb2", "management_pb2_grpc")


class MixedStubsError(RuntimeError):
    """ovserve's TorchServe stubs and the test-time ones were both asked for in one process."""


@dataclass(frozen=True)
class TsStubs:
    """The four generated modules, by the names a TorchServe user imports them under."""

    inference_pb2: ModuleType
    inference_pb2_grpc: ModuleType
    management_pb2: ModuleType
    management_pb2_grpc: ModuleType
    #: where they were generated (removed when the process exits)
    directory: Path


_lock = threading.Lock()
_stubs: TsStubs | None = None


def _ovserve_stubs_loaded() -> list[str]:
    return sorted(m for m in sys.modules if m == OVSERVE_PACKAGE or m.startswith(OVSERVE_PACKAGE + "."))


def _mixed_message(what: str) -> str:
    return (f"{what}: a test process must import only one set of TorchServe stubs, ovserve's own "
            f"({OVSERVE_PACKAGE}) or the test-time ones (tests/ts_stubs.py); both register the same "
            "protobuf symbols. Keep ovserve's stubs in the server process, or drive the server with them alone.")


class _RefuseOvserveStubs(importlib.abc.MetaPathFinder):
    """Installed once the test-time stubs are loaded: importing ovserve's set after them fails loudly."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname == OVSERVE_PACKAGE or fullname.startswith(OVSERVE_PACKAGE + "."):
            raise MixedStubsError(_mixed_message(f"importing {fullname} after tests/ts_stubs.py generated its stubs"))
        return None


def _include_dirs() -> list[str]:
    """google/protobuf/*.proto from grpcio-tools; google/rpc/status.proto from googleapis-common-protos."""
    import grpc_tools
    from google.rpc import status_pb2

    return [str(Path(grpc_tools.__file__).parent / "_proto"), str(Path(status_pb2.__file__).resolve().parents[2])]


def _generate(out: Path) -> None:
    from grpc_tools import protoc

    protos = [str(PROTO_DIR / "inference.proto"), str(PROTO_DIR / "management.proto")]
    # What a user types: python -m grpc_tools.protoc -I<dir> -I<includes> --python_out=. --grpc_python_out=. *.proto
    args = ["grpc_tools.protoc", f"-I{PROTO_DIR}", *(f"-I{d}" for d in _include_dirs()),
            f"--python_out={out}", f"--grpc_python_out={out}", *protos]
    if protoc.main(args) != 0:
        raise RuntimeError(f"grpc_tools.protoc failed: {' '.join(args)}")


def ts_stubs() -> TsStubs:
    """The TorchServe client stubs (generated and imported on the first call; the same ones after).

    Raises :class:`MixedStubsError` if ovserve's own TorchServe stubs are imported in this process.
    """
    global _stubs
    with _lock:
        if _stubs is not None:
            return _stubs
        loaded = _ovserve_stubs_loaded()
        if loaded:
            raise MixedStubsError(_mixed_message(f"{', '.join(loaded)} already imported"))
        taken = [m for m in MODULES if m in sys.modules]
        if taken:
            raise MixedStubsError(f"modules named {taken} are already imported: they are not tests/ts_stubs.py's")
        out = Path(tempfile.mkdtemp(prefix="ts-stubs-"))
        atexit.register(shutil.rmtree, out, ignore_errors=True)
        _generate(out)
        # The generated service modules import their message modules by plain name, as a user's do.
        sys.path.insert(0, str(out))
        try:
            modules = {name: importlib.import_module(name) for name in MODULES}
        finally:
            sys.path.remove(str(out))
        sys.meta_path.insert(0, _RefuseOvserveStubs())
        _stubs = TsStubs(**modules, directory=out)
        return _stubs
