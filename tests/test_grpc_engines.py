"""Every gRPC engine serves the same protocol: ``auto`` (the default: ``loop``, gRPC on the event loop over h2),
``grpcio`` (grpc.aio) and the experimental ``native`` (pygrpc-native).

The gRPC protocol tests of the other modules run on the default engine; here they run again, in a
child pytest per engine, with ``OVSERVE_GRPC_ENGINE=grpcio`` (or ``native``) in the environment every
server they start inherits. The tests here check that the variable really switches the engine, what ``auto`` picks
and says, and what a user sees when the package is missing. tests/test_grpc_stress.py holds the
evidence under load (SIGTERM, cancellations, connections, streams, limits) for both engines.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tgrpc

from .clients import grpc_infer
from .inflight import Uploads
from .models import SLOW_K, put_version, slow, slow_expected
from .servers import EXACT, ServerProcess

#: the tests that need the experimental native engine installed (scripts/test.sh installs its extra)
NEEDS_NATIVE = pytest.mark.skipif(importlib.util.find_spec("pygrpc_native") is None,
                                  reason="pygrpc-native (the grpc-native extra) is not installed")

ROOT = Path(__file__).resolve().parent.parent
#: Modules whose gRPC tests (and the SIGTERM drain test) are rerun on the other engines.
#: the protocol's conformance, rerun on each experimental engine. Not test_lifecycle's SIGTERM tests (half of the
#: rerun's time): the engines' drain is pinned by test_grpc_stress (loop: SIGTERM under load, every accepted call
#: answered whole) and by test_native_shutdown_finishes_calls_in_flight_and_refuses_new_ones below
GRPC_MODULES = ["test_smoke.py", "test_datatypes.py", "test_bad_input.py", "test_errors.py", "test_images_server.py"]


def test_the_environment_variable_switches_the_engine(demo_repo: Path) -> None:
    """The default (auto) serves gRPC on loop and says so; the variable picks grpcio."""
    other = ServerProcess(["--model-repository", str(demo_repo), "--poll-interval", "0", *EXACT],
                          env={"OVSERVE_GRPC_ENGINE": "grpcio"})
    default = ServerProcess(["--model-repository", str(demo_repo), "--poll-interval", "0", *EXACT])
    try:
        for proc, engine in ((other, "grpcio (grpcio "), (default, "loop (h2 ")):
            proc.wait_ready()
            line = proc.wait_log("gRPC engine: ")
            assert engine in line, line
            assert line.endswith("for grpc (--grpc-engine grpcio)" if proc is other else "for grpc (auto)"), line
            client = tgrpc.InferenceServerClient(proc.grpc_target)
            x = np.arange(32, dtype=np.float32).reshape(2, 16)
            inp = tgrpc.InferInput("x", [2, 16], "FP32")
            inp.set_data_from_numpy(x)
            np.testing.assert_array_equal(client.infer("add", [inp]).as_numpy("y"), x + 1)
            client.close()
    finally:
        other.stop()
        default.stop()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("engine", ["grpcio", pytest.param("native", marks=NEEDS_NATIVE)])
def test_grpc_protocol_tests_pass_on_the_other_engines(engine: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "grpc",
         *[str(ROOT / "tests" / m) for m in GRPC_MODULES]],
        cwd=ROOT, capture_output=True, text=True, timeout=540, check=False,
        env={**os.environ, "OVSERVE_GRPC_ENGINE": engine},
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary, summary
    assert int(summary.split(" passed")[0].split()[-1]) >= 150, summary  # the selection did not shrink to nothing


def _without_native(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import pygrpc_native`` fails, as where it is not installed."""
    blocked = tmp_path / "site"
    (blocked / "pygrpc_native").mkdir(parents=True)
    (blocked / "pygrpc_native" / "__init__.py").write_text("raise ImportError('blocked by the test')\n")
    return {"PYTHONPATH": os.pathsep.join([str(blocked), os.environ.get("PYTHONPATH", "")])}


def test_native_engine_without_its_package_says_how_to_install_it(demo_repo: Path, tmp_path: Path) -> None:
    proc = ServerProcess(["--model-repository", str(demo_repo), "--grpc-engine", "native"],
                         env=_without_native(tmp_path))
    try:
        assert proc.proc.wait(60) == 1
    finally:
        proc.stop()
    needs = "cannot start: --grpc-engine native needs the pygrpc-native package: pip install pygrpc-native"
    assert needs in proc.log, proc.log


def test_auto_needs_no_native_package(demo_repo: Path, tmp_path: Path) -> None:
    """The default engine is loop: a server where pygrpc-native is not installed serves gRPC on it."""
    proc = ServerProcess(["--model-repository", str(demo_repo), "--poll-interval", "0", *EXACT],
                         env=_without_native(tmp_path))
    try:
        proc.wait_ready()
        line = proc.wait_log("gRPC engine: ")
        assert "loop (h2 " in line and line.endswith("(auto)"), line
        client = tgrpc.InferenceServerClient(proc.grpc_target)
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        np.testing.assert_array_equal(grpc_infer(client, "add", x), x + 1)
        client.close()
    finally:
        proc.stop()


def test_an_unknown_engine_is_refused_by_the_command_line(demo_repo: Path) -> None:
    proc = ServerProcess(["--model-repository", str(demo_repo), "--grpc-engine", "tonic"])
    try:
        assert proc.proc.wait(60) == 2
    finally:
        proc.stop()
    assert "invalid choice: 'tonic'" in proc.log, proc.log


@NEEDS_NATIVE
def test_native_shutdown_finishes_calls_in_flight_and_refuses_new_ones(tmp_path: Path) -> None:
    """SIGTERM on the native engine: a 4 MB reply still computing arrives whole; a call started
    afterwards on the same (open) connection gets UNAVAILABLE; the server exits 0."""
    import threading

    from tritonclient.utils import InferenceServerException

    put_version(slow(4), tmp_path / "repo" / "s", 1)
    server = ServerProcess(["--model-repository", str(tmp_path / "repo"), "--nireq", "1", "--poll-interval", "0",
                            "--grace-period", "20", "--grpc-engine", "native", *EXACT])
    try:
        server.wait_ready()
        x = np.random.default_rng(9).standard_normal((1024, SLOW_K)).astype(np.float32)  # ~0.6 s, 4 MB reply
        client = tgrpc.InferenceServerClient(server.grpc_target)
        assert client.is_server_live()
        uploads = Uploads(server.grpc_port)
        results: dict[str, object] = {}

        def call(key: str) -> None:
            try:
                results[key] = grpc_infer(client, "s", x)
            except InferenceServerException as exc:
                results[key] = exc

        first = threading.Thread(target=call, args=("first",))
        second = threading.Thread(target=call, args=("second",))  # waits for the one infer request
        first.start()
        second.start()
        uploads.wait(2 * x.nbytes)  # both calls read by the server (tests/inflight.py)
        server.proc.send_signal(signal.SIGTERM)
        server.wait_log("shutting down", timeout=10)
        with pytest.raises(InferenceServerException) as late:
            grpc_infer(client, "s", x[:1])
        assert late.value.status() == "StatusCode.UNAVAILABLE", late.value
        first.join(30)
        second.join(30)
        assert server.proc.wait(30) == 0
        expected = slow_expected(x, 4)
        for key in ("first", "second"):
            got = results.get(key)
            assert isinstance(got, np.ndarray), (key, got, server.log)
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    finally:
        server.stop()


def test_an_unknown_engine_from_the_environment_is_refused_with_the_choices(demo_repo: Path) -> None:
    """The environment bypasses argparse's choices: the server itself names them, and exits 1."""
    proc = ServerProcess(["--model-repository", str(demo_repo)], env={"OVSERVE_GRPC_ENGINE": "tonic"})
    try:
        assert proc.proc.wait(60) == 1
    finally:
        proc.stop()
    assert "cannot start: unknown gRPC engine 'tonic'; choose one of auto, grpcio, native" in proc.log, proc.log


@NEEDS_NATIVE
def test_the_native_engine_runs_as_many_io_threads_as_the_cpus_allow(demo_repo: Path) -> None:
    """One pygrpc-native I/O thread per 4 CPUs the process may use, at least one, at most its default
    two: the server runs that many, says so, and serves on them."""
    from ovserve.server.cpus import cpu_budget
    from ovserve.server.transports.grpc.listener import native_io_threads

    assert [native_io_threads(n) for n in (1, 2, 4, 7, 8, 64)] == [1, 1, 1, 1, 2, 2]
    expected = native_io_threads(cpu_budget().usable)  # the tests' own process sees the same CPUs
    proc = ServerProcess(["--model-repository", str(demo_repo), "--poll-interval", "0", "--grpc-engine", "native",
                          *EXACT])
    try:
        proc.wait_ready()
        line = proc.wait_log("gRPC engine: ")
        assert "native (experimental: pygrpc-native " in line and f"; {expected} I/O thread" in line, line
        tasks = Path(f"/proc/{proc.proc.pid}/task")
        names = [(t / "comm").read_text().strip() for t in tasks.iterdir()]
        assert names.count("grpc-native-io") == expected, names
        client = tgrpc.InferenceServerClient(proc.grpc_target)
        try:
            np.testing.assert_array_equal(grpc_infer(client, "add", np.ones((1, 16), np.float32)),
                                          np.full((1, 16), 2.0))
        finally:
            client.close()
    finally:
        proc.stop()


@NEEDS_NATIVE
@pytest.mark.parametrize(("quota", "threads"), [(None, 2), ("200000 100000", 1), ("800000 100000", 2)])
def test_every_grpc_listener_sizes_its_io_threads_from_the_cgroup_quota(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quota: str | None, threads: int) -> None:
    """A pod of ``limits.cpu: 2`` on a node of 16 CPUs: every gRPC listener (the model server's, the
    transformer's, the explainer's: one class) reads the quota itself, not only the CPUs in sight."""
    from ovserve.server import cpus
    from ovserve.server.transports.grpc.listener import GrpcListener

    root = tmp_path / "cgroup"
    (root / "pod").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "pod" / "cpu.max").write_text(f"{quota or 'max 100000'}\n")
    (tmp_path / "self-cgroup").write_text("0::/pod\n")
    monkeypatch.setattr(cpus, "CGROUP_ROOT", root)
    monkeypatch.setattr(cpus, "PROC_SELF_CGROUP", tmp_path / "self-cgroup")
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert GrpcListener("grpc", "KServe V2 gRPC", [], 1 << 20).io_threads == threads
