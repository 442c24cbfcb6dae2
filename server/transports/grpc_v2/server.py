"""Build the grpc.aio server: the inference service, health and reflection."""
from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ...dataplane import DataPlane
from ...proto import grpc_predict_v2_pb2 as pb
from ...proto import grpc_predict_v2_pb2_grpc as pb_grpc
from .servicer import InferenceServicer

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


class GrpcServer:
    def __init__(self, dataplane: DataPlane, max_message_bytes: int, interceptors: list | None = None) -> None:
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ]
        self.server = grpc.aio.server(options=options, interceptors=interceptors)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(dataplane), self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.server.add_generic_rpc_handlers((_LazyReflection(
            [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, REFLECTION_SERVICE]),))
        self.port = 0

    def bind(self, host: str, port: int) -> int:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"cannot bind gRPC to {address}")
        return self.port

    async def start(self) -> None:
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()

    async def set_serving(self) -> None:
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
