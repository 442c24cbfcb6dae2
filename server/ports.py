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
