"""The GRPCInferenceService servicer, and the one place gRPC errors are mapped.

Every RPC is wrapped by :func:`_mapped`: a :class:`ServerError` aborts the call
with its status from :data:`ovserve.server.errors.GRPC_STATUS`; anything else
is logged and becomes INTERNAL with no traceback. Streaming RPCs report
per-message errors in-band (``error_message``) and keep the stream open.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Mapping

import grpc

from ...dataplane import DataPlane
from ...errors import ServerError, Unavailable, grpc_status
from ...proto import grpc_predict_v2_pb2 as pb
from ...proto import grpc_predict_v2_pb2_grpc as pb_grpc
from . import converters

log = logging.getLogger(__name__)

#: Requests of one stream processed at once; replies keep the request order.
STREAM_WINDOW = 32


def status_of(exc: ServerError) -> grpc.StatusCode:
    return grpc.StatusCode[grpc_status(exc)]


class InFlight:
    """The calls being served, and the switch that refuses new ones once shutdown begins.

    grpc.aio drains by itself; the native engine needs it done before it is stopped
    (see :meth:`GrpcServer.stop`).
    """

    def __init__(self) -> None:
        self.count = 0
        self.closing = False
        self.last_done = float("-inf")  # loop time the last call ended
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        if self.closing:
            raise Unavailable("the server is shutting down")
        self.count += 1
        self._idle.clear()

    def leave(self) -> None:
        self.count -= 1
        self.last_done = asyncio.get_running_loop().time()
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the calls in flight to end. True if none is left."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


def _mapped(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            self.in_flight.enter()
        except ServerError as exc:
            await context.abort(status_of(exc), exc.message)
        try:
            return await fn(self, request, context)
        except ServerError as exc:
            await context.abort(status_of(exc), exc.message)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            log.exception("unexpected error in %s", fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
        finally:
            self.in_flight.leave()

    return wrapper


class Metadata(Mapping[str, str]):
    """A call's invocation metadata as the ``headers`` a data plane may read (read on first use:
    the model server never asks)."""

    __slots__ = ("_context", "_items")

    def __init__(self, context: Any) -> None:
        self._context = context
        self._items: dict[str, str] | None = None

    def _dict(self) -> dict[str, str]:
        if self._items is None:
            self._items = {k: v for k, v in (self._context.invocation_metadata() or ()) if isinstance(v, str)}
        return self._items

    def __getitem__(self, key: str) -> str:
        return self._dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane
        self.in_flight = InFlight()

    @_mapped
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.dp.server_live())

    @_mapped
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.dp.server_ready())

    @_mapped
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.dp.model_ready(request.name, request.version))

    @_mapped
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        md = self.dp.server_metadata()
        return pb.ServerMetadataResponse(name=md.name, version=md.version, extensions=md.extensions)

    @_mapped
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        return converters.metadata_to_pb(self.dp.model_metadata(request.name, request.version))

    async def _infer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        req = converters.request_from_pb(request)
        resp = await self.dp.infer(req, Metadata(context))
        return converters.response_to_pb(resp, converters.used_typed_contents(request))

    @_mapped
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        return await self._infer(request, context)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        try:
            self.in_flight.enter()  # the whole stream counts as one call in flight
        except ServerError as exc:
            await context.abort(status_of(exc), exc.message)
        pending: asyncio.Queue[asyncio.Task | None] = asyncio.Queue(STREAM_WINDOW)

        async def one(msg: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
            try:
                return pb.ModelStreamInferResponse(infer_response=await self._infer(msg, context))
            except ServerError as exc:
                return pb.ModelStreamInferResponse(error_message=exc.message)
            except Exception as exc:
                log.exception("unexpected error in ModelStreamInfer")
                return pb.ModelStreamInferResponse(error_message=f"internal error: {type(exc).__name__}")

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

    @_mapped
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        resp = pb.RepositoryIndexResponse()
        for row in self.dp.repository_index(request.ready):
            resp.models.add(name=row.name, version=row.version, state=row.state, reason=row.reason)
        return resp

    @_mapped
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context: Any) -> pb.RepositoryModelLoadResponse:
        await self.dp.load_model(request.model_name)
        return pb.RepositoryModelLoadResponse()

    @_mapped
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest, context: Any) -> pb.RepositoryModelUnloadResponse:
        await self.dp.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()
