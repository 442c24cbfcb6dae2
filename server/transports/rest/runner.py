"""Running the REST app: a pre-bound socket and uvicorn without its own signal handling.

Every ovserve process with a REST surface (the server, the transformer, the
explainer) binds its socket first (so port 0 can be read back and logged),
then serves it with uvicorn; the process, not uvicorn, owns SIGTERM/SIGINT so
that REST and gRPC drain together.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any, Iterator

import uvicorn


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


class RestServer(uvicorn.Server):
    """uvicorn serving one app on a pre-bound socket; the process owns the signals."""

    def __init__(self, app: Any, grace_period: float) -> None:
        super().__init__(uvicorn.Config(
            app, http="httptools", ws="none", lifespan="off", access_log=False, log_config=None,
            timeout_graceful_shutdown=max(int(grace_period), 1), timeout_keep_alive=75,
        ))
        self.task: asyncio.Task | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def start_on(self, sock: socket.socket, name: str = "ovserve-rest") -> None:
        """Serve ``sock`` in a task; return once uvicorn accepts connections (raise if it stopped)."""
        self.task = asyncio.create_task(self.serve(sockets=[sock]), name=name)
        while not self.started:
            if self.task.done():
                self.task.result()
                raise RuntimeError("REST server stopped during start-up")
            await asyncio.sleep(0.01)

    async def drain(self) -> None:
        """Stop accepting, let in-flight requests finish (within the grace period)."""
        self.should_exit = True
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)
