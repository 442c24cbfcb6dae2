"""The log lines that announce bound ports, and the one parser for them.

Every ovserve process (``serve``, ``transformer``, ``explainer``) logs one line per
listener once its socket is bound (port 0 picks a free one), then one line with
the whole map::

    rest listening on 127.0.0.1:8080 (KServe V1/V2 REST)
    grpc listening on 127.0.0.1:8081 (KServe V2 gRPC)
    listening: rest=8080 grpc=8081

Whatever starts a server and needs its ports (the tests, the benchmark,
``ovserve run``, all through :mod:`.child`) reads them back with
:class:`BoundPorts`, which knows them all once the map line has come. This
module imports nothing heavy, so a client process can use it without the
server's stubs.
"""
from __future__ import annotations

import re
import threading

#: listener names: the keys of the map (the operator names its container ports after them too)
REST = "rest"
GRPC = "grpc"

LISTENING = "%s listening on %s:%d (%s)"  # logging format: name, host, port, description
BOUND = "listening: %s"  # logging format: "name=port name=port ..."

_LINE = re.compile(r"\b([a-z][a-z0-9-]*) listening on \S+:(\d+)")
_MAP = re.compile(r"\blistening: ((?:[a-z][a-z0-9-]*=\d+ ?)+)$")


def bound_line(ports: dict[str, int]) -> str:
    """The map line's argument: ``rest=8080 grpc=8081``."""
    return " ".join(f"{name}={port}" for name, port in ports.items())


class BoundPorts:
    """A server's ports by listener name, filled in from its log lines."""

    def __init__(self, rest: int = 0, grpc: int = 0, **others: int) -> None:
        self.ports: dict[str, int] = {k: v for k, v in {REST: rest, GRPC: grpc, **others}.items() if v}
        self.known = threading.Event()
        if rest and grpc:  # given by the caller (the server was told which ports to use)
            self.known.set()

    def __getitem__(self, name: str) -> int:
        return self.ports[name]

    def get(self, name: str) -> int:
        """The port of listener ``name``; 0 while it is not known (or the server has no such listener)."""
        return self.ports.get(name, 0)

    @property
    def rest(self) -> int:
        return self.get(REST)

    @property
    def grpc(self) -> int:
        return self.get(GRPC)

    def feed(self, line: str) -> None:
        """Take one log line; ``known`` is set once the map line has been seen."""
        if self.known.is_set():
            return
        m = _MAP.search(line.rstrip())
        if m is not None:
            for item in m.group(1).split():
                name, _, port = item.partition("=")
                self.ports[name] = int(port)
            self.known.set()
            return
        m = _LINE.search(line)
        if m is not None:
            self.ports[m.group(1)] = int(m.group(2))
