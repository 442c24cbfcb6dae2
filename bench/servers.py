"""Servers under test as child processes, and their CPU and memory as psutil sees them.

:class:`ServerProcess` is the server's own :class:`ovserve.server.child.Child`
(as in the tests and ``ovserve run``: its own process group, dead with the
bench, its log read on a thread; stopped with SIGTERM, then SIGKILL) that also
waits until given models answer ready; CPU time and RSS are summed over the
process and all its children. :func:`start_ovserve` runs ``python -m
ovserve.server serve`` on ephemeral ports, read back from its log.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import psutil

from ovserve.server.child import HOST, Child
from ovserve.server.ports import BoundPorts


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
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


class ServerProcess(Child):
    """A running server (:class:`ovserve.server.child.Child`): ``rest_port``/``grpc_port`` once known,
    its CPU and memory with its children's; stop() always."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
                 rest_port: int = 0, grpc_port: int = 0, cwd: Path | None = None, keep: int | None = 400) -> None:
        super().__init__(cmd, name=name, env=env, cwd=cwd, ports=BoundPorts(rest_port, grpc_port),
                         keep=keep)  # keep None: every line
        self.cmd = cmd
        self.ps = psutil.Process(self.proc.pid)

    @property
    def rest_port(self) -> int:
        return self.ports.rest

    @property
    def grpc_port(self) -> int:
        return self.ports.grpc

    def port_for(self, kind: str) -> int:
        """The port a load generator case of ``kind`` talks to: gRPC's for ``grpc``, REST's otherwise."""
        return self.grpc_port if kind == "grpc" else self.rest_port

    def wait_ready(self, models: list[str], timeout: float = 180) -> ServerProcess:
        """Until its ports are known and every model in ``models`` answers ready."""
        return self.wait_ok([f"/v2/models/{m}/ready" for m in models], timeout)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.ps)

    def rss_bytes(self) -> int:
        return rss_bytes(self.ps)


def ovserve_command(config: Path, extra: list[str] | None = None, *, repository: bool = False) -> list[str]:
    """``ovserve serve`` on ephemeral ports, serving what ``config`` (a config.json) lists, or with
    ``repository`` every model folder of the directory ``config`` with no config.json at all."""
    what = ["--model-repository" if repository else "--config", str(config)]
    return [sys.executable, "-m", "ovserve.server", "serve", "--host", HOST, "--rest-port", "0",
            "--grpc-port", "0", *what, "--poll-interval", "0", *(extra or [])]


def start_ovserve(config: Path, extra: list[str] | None = None, name: str = "ovserve",
                  keep: int | None = 400, *, repository: bool = False) -> ServerProcess:
    return ServerProcess(name, ovserve_command(config, extra, repository=repository), keep=keep)
