"""The log line that announces a bound port, and the one parser for it.

The server logs ``REST (KServe V1/V2) listening on HOST:PORT`` and
``gRPC (KServe V2) listening on HOST:PORT`` once its sockets are bound (port 0
picks a free one). Whatever starts a server and needs its ports (the tests,
the benchmark) reads them back with :class:`BoundPorts`. This module imports
nothing heavy, so a client process can use it without the server's stubs.
"""
from __future__ import annotations

import re
import threading
from collections import deque
from typing import IO

REST = "REST (KServe V1/V2)"
GRPC = "gRPC (KServe V2)"
LISTENING = "%s listening on %s:%d"  # logging format: transport, host, port

_LINE = re.compile(r"(REST|gRPC) \(KServe [^)]*\) listening on \S+:(\d+)")


class BoundPorts:
    """The REST and gRPC ports, filled in from a server's log lines."""

    def __init__(self, rest: int = 0, grpc: int = 0) -> None:
        self.rest, self.grpc = rest, grpc
        self.known = threading.Event()
        if rest and grpc:
            self.known.set()

    def feed(self, line: str) -> None:
        """Take one log line; ``known`` is set once both ports have been seen."""
        m = _LINE.search(line)
        if m is None or self.known.is_set():
            return
        if m.group(1) == "REST":
            self.rest = int(m.group(2))
        else:
            self.grpc = int(m.group(2))
        if self.rest and self.grpc:
            self.known.set()


class ServerLog:
    """A child server's log stream, read on a thread: keeps the lines, learns the ports.

    ``keep`` bounds how many lines are kept (None: all of them).
    """

    def __init__(self, stream: IO[str], ports: BoundPorts | None = None, keep: int | None = None) -> None:
        self.ports = ports or BoundPorts()
        self.lines: list[str] | deque[str] = [] if keep is None else deque(maxlen=keep)
        self._stream = stream
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._stream:
            self.lines.append(line)
            self.ports.feed(line)

    @property
    def text(self) -> str:
        return "".join(list(self.lines))

    def join(self, timeout: float) -> None:
        self._reader.join(timeout)
