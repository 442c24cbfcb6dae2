"""What stands between the public clients' tests and a real server: certificates made by ``openssl``, a
TLS terminator that demands client certificates, a TCP relay that drops its first connections, and a gRPC
gate that answers UNAVAILABLE to its first calls.

ovserve's server speaks plain HTTP and h2c (TLS is the mesh's or the ingress's job), so TLS here is a
real TLS endpoint in front of it, as an ingress would be. Each proxy runs its own event loop on a thread
of the test process, binds 127.0.0.1 port 0, and records what it saw, so a test asserts on the server side
of the wire (attempts, client certificates, metadata) rather than on the client's word. The gate forwards
bytes and needs no protobuf stubs, so it runs in any process.
"""
from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

HOST = "127.0.0.1"
needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed")


# -- certificates ------------------------------------------------------------
@dataclass(frozen=True)
class Certs:
    """A CA, a server certificate it signed (localhost, 127.0.0.1), a client certificate it signed
    (CN ``ovserve-test-client``), and a second CA that signed neither."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_pem: Path  # the client's certificate and key in one file
    other_ca: Path


CLIENT_CN = "ovserve-test-client"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certs(folder: Path) -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    p = {n: folder / n for n in ("ca.pem", "ca.key", "server.pem", "server.key", "server.csr", "client.pem",
                                 "client.key", "client.csr", "client-all.pem", "other-ca.pem", "other-ca.key",
                                 "san.ext")}
    for name in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=ovserve test {name}",
                 "-keyout", str(p[f"{name}.key"]), "-out", str(p[f"{name}.pem"]))
    p["san.ext"].write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, cn, ext in (("server", "localhost", True), ("client", CLIENT_CN, False)):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", str(p[f"{name}.key"]),
                 "-out", str(p[f"{name}.csr"]))
        _openssl("x509", "-req", "-in", str(p[f"{name}.csr"]), "-CA", str(p["ca.pem"]), "-CAkey", str(p["ca.key"]),
                 "-CAcreateserial", "-days", "2", "-out", str(p[f"{name}.pem"]),
                 *(["-extfile", str(p["san.ext"])] if ext else []))
    p["client-all.pem"].write_bytes(p["client.pem"].read_bytes() + p["client.key"].read_bytes())
    return Certs(p["ca.pem"], p["server.pem"], p["server.key"], p["client.pem"], p["client.key"],
                 p["client-all.pem"], p["other-ca.pem"])


# -- a loop on a thread ------------------------------------------------------
class _Threaded:
    """An asyncio loop on a daemon thread; ``start()`` returns once :meth:`_start` bound its port."""

    port = 0

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Any:
        self._thread.start()
        assert self._ready.wait(20), f"{type(self).__name__} did not start"
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as exc:  # reported to start()
            self._error = exc
        finally:
            self._ready.set()
        if self._error is None:
            self.loop.run_forever()

    async def _start(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        pass

    def close(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        writer.close()


class _Relay(_Threaded):
    """A TCP relay to 127.0.0.1:``upstream``; ``accept(reader, writer)`` may refuse a connection (False)."""

    def __init__(self, upstream: int, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__()
        self.upstream = upstream
        self.ssl_context = ssl_context
        self.connections = 0  # accepted at TCP (and TLS) level
        self._server: asyncio.AbstractServer | None = None

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        return True

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if not await self.accept(reader, writer):
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(HOST, self.upstream)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, HOST, 0, ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()


class DroppingRelay(_Relay):
    """Closes its first ``drop`` connections as soon as they are accepted, before reading a byte (a server
    that is not there yet, as a client sees it), then relays."""

    def __init__(self, upstream: int, drop: int) -> None:
        super().__init__(upstream)
        self.drop = drop
        self.dropped = 0

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if self.dropped < self.drop:
            self.dropped += 1
            return False
        return True


class TlsRelay(_Relay):
    """Terminates TLS with ``certs``' server certificate, demanding a client certificate signed by its CA
    (mutual TLS), and relays the plain bytes. ALPN offers h2 (gRPC needs it) and http/1.1.
    ``client_subjects``: the CN of each client certificate it accepted."""

    def __init__(self, certs: Certs, upstream: int) -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs.ca))
        ctx.load_cert_chain(certs.server_cert, certs.server_key)
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        super().__init__(upstream, ctx)
        self.client_subjects: list[str] = []

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        cert = writer.get_extra_info("peercert") or {}
        subject = dict(item for rdn in cert.get("subject", ()) for item in rdn)
        self.client_subjects.append(subject.get("commonName", ""))
        return True


# -- a gRPC gate ---------------------------------------------------------------
@dataclass
class Attempt:
    method: str
    metadata: dict[str, str]
    answered: str  # "UNAVAILABLE" or "forwarded"


class GrpcGate(_Threaded):
    """A gRPC server that answers UNAVAILABLE to its first ``refuse`` unary calls (a server still warming up,
    as KServe's default retry policy expects) and forwards every other call, as bytes, to ``upstream``.
    ``attempts`` lists every call it received, with its metadata."""

    def __init__(self, upstream: str, refuse: int = 0) -> None:
        super().__init__()
        self.upstream = upstream
        self.refuse = refuse
        self.attempts: list[Attempt] = []
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None

    async def _start(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.upstream)
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers([_Forward(self)])
        self.port = self._server.add_insecure_port(f"{HOST}:0")
        await self._server.start()

    async def _stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
        if self._channel is not None:
            await self._channel.close()

    def methods(self) -> list[str]:
        return [a.method.rsplit("/", 1)[-1] for a in self.attempts]

    async def unary(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        if self.refuse > 0:
            self.refuse -= 1
            self.attempts.append(Attempt(method, metadata, "UNAVAILABLE"))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "gate: the server is not ready yet")
        self.attempts.append(Attempt(method, metadata, "forwarded"))
        assert self._channel is not None
        forward = [(k, v) for k, v in metadata.items() if not k.startswith(("grpc-", ":"))]
        try:
            reply: bytes = await self._channel.unary_unary(method)(request, metadata=forward,
                                                                   timeout=context.time_remaining())
            return reply
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
            raise  # not reached: abort raises


class _Forward(grpc.GenericRpcHandler):
    def __init__(self, gate: GrpcGate) -> None:
        self.gate = gate

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method

        async def behaviour(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await self.gate.unary(method, request, context)

        return grpc.unary_unary_rpc_method_handler(behaviour)


__all__ = ["Certs", "CLIENT_CN", "make_certs", "needs_openssl", "DroppingRelay", "TlsRelay", "GrpcGate", "Attempt",
           "HOST"]
