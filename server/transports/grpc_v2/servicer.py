"""The KServe V2 ``inference.GRPCInferenceService`` servicer, over the data plane.

ModelStatistics is Triton's statistics extension. Errors are mapped by the shared decorators of
:mod:`..grpc.calls`; ModelStreamInfer
answers a failed message in-band (``error_message``, as Triton and OVMS do) and
keeps the stream open.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

from ovserve.common.proto import grpc_predict_v2_pb2 as pb
from ovserve.common.proto import grpc_predict_v2_pb2_grpc as pb_grpc

from ...dataplane import DataPlane, repository_of, statistics_of
from ...gate import MANAGEMENT, OPEN, Access
from ...metrics import calls
from ..grpc.calls import Metadata, Observed, Servicer, bidi, enter, in_band, unary
from ..grpc.listener import Service
from . import converters

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
#: Requests of one stream processed at once; replies keep the request order.
STREAM_WINDOW = 32


class InferenceServicer(Servicer, pb_grpc.GRPCInferenceServiceServicer):
    service_name = SERVICE_NAME
    # REST's /v2/health/* twins stay open for probes; the repository extension is management
    access: ClassVar[Mapping[str, Access]] = {"ServerLive": OPEN, "ServerReady": OPEN, "RepositoryIndex": MANAGEMENT,
                                               "RepositoryModelLoad": MANAGEMENT, "RepositoryModelUnload": MANAGEMENT}

    # what OVMS's metrics count: each message of ModelStreamInfer counts as one ModelInfer
    observed: ClassVar[Mapping[str, Observed]] = {
        "ModelInfer": Observed(calls.GRPC_INFER),
        "ModelMetadata": Observed(calls.GRPC_METADATA, "name", "version"),
        "ModelReady": Observed(calls.GRPC_READY, "name", "version"),
    }

    def __init__(self, dataplane: DataPlane) -> None:
        super().__init__()
        self.dp = dataplane
        self.metrics = dataplane.metrics

    @unary
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.dp.server_live())

    @unary
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.dp.server_ready())

    @unary
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.dp.model_ready(request.name, request.version))

    @unary
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        md = self.dp.server_metadata()
        return pb.ServerMetadataResponse(name=md.name, version=md.version, extensions=md.extensions)

    @unary
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        return converters.metadata_to_pb(self.dp.model_metadata(request.name, request.version))

    async def _infer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        req = converters.request_from_pb(request)
        resp = await self.dp.infer(req, Metadata(context))
        return converters.response_to_pb(resp, converters.used_typed_contents(request))

    @unary
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        return await self._infer(request, context)

    @bidi
    async def ModelStreamInfer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        await enter(self.in_flight, context)  # the whole stream counts as one call in flight
        pending: asyncio.Queue[asyncio.Task[pb.ModelStreamInferResponse] | None] = asyncio.Queue(STREAM_WINDOW)

        metrics = self.metrics

        async def one(msg: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
            started = time.perf_counter() if metrics is not None else 0.0
            ok = False
            try:
                reply = pb.ModelStreamInferResponse(infer_response=await self._infer(msg, context))
                ok = True
                return reply
            except Exception as exc:
                return pb.ModelStreamInferResponse(error_message=in_band(exc, "ModelStreamInfer"))
            finally:
                if metrics is not None:
                    metrics.done(calls.GRPC_INFER, msg.model_name, msg.model_version, ok, started)

        async def reader() -> None:
            try:
                async for msg in requests:
                    await pending.put(asyncio.create_task(one(msg)))
            finally:
                await pending.put(None)

        feeder = asyncio.create_task(reader())
        try:
            while (task := await pending.get()) is not None:
                yield await task
            await feeder
        finally:
            feeder.cancel()
            self.in_flight.leave()

    @unary
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              context: Any) -> pb.ModelStatisticsResponse:
        return converters.statistics_to_pb(
            statistics_of(self.dp, request.name).model_statistics(request.name, request.version))

    @unary
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        resp = pb.RepositoryIndexResponse()
        for row in repository_of(self.dp).repository_index(request.ready):
            resp.models.add(name=row.name, version=row.version, state=row.state, reason=row.reason)
        return resp

    @unary
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: Any) -> pb.RepositoryModelLoadResponse:
        await repository_of(self.dp, request.model_name).load_model(request.model_name)
        return pb.RepositoryModelLoadResponse()

    @unary
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: Any) -> pb.RepositoryModelUnloadResponse:
        await repository_of(self.dp, request.model_name).unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()


def service(dataplane: DataPlane) -> Service:
    """KServe V2 gRPC, for a :class:`~..grpc.listener.GrpcListener`."""
    return Service(SERVICE_NAME, InferenceServicer(dataplane), pb_grpc.add_GRPCInferenceServiceServicer_to_server)
