"""Build the gRPC server: the inference service, health and reflection.

Two engines serve the same servicers (see docs/performance.md for the numbers):

- ``grpcio`` (default): ``grpc.aio``, gRPC's own C-core server;
- ``native``: ``pygrpc_native.aio`` (the ``grpc-native`` extra), a drop-in
  ``grpc.aio`` server whose HTTP/2 and per-call work runs in Rust outside the
  GIL. Unary and server-streaming methods are served by it; ModelStreamInfer
  (bidirectional) and reflection go to a grpc.aio server it runs behind itself
  on a Unix socket. It has no TLS, like ovserve's own gRPC port.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ...config import GRPC_ENGINES
from ...dataplane import DataPlane
from ...errors import InvalidInput
from ...proto import grpc_predict_v2_pb2 as pb
from ...proto import grpc_predict_v2_pb2_grpc as pb_grpc
from .servicer import InferenceServicer

log = logging.getLogger("ovserve")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"


class _LazyReflection(grpc.GenericRpcHandler):
    """Server reflection, imported on its first call (grpcurl, Postman) rather than at start:
    most servers are never asked, and the import costs ~1 MiB of resident memory."""

    def __init__(self, services: list[str]) -> None:
        self._services = services
        self._handlers: list = []

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if not str(details.method).startswith(f"/{REFLECTION_SERVICE}/"):
            return None
        if not self._handlers:
            from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

            servicer = reflection.aio.ReflectionServicer(self._services)
            reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, self)  # type: ignore[arg-type]
        for handler in self._handlers:
            found = handler.service(details)
            if found is not None:
                return found
        return None

    # the two calls add_ServerReflectionServicer_to_server makes on the "server" it is given
    def add_generic_rpc_handlers(self, handlers: tuple) -> None:
        self._handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        pass


#: Seconds the native engine's last replies get to be written (from the end of their call)
#: before it closes its connections.
NATIVE_FLUSH_PAUSE = 1.0


def make_server(engine: str, options: list[tuple[str, Any]], interceptors: list | None) -> grpc.aio.Server:
    """A grpc.aio-compatible server of the chosen engine."""
    if engine == "grpcio":
        return grpc.aio.server(options=options, interceptors=interceptors)
    if engine == "native":
        try:
            import pygrpc_native.aio
        except ImportError as exc:
            raise InvalidInput(
                "--grpc-engine native needs the pygrpc-native package: pip install 'ovserve[grpc-native]'"
            ) from exc
        return pygrpc_native.aio.server(options=options, interceptors=interceptors)  # type: ignore[return-value]
    raise InvalidInput(f"unknown gRPC engine {engine!r}; choose one of {', '.join(GRPC_ENGINES)}")


class GrpcServer:
    def __init__(self, dataplane: DataPlane, max_message_bytes: int, interceptors: list | None = None,
                 engine: str = "grpcio") -> None:
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ]
        self.engine = engine
        self.server = make_server(engine, options, interceptors)
        self.servicer = InferenceServicer(dataplane)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.server.add_generic_rpc_handlers((_LazyReflection(
            [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, REFLECTION_SERVICE]),))
        self.port = 0

    def describe(self) -> str:
        from importlib.metadata import version

        package = GRPC_ENGINES[self.engine]
        return f"{self.engine} ({package} {version(package)})"

    def bind(self, host: str, port: int) -> int:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = self.server.add_insecure_port(address)
        except RuntimeError:  # both engines raise it for an address in use (grpcio may also return 0)
            self.port = 0
        if self.port == 0:
            raise OSError(f"cannot bind gRPC to {address}")
        return self.port

    async def start(self) -> None:
        log.info("gRPC engine: %s", self.describe())
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()

    async def set_serving(self) -> None:
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float) -> None:
        native = self.engine == "native"
        if native:
            self.servicer.in_flight.closing = True  # from now on, before anything else awaits
        await self.health.enter_graceful_shutdown()
        if native:
            grace = await self._drain(grace)
        await self.server.stop(grace)

    async def _drain(self, grace: float) -> float:
        """pygrpc-native closes its connections as soon as the handlers have returned, which
        cuts a reply still being written (seen with 4 MB replies): so for it ovserve waits for
        the calls in flight (new ones are refused) and gives the last replies a moment to go
        out. Returns what is left of the grace period."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        in_flight = self.servicer.in_flight
        if await in_flight.wait_idle(grace):
            await asyncio.sleep(max(0.0, min(in_flight.last_done + NATIVE_FLUSH_PAUSE, deadline) - loop.time()))
        return max(0.0, deadline - loop.time())
