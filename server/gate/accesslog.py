"""The access log: one JSON line per request (``--access-log``), and request ids.

A line holds ``time`` (when the request arrived, UTC, ISO 8601 with
milliseconds), ``listener`` (``rest``, ``grpc``, ``ts-inference``,
``ts-management``), ``method`` (the HTTP method, or the gRPC method's name),
``path`` (REST only), ``model`` and ``version`` (empty when the call names
none), ``status`` (the HTTP status, a number, on REST; the gRPC code's name on
gRPC), ``latency_ms``, ``bytes_in`` and ``bytes_out`` (the bodies on REST, the
serialized messages on gRPC), ``client`` (address and port) and
``request_id``.

Request ids: a client's ``x-request-id`` is kept when it is a sane one
(printable ASCII, at most :data:`MAX_REQUEST_ID` characters), else one is made;
either way it is returned (a REST response header, gRPC trailing metadata),
logged, and set as the request's :data:`ovserve.common.requestids.current`, so that a
transformer or explainer sends it on to its predictor, whose line shows it too.

Lines go to stdout, stderr or a file (appended). They are gathered and written
once per turn of the event loop, so that a burst of requests costs one write,
not one per line.
"""
from __future__ import annotations

import asyncio
import atexit
import itertools
import os
import sys
import time
from typing import Any

import orjson

from ovserve.common import requestids

HEADER = requestids.HEADER
MAX_REQUEST_ID = 128
#: what ``--access-log`` takes besides a file path
STREAMS = {"stdout": 1, "-": 1, "stderr": 2}


#: Made ids: this process's random prefix and a counter, 32 hexadecimal digits. Unique without a
#: system call per request (an id names a request, it guards nothing).
_PREFIX = os.urandom(8).hex()
_COUNTER = itertools.count(1)


def sane(given: str) -> bool:
    """Whether a client's id may be kept, logged and sent on: printable ASCII, not empty, not too long."""
    return 0 < len(given) <= MAX_REQUEST_ID and given.isascii() and given.isprintable()


def request_id(given: str | None) -> str:
    """The client's id when it is a sane one, else a new one (32 hexadecimal digits)."""
    if given and sane(given):
        return given
    return f"{_PREFIX}{next(_COUNTER):016x}"


_second: list[Any] = [None, ""]  # the last whole second formatted, and its text


def now_iso(wall: float) -> str:
    """``wall`` as ``2026-11-24T05:04:43.580Z``; the seconds formatted once per second."""
    second = int(wall)
    if second != _second[0]:
        _second[:] = [second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))]
    return f"{_second[1]}.{int((wall - second) * 1000):03d}Z"


class AccessLog:
    """Where the lines go: ``stdout`` (or ``-``), ``stderr``, or a file path (appended, created if missing)."""

    def __init__(self, destination: str) -> None:
        self.destination = destination
        if destination in STREAMS:
            self._fd = STREAMS[destination]
            self._own = False
        else:
            try:
                self._fd = os.open(destination, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
            except OSError as exc:
                raise ValueError(f"cannot open the access log {destination}: {exc.strerror or exc}") from None
            self._own = True
        self._pending: list[bytes] = []
        atexit.register(self.flush)  # the lines of the last turn of the loop, at shutdown

    def write(self, record: dict[str, Any]) -> None:
        """Queue one line; written at the end of this turn of the event loop (at once without a loop)."""
        self._pending.append(orjson.dumps(record) + b"\n")
        if len(self._pending) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:
                self.flush()

    def flush(self) -> None:
        data, self._pending = b"".join(self._pending), []
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._fd, view):]
            except InterruptedError:
                continue
            except OSError as exc:  # a full disk or a closed pipe must not fail requests
                print(f"ovserve: access log write failed: {exc}", file=sys.stderr)
                return

    def close(self) -> None:
        self.flush()
        if self._own:
            os.close(self._fd)


class Clock:
    """When a request arrived: the wall time for the line, the monotonic time for its latency."""

    __slots__ = ("start", "wall")

    def __init__(self) -> None:
        self.wall = time.time()
        self.start = time.perf_counter()

    def latency_ms(self) -> float:
        return round((time.perf_counter() - self.start) * 1000, 3)
