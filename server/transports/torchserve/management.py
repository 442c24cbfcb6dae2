"""``org.pytorch.serve.grpc.management.ManagementAPIsService``: every answer a ``ManagementResponse``.

DescribeModel and ListModels answer TorchServe's JSON documents in ``msg``; the
others its messages. Codes come from the one error table: an existing name and
version is ALREADY_EXISTS, the default version while others exist is
FAILED_PRECONDITION, registration without ``--ts-model-api`` PERMISSION_DENIED.
"""
from __future__ import annotations

import json
from typing import Any

from ovserve.common.proto.torchserve import management_pb2 as pb
from ovserve.common.proto.torchserve import management_pb2_grpc as pb_grpc

from ...dataplane import TorchServe
from ...gate import MANAGEMENT
from ...types import Registration, Scaling
from ..grpc.calls import Servicer, unary
from ..grpc.listener import Service

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ManagementAPIsService"].full_name


def _msg(text: str) -> pb.ManagementResponse:
    return pb.ManagementResponse(msg=text)


class ManagementServicer(Servicer, pb_grpc.ManagementAPIsServiceServicer):
    service_name = SERVICE_NAME
    default_access = MANAGEMENT  # every method: the management tokens, as TorchServe's management key

    def __init__(self, handlers: TorchServe) -> None:
        super().__init__()
        self.handlers = handlers

    @unary
    async def RegisterModel(self, request: pb.RegisterModelRequest, context: Any) -> pb.ManagementResponse:
        return _msg(await self.handlers.register(Registration(
            url=request.url, model_name=request.model_name, handler=request.handler,
            initial_workers=request.initial_workers, batch_size=request.batch_size,
            max_batch_delay_ms=request.max_batch_delay, response_timeout_s=request.response_timeout,
            synchronous=request.synchronous, runtime=request.runtime)))

    @unary
    async def UnregisterModel(self, request: pb.UnregisterModelRequest, context: Any) -> pb.ManagementResponse:
        return _msg(await self.handlers.unregister(request.model_name, request.model_version))

    @unary
    async def ScaleWorker(self, request: pb.ScaleWorkerRequest, context: Any) -> pb.ManagementResponse:
        return _msg(await self.handlers.scale(Scaling(
            request.model_name, request.model_version, request.min_worker, request.max_worker,
            request.synchronous, request.timeout)))

    @unary
    async def ListModels(self, request: pb.ListModelsRequest, context: Any) -> pb.ManagementResponse:
        return _msg(json.dumps(self.handlers.list_models(request.limit, request.next_page_token), indent=2))

    @unary
    async def DescribeModel(self, request: pb.DescribeModelRequest, context: Any) -> pb.ManagementResponse:
        return _msg(json.dumps(await self.handlers.describe(request.model_name, request.model_version,
                                                           request.customized), indent=2))

    @unary
    async def SetDefault(self, request: pb.SetDefaultRequest, context: Any) -> pb.ManagementResponse:
        return _msg(self.handlers.set_default(request.model_name, request.model_version))


def service(handlers: TorchServe) -> Service:
    """TorchServe's management API over ``handlers``, for a :class:`~..grpc.listener.GrpcListener`."""
    return Service(SERVICE_NAME, ManagementServicer(handlers), pb_grpc.add_ManagementAPIsServiceServicer_to_server)
