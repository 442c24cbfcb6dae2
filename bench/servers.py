"""Servers under test as child processes, and their CPU and memory as psutil sees them.

:class:`ServerProcess` starts a command, keeps its log, waits until the
models answer ready and stops it (SIGTERM, then SIGKILL); CPU time and RSS
are summed over the process and all its children. :func:`start_ovserve`
runs ``python -m ovserve.server serve`` on ephemeral ports, read back from
its "listening on host:PORT" log lines.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from ovserve.server.ports import BoundPorts, ServerLog

HOST = "127.0.0.1"


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the bench dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU seconds of ``proc`` and all its children."""
    total = 0.0
    for p in _tree(proc):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def rss_bytes(proc: psutil.Process) -> int:
    """Resident memory of ``proc`` and all its children."""
    total = 0
    for p in _tree(proc):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class ServerProcess:
    """A running server: ``rest_port``/``grpc_port`` once known; stop() always."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
                 rest_port: int = 0, grpc_port: int = 0, cwd: Path | None = None, keep: int | None = 400) -> None:
        self.name = name
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
                                     preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self.ps = psutil.Process(self.proc.pid)
        assert self.proc.stderr is not None
        self.output = ServerLog(self.proc.stderr, BoundPorts(rest_port, grpc_port), keep=keep)  # None: every line

    @property
    def rest_port(self) -> int:
        return self.output.ports.rest

    @property
    def grpc_port(self) -> int:
        return self.output.ports.grpc

    @property
    def log(self) -> str:
        return self.output.text

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log}")

    def wait_ready(self, models: list[str], timeout: float = 180) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while not self.output.ports.known.wait(0.1):
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not report its ports:\n{self.log}")
        waiting = list(models)
        while waiting:
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: models {waiting} not ready after {timeout}s:\n{self.log}")
            try:
                url = f"http://{HOST}:{self.rest_port}/v2/models/{waiting[0]}/ready"
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        waiting.pop(0)
                        continue
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        return self

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.ps)

    def rss_bytes(self) -> int:
        return rss_bytes(self.ps)

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.output.join(5)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ovserve_command(config: Path, extra: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "ovserve.server", "serve", "--host", HOST, "--rest-port", "0",
            "--grpc-port", "0", "--config", str(config), "--poll-interval", "0", *(extra or [])]


def start_ovserve(config: Path, extra: list[str] | None = None, name: str = "ovserve",
                  keep: int | None = 400) -> ServerProcess:
    return ServerProcess(name, ovserve_command(config, extra), keep=keep)
