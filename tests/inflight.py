"""Whether a server process has read what this process sent it: what a test that needs requests
in flight on the server (a drain on SIGTERM, a version switch) waits for, instead of sleeping.

The kernel knows, on Linux, without any help from the server: for each TCP connection of this
process to the server's port, ``tx_queue`` in /proc/net/tcp is what the server's side has not
acknowledged yet, and for each socket on the server's side of the port (its listener included),
``rx_queue`` is what the server process has not read (for the listener: connections it has not
accepted). ``tcpi_bytes_acked`` (TCP_INFO on our socket) counts what the server's side
acknowledged. So once a request's last byte was handed to the kernel (the client call that sent
it returned: :func:`tests.clients.post`), it is read by the server when both queues are empty. A
client that gives no such signal (a gRPC call runs on grpcio's threads) is waited for by the bytes
acknowledged since a mark on its connection, which lives on: at least the request's payload, the
last part of its message (only HTTP/2 framing may trail it).
"""
from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_TCP_INFO_BYTES_ACKED = 120  # offset of tcpi_bytes_acked (__u64) in struct tcp_info, Linux >= 4.2


@dataclass(frozen=True)
class Connection:
    """One row of /proc/net/tcp or tcp6."""

    local_port: int
    remote_port: int
    tx_queue: int
    rx_queue: int
    inode: int


def connections() -> list[Connection]:
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            tx, rx = (int(n, 16) for n in f[4].split(":"))
            rows.append(Connection(int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16), tx, rx, int(f[9])))
    return rows


def _our_sockets() -> dict[int, int]:
    """inode -> file descriptor of every socket this process holds."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            out[int(target[8:-1])] = int(fd)
    return out


def _bytes_acked(fd: int, inode: int) -> int:
    try:
        dup = os.dup(fd)
    except OSError:
        return 0
    with socket.socket(fileno=dup) as sock:
        if os.fstat(dup).st_ino != inode:  # the descriptor was reused meanwhile
            return 0
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("Q", info, _TCP_INFO_BYTES_ACKED)[0]


class Uploads:
    """What this process sends to a server on ``port`` from now on (this object's creation is the mark)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._mark = self._acked()
        self._seen = dict(self._mark)  # inode -> the most acknowledged, kept once a connection closes

    def _acked(self) -> dict[int, int]:
        ours = _our_sockets()
        return {c.inode: _bytes_acked(ours[c.inode], c.inode)
                for c in connections() if c.remote_port == self.port and c.inode in ours}

    def state(self) -> tuple[int, int, int]:
        """(bytes the server acknowledged since the mark, bytes not acknowledged yet, bytes it has not read)."""
        ours = _our_sockets()
        rows = connections()
        unacked = sum(c.tx_queue for c in rows if c.remote_port == self.port and c.inode in ours)
        unread = sum(c.rx_queue for c in rows if c.local_port == self.port)
        for inode, n in self._acked().items():
            self._seen[inode] = max(n, self._seen.get(inode, 0))
        acked = sum(n - self._mark.get(inode, 0) for inode, n in self._seen.items())
        return acked, unacked, unread

    def read_by_server(self, at_least: int = 0) -> bool:
        acked, unacked, unread = self.state()
        return acked >= at_least and unacked == 0 and unread == 0

    def wait(self, at_least: int = 0, timeout: float = 30, sent: Callable[[], bool] = lambda: True) -> None:
        """Until ``sent()`` (the clients handed their requests to the kernel), the server has acknowledged
        ``at_least`` bytes since the mark and has read everything it was sent on this port."""
        deadline = time.monotonic() + timeout
        while not (sent() and self.read_by_server(at_least)):
            if time.monotonic() > deadline:
                acked, unacked, unread = self.state()
                raise AssertionError(f"port {self.port}: sent={sent()}, {acked} of {at_least} bytes acknowledged, "
                                     f"{unacked} not acknowledged, {unread} not read by the server after {timeout}s")
            time.sleep(0.01)
