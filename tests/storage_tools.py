"""What the storage initializer's tests share across stores (s3://, gs://, hf://): running it as a user does and
in this process, reading what it wrote, a port nothing listens on, a forwarding proxy, the IR as an archive, and
the check that what it fetched serves.
"""
from __future__ import annotations

import http.client
import http.server
import io
import os
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import requests


def use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """This process's environment as ``env`` says (for initialize() in process), restored after the test."""
    for name in list(os.environ):
        if name not in env:
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run(src: str, dest: Path, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ovserve.server", "storage-initializer", src, str(dest), *flags],
                          env=env, capture_output=True, text=True, timeout=60, check=False)


def assert_fetched_and_served(uri: str, env: dict[str, str], ir: dict[str, bytes], dest: Path,
                              start_server: Any) -> None:
    """``ovserve storage-initializer uri dest`` under ``env`` writes the IR and nothing else (no folder
    marker, no sibling prefix), and a server started on ``dest`` answers x + 1."""
    done = run(uri, dest, env)
    assert done.returncode == 0, done.stderr
    assert tree(dest) == ir
    server = start_server("--model-name", "add-one", "--model-path", str(dest))
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    r = requests.post(f"{server.url}/v2/models/add-one/infer", timeout=10, json={
        "inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": x.ravel().tolist()}]})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == (x + 1).ravel().tolist()


def tar_of(ir: dict[str, bytes]) -> bytes:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for rel, data in ir.items():
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive.getvalue()


class socket_closed:
    """A port of 127.0.0.1 that nothing listens on (bound, never listening, while the test runs)."""

    def __enter__(self) -> int:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *_: object) -> None:
        self.sock.close()


class Proxy(http.server.BaseHTTPRequestHandler):
    """A forwarding HTTP proxy to a store on 127.0.0.1 (``upstream``, its port) that records what it forwarded
    (``seen``) and, when ``corrupt`` is set, flips a byte of the GET bodies ``damages`` picks."""

    upstream: int = 0
    seen: ClassVar[list[str]] = []
    corrupt = False

    def log_message(self, *args: object) -> None:
        pass

    def _forward(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.split("://", 1)[1].split("/", 1)[1] if "://" in self.path else self.path.lstrip("/")
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-connection", "connection")}
        conn.request(self.command, "/" + path, body=body or None, headers=headers)
        reply = conn.getresponse()
        data = reply.read()
        if self.corrupt and self.command == "GET" and self.damages(path) and data:
            data = bytes([data[0] ^ 1]) + data[1:]
        self.send_response(reply.status)
        for k, v in reply.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                self.send_header(k, v)
        # a HEAD's length is the one the upstream announced (its body is never sent)
        self.send_header("Content-Length", reply.getheader("Content-Length") or "0" if self.command == "HEAD"
                         else str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def damages(self, path: str) -> bool:
        """Whether the body of a GET of ``path`` is an object's bytes (one to damage), not a listing."""
        return "list-type" not in path

    do_GET = do_HEAD = do_PUT = do_POST = _forward


def serve_proxy(handler: type[Proxy], upstream: int, **attributes: object) -> Iterator[type[Proxy]]:
    """A fixture's body: a subclass of ``handler`` of its own (fresh ``seen``, not corrupting) forwarding to
    port ``upstream``, served on 127.0.0.1 while the test runs; its ``url`` is the proxy's."""
    proxy = type("P", (handler,), {"upstream": upstream, "seen": [], "corrupt": False, **attributes})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    yield proxy
    server.shutdown()
    server.server_close()
