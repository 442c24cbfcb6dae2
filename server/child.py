"""A server in a child process: the one way the tests, the benchmark and ``ovserve run`` start one.

:func:`spawn` starts any command in its own process group (a terminal's Ctrl-C reaches the
starter alone, which then stops its children in order; a signal to the group reaches whatever
the child started) and, on Linux, with SIGTERM as its parent-death signal, so that no child
outlives a starter killed outright (SIGKILL, an OOM kill). :class:`Child` adds what a server
needs: its log read on a thread (kept, handed on if asked, and fed to
:class:`~.ports.BoundPorts`, so the ports it bound on port 0 are known), waits that end with the
log when the child exits first or takes too long, and a stop that is SIGTERM, then SIGKILL to
the group once the grace period is over.

Standard library only: ``ovserve run`` needs nothing beyond the base install, and a client
process can start a server without the server's dependencies.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TypeVar

from .ports import BoundPorts

HOST = "127.0.0.1"
POLL = 0.05  # seconds between two looks at a condition
#: Checks go straight to 127.0.0.1, never through an HTTP proxy named by the environment.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))

_PR_SET_PDEATHSIG = 1
try:  # looked up here, not in the forked child, where loading a library is unsafe
    _prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
    _prctl = None


def _own_group_dying_with(parent: int, setup: Callable[[], None] | None) -> Callable[[], None]:
    """What the child runs before exec: its own process group, SIGTERM when ``parent`` dies, then ``setup``.

    The kernel sends the parent-death signal when the *thread* that started the child ends,
    so a child started on a short-lived thread dies with that thread: start servers from a
    thread that lives as long as they should.
    """

    def before_exec() -> None:
        os.setpgid(0, 0)
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the parent died before prctl: no signal will come
                os.kill(os.getpid(), signal.SIGTERM)
        if setup is not None:
            setup()

    return before_exec


def spawn(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
          stdout: int | IO[bytes] | None = subprocess.DEVNULL, stderr: int | IO[bytes] | None = subprocess.PIPE,
          setup: Callable[[], None] | None = None) -> subprocess.Popen[str]:
    """Start ``argv`` in its own process group, dying with this process (see the module doc).

    ``env``: its whole environment (None: this process's). ``setup``: more to run in the child
    before exec (e.g. entering a cgroup). Pipes are text, undecodable bytes replaced.

    The child is forked with a preexec_fn, so a starter that makes gRPC calls on other threads must
    set ``GRPC_ENABLE_FORK_SUPPORT=false`` before importing grpc: gRPC's fork handlers otherwise abort
    a child now and then between fork and exec (the tests and the bench do; tests/test_child.py).
    """
    return subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=stderr, text=True, errors="replace",
                            # PR_SET_PDEATHSIG exists only in the child between fork and exec: preexec_fn is
                            # the one place to set it (what it runs: setpgid, prctl, getppid, kill, setup).
                            preexec_fn=_own_group_dying_with(os.getpid(), setup))  # noqa: PLW1509


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 a moment ago, for a program that cannot bind port 0
    and report the port it got (kube-apiserver, etcd, a peer server in the bench, a fixed
    ``--http-port``). Another process may take one before the program binds it: prefer port 0."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class ServerLog:
    """A child's log stream, read on a thread to its end: keeps the lines (without their newline;
    the last ``keep``, or all with None), hands each to ``echo`` if given (it must not raise), and
    feeds them to ``ports``. The pipe is always drained, or the child would block writing."""

    def __init__(self, stream: IO[str], ports: BoundPorts | None = None, keep: int | None = None,
                 echo: Callable[[str], None] | None = None, name: str = "log") -> None:
        self.ports = ports or BoundPorts()
        self.lines: list[str] | deque[str] = [] if keep is None else deque(maxlen=keep)
        self._stream, self._echo = stream, echo
        self._reader = threading.Thread(target=self._read, daemon=True, name=name)
        self._reader.start()

    def _read(self) -> None:
        for raw in self._stream:
            line = raw.rstrip("\n")
            self.lines.append(line)
            self.ports.feed(line)
            if self._echo is not None:
                self._echo(line)

    @property
    def text(self) -> str:
        return "".join(f"{line}\n" for line in list(self.lines))

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the stream's end (the child exited and its last lines are read)."""
        self._reader.join(timeout)


_C = TypeVar("_C", bound="Child")


class ChildExited(RuntimeError):
    """The child exited while it was waited for."""


class Child:
    """A started command with its log (see the module doc); ``stop()`` it, or use it as a context manager.

    ``env``: variables set over this process's environment. ``merge_output``: read stdout and
    stderr as one stream (``ovserve run`` relays both); otherwise stdout is discarded and stderr,
    where ovserve logs, is read. ``ports``: the ports when the caller chose them (a server that
    logs none); by default they are learnt from the log. ``keep``, ``echo``: see :class:`ServerLog`.
    """

    #: what the messages of failed waits call it
    name = "child"

    def __init__(self, argv: Sequence[str], *, name: str | None = None, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, ports: BoundPorts | None = None, keep: int | None = None,
                 echo: Callable[[str], None] | None = None, merge_output: bool = False,
                 setup: Callable[[], None] | None = None) -> None:
        if name is not None:
            self.name = name
        self.argv = list(argv)
        self.proc = spawn(self.argv, env={**os.environ, **(env or {})}, cwd=cwd, setup=setup,
                          stdout=subprocess.PIPE if merge_output else subprocess.DEVNULL,
                          stderr=subprocess.STDOUT if merge_output else subprocess.PIPE)
        stream = self.proc.stdout if merge_output else self.proc.stderr
        assert stream is not None
        self.output = ServerLog(stream, ports, keep, echo, name=f"log-{self.name}")

    # -- what it said ---------------------------------------------------------
    @property
    def ports(self) -> BoundPorts:
        return self.output.ports

    @property
    def lines(self) -> list[str] | deque[str]:
        return self.output.lines

    @property
    def log(self) -> str:
        return self.output.text

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    # -- waits ----------------------------------------------------------------
    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            self.output.join(5)  # its last lines, which usually say why
            raise ChildExited(f"{self.name} exited with {self.proc.returncode}:\n{self.log}")

    def wait_until(self, check: Callable[[], object], what: str, timeout: float) -> object:
        """Poll ``check`` until it returns something true (returned); fail with the log if the child
        exits first (ChildExited) or ``timeout`` s pass (TimeoutError)."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: {what} not within {timeout:g}s:\n{self.log}")
            time.sleep(POLL)

    def wait_ports(self: _C, timeout: float = 60) -> _C:
        """Until every listener is bound (the ``listening:`` map line, or ports the caller gave)."""
        self.wait_until(self.ports.known.is_set, "no bound ports", timeout)
        return self

    def get(self, path: str, timeout: float = 5) -> int:
        """GET ``path`` on the REST port: the status, or 0 when nothing answered."""
        try:
            with _HTTP.open(f"http://{HOST}:{self.ports.rest}{path}", timeout=timeout) as resp:
                status: int = resp.status
                return status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, OSError):
            return 0

    def answers_ok(self, path: str) -> bool:
        """Whether GET ``path`` answers 200."""
        return self.get(path) == 200

    def wait_ok(self: _C, paths: Sequence[str] = ("/v2/health/ready",), timeout: float = 60) -> _C:
        """Until the ports are bound and every GET of ``paths`` answers 200 (the server, or a model, is ready)."""
        deadline = time.monotonic() + timeout
        self.wait_ports(timeout)
        for path in paths:
            self.wait_until(functools.partial(self.answers_ok, path), f"GET {path} not 200",
                            max(0.0, deadline - time.monotonic()))
        return self

    def wait_log(self, pattern: str, timeout: float = 30) -> str:
        """The first line matching the regular expression ``pattern``, once logged."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            for line in list(self.lines):
                if rx.search(line):
                    return line
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no log line matching {pattern!r} in {timeout:g}s:\n{self.log}")
            time.sleep(POLL)

    # -- signals and the end --------------------------------------------------
    def signal(self, sig: int, group: bool = False) -> None:
        """Send ``sig`` to the child, or with ``group`` to its whole process group; no error once it is gone."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                (os.killpg if group else os.kill)(self.proc.pid, sig)

    def wait_exit(self, timeout: float | None = None) -> int:
        """Its exit code once it has exited (subprocess.TimeoutExpired after ``timeout`` s) and its last lines are
        read."""
        code = self.proc.wait(timeout)
        self.output.join(5)
        return code

    def stop(self, grace: float = 30) -> int:
        """SIGTERM, and SIGKILL to its group if it has not exited after ``grace`` s; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL, group=True)
                self.proc.wait(10)
        self.output.join(5)
        return self.proc.returncode

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
