"""Fixtures that run the real server in its own process on ephemeral ports.

The server under test always runs as ``python -m ovserve.server serve`` in a
child process: that is how users run it, and it keeps its protobuf package
(``inference``) out of the test process, where tritonclient defines its own.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest
import requests
from hypothesis import HealthCheck, settings

from ovserve.server.ports import ServerLog

from . import models

# Property-based tests run on a shared 2-core machine next to live servers: no per-example
# deadline (a slow example is not a failure), and a fixed seed under CI so a run is repeatable.
settings.register_profile("ovserve", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=bool(os.environ.get("CI")), print_blob=True)
settings.load_profile("ovserve")

#: Full FP32 precision, so that expected values computed with numpy match
#: closely (the CPU plugin may otherwise run FP32 models in BF16).
EXACT = ["--plugin-config", '{"INFERENCE_PRECISION_HINT": "f32"}']


class ComponentProcess:
    """A running ``python -m ovserve.server COMMAND ...`` with its bound ports and captured log.

    ``grpc``: whether the process announces a gRPC port too (what ``wait_ports`` waits for).
    """

    kind = "component"
    #: seconds to bind the ports and to become ready
    timeout: float = 60

    def __init__(self, command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
                 grpc: bool = True, preexec_fn: Callable[[], None] | None = None) -> None:
        self.args = [sys.executable, "-m", "ovserve.server", *command]
        self.grpc = grpc
        full_env = {**os.environ, **(env or {})}
        self.proc = subprocess.Popen(self.args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     env=full_env, cwd=cwd, text=True, preexec_fn=preexec_fn)
        assert self.proc.stderr is not None
        self.output = ServerLog(self.proc.stderr)

    @property
    def rest_port(self) -> int:
        return self.output.ports.rest

    @property
    def grpc_port(self) -> int:
        return self.output.ports.grpc

    @property
    def lines(self) -> list[str]:
        return self.output.lines  # type: ignore[return-value]

    @property
    def log(self) -> str:
        return self.output.text

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _bound(self) -> bool:
        return self.output.ports.known.is_set() if self.grpc else bool(self.output.ports.rest)

    def wait_ports(self, timeout: float | None = None):
        deadline = time.monotonic() + (timeout or self.timeout)
        while not self._bound():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}:\n{self.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.kind} did not bind its ports:\n{self.log}")
            time.sleep(0.05)
        return self

    def wait_ready(self, timeout: float | None = None):
        timeout = timeout or self.timeout
        self.wait_ports(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/v2/health/ready", timeout=5).status_code == 200:
                    return self
            except requests.ConnectionError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}:\n{self.log}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.kind} not ready after {timeout}s:\n{self.log}")

    def wait_log(self, pattern: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while time.monotonic() < deadline:
            for line in list(self.output.lines):
                if rx.search(line):
                    return line
            time.sleep(0.05)
        raise TimeoutError(f"no log line matching {pattern!r}:\n{self.log}")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.output.join(5)
        return self.proc.returncode


class ServerProcess(ComponentProcess):
    """A running ``ovserve serve`` on ephemeral ports."""

    kind = "server"

    def __init__(self, args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        super().__init__(["serve", "--host", "127.0.0.1", "--rest-port", "0", "--grpc-port", "0", *args], env, cwd,
                         preexec_fn=preexec_fn)


#: Real photos from scikit-image and what the ImageNet classifier must call them.
PHOTOS = {"chelsea": "Egyptian cat", "coffee": "espresso"}


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

    def start(*args: str, env: dict[str, str] | None = None, ready: bool = True, cwd: Path | None = None) -> ServerProcess:
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
