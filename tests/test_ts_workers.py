"""Issue 34: a TorchServe handler runs in worker processes, and nothing it does ends the server.

Each handler below does one of the things that took the whole server down while handlers ran
in its threads: exits at import, exits or segfaults in ``handle``, allocates without bound (under
the server's memory bound), never returns, fails in ``initialize``. The archives are made by
the real ``torch-model-archiver``; the client is TorchServe's own gRPC stubs. After each, the
server answers every other model and the same model's next worker serves.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
from google.protobuf import empty_pb2

from .mar import build_mar, stage_add_model, write_model_config
from .servers import ServerProcess
from .ts_harness import code_of as fails
from .ts_harness import describe as describe_all
from .ts_harness import management_pb2, predict, register, stubs, ts_server

pytestmark = pytest.mark.integration

HANDLERS = {
    "exit_at_import.py": '''
        import sys
        sys.exit(3)

        def handle(data, context):
            return ["never"]
    ''',
    # answers its pid and the model's sum; ends its process as the request says
    "fragile.py": '''
        import ctypes
        import json
        import os
        import time

        import numpy as np

        hoard = []

        def handle(data, context):
            if data is None:
                return None
            out = []
            for item in data:
                what = item["data"]
                if what == b"exit":
                    os._exit(7)
                if what == b"sys.exit":
                    import sys
                    sys.exit(5)
                if what == b"segfault":
                    ctypes.string_at(0)
                if what == b"hang":
                    time.sleep(3600)
                if what == b"hoard":
                    while True:
                        hoard.append(bytearray(16 << 20))
                x = np.arange(16, dtype=np.float32).reshape(1, 16)
                y = context.model.infer({"x": x})["y"]
                out.append(json.dumps({"pid": os.getpid(), "y0": float(y[0, 0])}))
            return out
    ''',
    # a large tensor through context.model (issue 34: shared memory); or a forged place; or calls until killed
    "tensors.py": '''
        import hashlib
        import json
        import os

        import numpy as np

        def in_arena(array):
            """Whether the array's memory is the worker's shared-memory arena (its mapping in /proc/self/maps)."""
            at = array.ctypes.data
            with open("/proc/self/maps") as f:
                for line in f:
                    if "ovserve-ts-arena" in line:
                        lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
                        if lo <= at < hi:
                            return True
            return False

        def digest(array):
            return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()

        def handle(data, context):
            if data is None:
                return None
            out = []
            for item in data:
                ask = json.loads(item["data"])
                if "forge" in ask:  # a hostile worker: names a place of its own choosing, past the socket's checks
                    conn = context.model._conn
                    place = [conn.arena.half if ask["forge"] == "half" else ask["forge"], 64]
                    answer, _ = conn.call({"op": "infer", "outputs": [], "inputs": [
                        {"name": "x", "dtype": "<f4", "shape": [1, 16], "shm": place}]}, [])
                    out.append(json.dumps(answer))
                    continue
                x = np.random.default_rng(ask["seed"]).standard_normal((ask["rows"], 16), dtype=np.float32)
                if ask.get("spin"):
                    while True:
                        context.model.infer({"x": x})
                first = context.model.infer({"x": x})["y"]
                second = context.model.infer({"x": x * 2})["y"]  # the first stays valid past the next call
                out.append(json.dumps({"first": digest(first), "second": digest(second), "pid": os.getpid(),
                                       "in_arena": in_arena(first) and in_arena(second)}))
            return out
    ''',
    "init_fails.py": '''
        class Broken:
            def initialize(self, context):
                raise RuntimeError("cannot start: no licence file")

            def handle(self, data, context):
                return ["never"]
    ''',
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tsw")
    built, xml, bin_ = stage_add_model(root, HANDLERS)
    out = root / "store"
    build_mar(out, "exits", "1.0", xml, [bin_], handler=built / "exit_at_import.py")
    build_mar(out, "fragile", "1.0", xml, [bin_], handler=built / "fragile.py",
              config_file=write_model_config(built / "fragile", min_workers=1, max_workers=1, response_timeout=2))
    build_mar(out, "steady", "1.0", xml, [bin_], handler=built / "fragile.py",
              config_file=write_model_config(built / "steady", min_workers=1, max_workers=1))
    build_mar(out, "broken", "1.0", xml, [bin_], handler=built / "init_fails.py")
    build_mar(out, "tensors", "1.0", xml, [bin_], handler=built / "tensors.py",
              config_file=write_model_config(built / "tensors", min_workers=1, max_workers=1))
    return out


@pytest.fixture(scope="module")
def server(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ts_server(tmp_path_factory, store, "--ts-max-workers", "3", "--ts-worker-memory-mib", "384") as proc:
        yield proc


@pytest.fixture(scope="module")
def both(server: ServerProcess) -> Iterator[tuple[Any, Any]]:
    with stubs(server) as (inference, management):
        for name in ("fragile", "steady", "tensors"):
            register(management, f"{name}.mar")
        yield inference, management


@pytest.fixture(scope="module")
def inference(both: tuple[Any, Any]) -> Any:
    return both[0]


@pytest.fixture(scope="module")
def management(both: tuple[Any, Any]) -> Any:
    return both[1]


def describe(management: Any, name: str) -> dict[str, Any]:
    return describe_all(management, name)[0]


def served_by(inference: Any, model: str = "fragile", deadline: float = 30.0) -> int:
    """The pid of the worker that answers ``model`` (waiting out a replacement's back-off)."""
    end = time.monotonic() + deadline
    while True:
        try:
            doc = json.loads(predict(inference, model, b"ok"))
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAVAILABLE or time.monotonic() > end:
                raise
            time.sleep(0.2)
            continue
        assert doc["y0"] == 1.0  # the model's own answer, through the server's inference path
        return int(doc["pid"])


def everything_else_serves(server: ServerProcess, inference: Any) -> None:
    assert server.alive()
    assert json.loads(inference.Ping(empty_pb2.Empty(), timeout=10).health)["status"] in ("Healthy", "Unhealthy")
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]})
    assert json.loads(predict(inference, "add", body.encode()))["outputs"][0]["data"] == [2.0] * 16
    assert json.loads(predict(inference, "steady", b"ok"))["y0"] == 1.0


def gone(pid: int, within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    return True  # exited, not yet reaped
        except (FileNotFoundError, ProcessLookupError):  # gone; ESRCH when it went during the read
            return True
        time.sleep(0.05)
    return False


def test_handler_workers_are_processes_of_their_own(server: ServerProcess, inference: Any,
                                                    management: Any) -> None:
    pid = served_by(inference)
    assert pid != server.pid
    doc = describe(management, "fragile")
    assert [w["pid"] for w in doc["workers"]] == [pid]
    assert doc["workers"][0]["memoryUsage"] > 1 << 20  # the worker's own resident memory
    # ovserve's built-in handlers stay on the server's event loop
    assert {w["pid"] for w in describe(management, "add")["workers"]} == {server.pid}


def test_a_handler_that_exits_at_import_fails_its_registration_alone(server: ServerProcess, inference: Any,
                                                                     management: Any) -> None:
    code, details = fails(lambda: register(management, "exits.mar"))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "exited with code 3 while starting" in details, details
    everything_else_serves(server, inference)
    listed = json.loads(management.ListModels(management_pb2.ListModelsRequest(), timeout=10).msg)
    assert "exits" not in [m["modelName"] for m in listed["models"]]


def test_a_handler_that_fails_to_initialize_is_refused_by_its_reason(server: ServerProcess, inference: Any,
                                                                   management: Any) -> None:
    code, details = fails(lambda: register(management, "broken.mar"))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "RuntimeError: cannot start: no licence file" in details, details
    everything_else_serves(server, inference)


@pytest.mark.parametrize(("request_", "how"), [
    (b"exit", "exited with code 7"),
    (b"sys.exit", "exited with code 5"),
    (b"segfault", "was killed by signal 11 (SIGSEGV)"),
])
def test_a_worker_that_dies_answers_its_request_and_is_replaced(server: ServerProcess, inference: Any,
                                                               management: Any, request_: bytes, how: str) -> None:
    before = served_by(inference)
    restarts = describe(management, "fragile")["workerRestarts"]
    code, details = fails(lambda: predict(inference, "fragile", request_))
    assert code is grpc.StatusCode.INTERNAL
    assert how in details and "while handling the request" in details, details
    assert gone(before)
    everything_else_serves(server, inference)
    after = served_by(inference)
    assert after != before
    doc = describe(management, "fragile")
    assert doc["workerRestarts"] == restarts + 1
    assert how in doc["lastWorkerExit"]
    assert [w["pid"] for w in doc["workers"]] == [after]


def test_a_handler_past_the_response_timeout_has_its_worker_killed(server: ServerProcess, inference: Any,
                                                                  management: Any) -> None:
    before = served_by(inference)
    code, details = fails(lambda: predict(inference, "fragile", b"hang"))
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED and "response timeout (2 s)" in details, details
    assert gone(before)  # a process can be stopped, where a thread could not
    everything_else_serves(server, inference)
    assert served_by(inference) != before


def test_a_handler_that_allocates_without_bound_meets_the_memory_bound(server: ServerProcess, inference: Any,
                                                                      management: Any) -> None:
    before = served_by(inference)
    code, details = fails(lambda: predict(inference, "fragile", b"hoard"))
    assert code is grpc.StatusCode.INTERNAL and "MemoryError" in details, details
    everything_else_serves(server, inference)
    assert served_by(inference) == before  # the handler failed, its worker stayed up
    assert describe(management, "fragile")["workers"][0]["memoryUsage"] < 384 << 20


def test_while_no_worker_is_up_requests_are_unavailable_saying_why(server: ServerProcess, inference: Any,
                                                                   management: Any) -> None:
    served_by(inference)
    # the first loss is replaced at once (the request waits for the replacement, and ends it too) ...
    for _ in range(2):
        code, _ = fails(lambda: predict(inference, "fragile", b"exit"))
        assert code is grpc.StatusCode.INTERNAL
    # ... the second in a row after a back-off, while which nothing waits
    code, details = fails(lambda: predict(inference, "fragile", b"ok"))
    assert code is grpc.StatusCode.UNAVAILABLE
    assert "none of its workers is up" in details and "exited with code 7" in details, details
    assert describe(management, "fragile")["workersStarting"] == 1
    served_by(inference)  # and then it serves again
    everything_else_serves(server, inference)


def test_workers_are_bounded_by_the_flag(inference: Any, management: Any) -> None:
    code, details = fails(lambda: management.ScaleWorker(management_pb2.ScaleWorkerRequest(
        model_name="fragile", min_worker=4, max_worker=4, synchronous=True), timeout=30))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "4 workers" in details and "--ts-max-workers" in details, details
    reply = management.ScaleWorker(management_pb2.ScaleWorkerRequest(
        model_name="steady", min_worker=3, max_worker=3, synchronous=True), timeout=60)
    assert "Workers scaled to 3" in reply.msg
    pids = {w["pid"] for w in describe(management, "steady")["workers"]}
    assert len(pids) == 3
    management.ScaleWorker(management_pb2.ScaleWorkerRequest(model_name="steady", min_worker=1, max_worker=1,
                                                             synchronous=True), timeout=60)
    assert len(describe(management, "steady")["workers"]) == 1
    left = pids - {w["pid"] for w in describe(management, "steady")["workers"]}
    assert all(gone(pid) for pid in left)  # scaled-down workers' processes end


def test_unregistering_ends_the_worker_processes(server: ServerProcess, management: Any, inference: Any) -> None:
    register(management, "steady.mar", model_name="temp")
    management.ScaleWorker(management_pb2.ScaleWorkerRequest(model_name="temp", min_worker=2, max_worker=2,
                                                             synchronous=True), timeout=60)
    pids = [w["pid"] for w in describe(management, "temp")["workers"]]
    assert len(pids) == 2 and server.pid not in pids
    management.UnregisterModel(management_pb2.UnregisterModelRequest(model_name="temp"), timeout=30)
    assert all(gone(pid) for pid in pids)
    assert os.path.exists(f"/proc/{server.pid}")


def test_a_registered_model_loads_with_the_servers_model_flags(store: Path,
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    """--nireq (like --plugin-config, --target-device and dynamic batching) is every model's default: a
    registered model's too, where it used to load untuned whatever the flags said."""
    flags = ["--nireq", "3", "--metrics-enable", "--metrics-list", "ovms_infer_req_queue_size"]
    with ts_server(tmp_path_factory, store, *flags) as proc, stubs(proc) as (_, management):
        register(management, "steady.mar")
        text = requests.get(f"{proc.url}/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith("ovms_infer_req_queue_size{") and "steady" in x)
    assert line.endswith(" 3"), line


# -- context.model's large tensors: the shared-memory arena -----------------------------------------------
ROWS = 1 << 16  # [65536, 16] FP32: 4 MiB each way, well past the arena's threshold


def _tensors(inference: Any, **ask: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(predict(inference, "tensors", json.dumps(ask).encode()))
    return doc


def _reference(server: ServerProcess, x: np.ndarray) -> str:
    """The same inference without any worker: KServe V2 gRPC on the repository's ``add`` model."""
    client = tgrpc.InferenceServerClient(server.grpc_target)
    try:
        tensor = tgrpc.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        y = client.infer("add", [tensor], client_timeout=60).as_numpy("y")
    finally:
        client.close()
    return hashlib.sha256(np.ascontiguousarray(y).tobytes()).hexdigest()


def _arenas(pid: int) -> set[str]:
    """The arenas process ``pid`` maps or holds open (their memfd names)."""
    names = set()
    with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as f:
        names |= {line.split("memfd:")[1].split()[0] for line in f if "memfd:ovserve-ts-arena" in line}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if "memfd:ovserve-ts-arena" in link:
                names.add(link.split("memfd:")[1].split()[0])
    return names


def test_a_large_tensor_crosses_in_shared_memory_and_answers_as_without_the_worker(
        server: ServerProcess, inference: Any) -> None:
    doc = _tensors(inference, seed=34, rows=ROWS)
    x = np.random.default_rng(34).standard_normal((ROWS, 16), dtype=np.float32)
    assert doc["first"] == _reference(server, x)
    assert doc["second"] == _reference(server, x * 2)
    assert doc["in_arena"]  # the outputs the handler got are the arena's pages, not a copy off the socket
    assert _arenas(doc["pid"]) and _arenas(doc["pid"]) <= _arenas(server.pid)


@pytest.mark.parametrize("forge", ["half", 1 << 40])
def test_a_worker_naming_a_place_outside_its_arena_is_refused_and_replaced(
        server: ServerProcess, inference: Any, management: Any, forge: Any) -> None:
    before = _tensors(inference, seed=1, rows=ROWS)["pid"]
    code, details = fails(lambda: _tensors(inference, forge=forge))
    assert code is grpc.StatusCode.INTERNAL
    assert "broke the worker protocol" in details and "is not within its arena" in details, details
    assert gone(before)
    everything_else_serves(server, inference)
    doc = _tensors(inference, seed=2, rows=ROWS)
    assert doc["pid"] != before and doc["in_arena"]


def test_a_worker_killed_mid_call_frees_its_arena(server: ServerProcess, inference: Any, management: Any) -> None:
    shm_before = set(os.listdir("/dev/shm"))
    pid = _tensors(inference, seed=3, rows=ROWS)["pid"]
    arena = _arenas(pid)
    assert len(arena) == 1 and arena <= _arenas(server.pid)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(fails, lambda: _tensors(inference, seed=4, rows=ROWS, spin=True))
        time.sleep(0.5)  # the handler is calling context.model again and again
        os.kill(pid, signal.SIGKILL)
        code, details = call.result(timeout=60)
    assert code is grpc.StatusCode.INTERNAL and "killed by signal 9" in details, details
    end = time.monotonic() + 10
    while arena & _arenas(server.pid) and time.monotonic() < end:
        time.sleep(0.05)
    assert not arena & _arenas(server.pid)  # unmapped and closed: its memory is the kernel's again
    assert set(os.listdir("/dev/shm")) <= shm_before  # and nothing was ever a file there
    doc = _tensors(inference, seed=5, rows=ROWS)
    assert doc["pid"] != pid and doc["in_arena"]
    everything_else_serves(server, inference)
