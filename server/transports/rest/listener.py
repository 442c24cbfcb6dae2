"""The REST listener: the Starlette app on a pre-bound socket, served by uvicorn.

The socket is bound first (so port 0 can be read back and logged), then served
by uvicorn without its own signal handling: the process's Server owns
SIGTERM/SIGINT, so that every listener drains together. With TLS, uvicorn
serves the socket with the :class:`~ovserve.server.tls.ServerTls`'s context,
which hands every new connection the newest certificate (server/tls.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn

from ...config import DEFAULT_MAX_HEADER_BYTES
from ...dataplane import DataPlane
from ...gate import OPEN_GATE, Gate
from ...tls import ServerTls
from .app import create_app
from .closing import ClosesIdlePromptly
from .head_limit import HeadLimitedProtocol


def bind_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening, non-blocking TCP socket on host:port (0: a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _protocol(max_header_bytes: int) -> type[HeadLimitedProtocol]:
    """The HTTP protocol class of one listener (uvicorn instantiates the class it is given): httptools', its
    head capped (head_limit.py), its idle connections closed at once at shutdown (closing.py)."""
    return type("RestProtocol", (ClosesIdlePromptly, HeadLimitedProtocol), {"max_header_bytes": max_header_bytes})


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handling."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class RestListener:
    """KServe V1/V2 REST over ``dataplane``, as one listener of the process's Server."""

    name = "rest"
    description = "KServe V1/V2 REST"

    def __init__(self, dataplane: DataPlane, max_request_bytes: int,
                 max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES, backlog: int = 2048,
                 gate: Gate = OPEN_GATE) -> None:
        self.app = create_app(dataplane, max_request_bytes, gate, self.name)
        self.max_header_bytes = max_header_bytes
        self.backlog = backlog
        self._sock: socket.socket | None = None
        self._server: _Uvicorn | None = None
        self._task: asyncio.Task[None] | None = None
        self._tls: ServerTls | None = None

    def bind(self, host: str, port: int, tls: ServerTls | None = None) -> int:
        self._tls = tls
        self._sock = bind_socket(host, port, self.backlog)
        bound: int = self._sock.getsockname()[1]
        return bound

    async def start(self) -> None:
        """Serve the bound socket in a task; return once uvicorn accepts connections (raise if it stopped)."""
        assert self._sock is not None
        tls = self._tls
        self._server = _Uvicorn(uvicorn.Config(
            self.app, http=_protocol(self.max_header_bytes), ws="none", lifespan="off", access_log=False,
            log_config=None, timeout_keep_alive=75,
            ssl_context_factory=None if tls is None else lambda config, default: tls.ssl_context(),
        ))
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name=f"ovserve-{self.name}")
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("REST server stopped during start-up")
            await asyncio.sleep(0.01)

    async def serving(self) -> None:
        """REST has no health state of its own: /v2/health/ready asks the data plane."""

    def requests_in_flight(self) -> int:
        """Requests being served now (ovserve_requests_in_flight): uvicorn's request tasks."""
        return len(self._server.server_state.tasks) if self._server is not None else 0

    async def stop(self, grace: float) -> None:
        """Stop accepting, let in-flight requests finish within ``grace`` seconds."""
        if self._server is not None:
            self._server.config.timeout_graceful_shutdown = max(int(grace), 1)
            self._server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        elif self._sock is not None:  # bound, never started
            self._sock.close()
