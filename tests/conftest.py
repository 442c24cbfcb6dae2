"""Fixtures that run the real server in its own process on ephemeral ports (tests/servers.py), and
the test tiers (tests/tiers.py: every test is in one; ``pytest -m unit`` is the fast loop)."""
from __future__ import annotations

import os

# Before anything imports grpc, which reads it once: no gRPC fork handlers in this process. Every server a
# test starts is forked with a preexec_fn (server/child.py) while this process's gRPC clients may be busy on
# other threads, and gRPC's handlers then aborted the child between fork and exec now and then
# ("Epoll1Poller ... epoll_wait error: Bad file descriptor", exit -6; test_child.py has the reproduction).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from . import models
from .models import PHOTOS
from .servers import EXACT, ServerProcess
from .tiers import pytest_collection_modifyitems, pytest_runtest_makereport, unit_tests_stay_in_process  # noqa: F401

# Property-based tests run on a shared 2-core machine next to live servers: no per-example
# deadline (a slow example is not a failure), and a fixed seed under CI so a run is repeatable.
settings.register_profile("ovserve", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=bool(os.environ.get("CI")), print_blob=True)
settings.load_profile("ovserve")

# Fixtures other modules share, registered once here rather than imported into each test module (which
# pyflakes reads as an unused import shadowed by the test's argument): the control plane, its client and a
# namespace per test (tests/k8s_client.py), and the client tests' transformer, image server and certificates
# (tests/client_fixtures.py). A module that defines a fixture of the same name keeps its own.
pytest_plugins = ["tests.k8s_client", "tests.client_fixtures"]


@pytest.fixture(scope="session")
def photos() -> dict[str, bytes]:
    """``PHOTOS`` as JPEG files (BGR pixels, OpenCV's order), as a user would send them."""
    cv2 = pytest.importorskip("cv2")
    skdata = pytest.importorskip("skimage.data")
    out = {}
    for name in PHOTOS:
        ok, buf = cv2.imencode(".jpg", cv2.cvtColor(getattr(skdata, name)(), cv2.COLOR_RGB2BGR))
        assert ok
        out[name] = buf.tobytes()
    return out


@pytest.fixture
def start_server() -> Iterator:
    """Factory: start_server(args...) -> ServerProcess (stopped at teardown)."""
    started: list[ServerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, ready: bool = True,
              cwd: Path | None = None) -> ServerProcess:
        server = ServerProcess([str(a) for a in args], env=env, cwd=cwd)
        started.append(server)
        return server.wait_ready() if ready else server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with the models most protocol tests use."""
    repo = tmp_path_factory.mktemp("repo")
    models.save(models.add_one(), repo, "add")
    models.save(models.matmul(), repo, "matmul")
    models.save(models.two_in_two_out(), repo, "two")
    models.save(models.fixed_batch(1), repo, "fixed")
    for datatype, element in models.OV_TYPES.items():
        models.save(models.add_one((-1, 4), element), repo, f"dt_{datatype.lower()}")
    return repo


@pytest.fixture(scope="session")
def server(demo_repo: Path) -> Iterator[ServerProcess]:
    """One shared server over demo_repo for read-only protocol tests."""
    proc = ServerProcess(["--model-repository", str(demo_repo), "--poll-interval", "0", *EXACT])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def echo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``echo_<datatype>`` for every V2 datatype: x[-1,4] returned unchanged as ``x``."""
    repo = tmp_path_factory.mktemp("echo_repo")
    for datatype, element in models.OV_TYPES.items():
        models.save(models.identity((-1, 4), element), repo, f"echo_{datatype.lower()}")
    return repo


@pytest.fixture(scope="session")
def echo_server(echo_repo: Path) -> Iterator[ServerProcess]:
    """A shared server over echo_repo: every datatype's full range, untouched by arithmetic."""
    proc = ServerProcess(["--model-repository", str(echo_repo), "--poll-interval", "0", *EXACT])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def ir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A real OpenVINO IR (tests/models.py add_one) as the files of its model folder: {"1/model.xml": ...}."""
    from .s3_store import build_ir

    return build_ir(tmp_path_factory)


@pytest.fixture(scope="session")
def s3(ir: dict[str, bytes]) -> Iterator:
    """moto's S3 server on 127.0.0.1 holding ``ir`` (tests/s3_store.py), once per session: moto's backends
    belong to the process."""
    from .s3_store import start

    yield from start(ir)
