"""``org.pytorch.serve.grpc.inference.InferenceAPIsService``: Ping, Predictions and the two streams.

Errors take their status from the one error table (a model that does not exist is
NOT_FOUND, where TorchServe answers INTERNAL; a failing handler is INTERNAL with its
message, where TorchServe answers UNAVAILABLE, which clients retry). StreamPredictions2
answers each request on the stream, ``sequence_id`` echoed, a failure in-band in
``status`` with the stream kept open (a refusal under load with a ``google.rpc.RetryInfo``
detail), and every pending answer delivered after the client half-closes.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2

from ovserve.common.proto.torchserve import inference_pb2 as pb
from ovserve.common.proto.torchserve import inference_pb2_grpc as pb_grpc

from ...dataplane import DataPlane, TorchServe
from ...errors import Overloaded, ServerError
from ...gate import OPEN, Access
from ...metrics import calls
from ..grpc.calls import Metadata, Observed, Servicer, bidi, enter, in_band, status_of, streaming, unary
from ..grpc.listener import Service

if TYPE_CHECKING:  # loaded only when metrics are on
    from ...metrics.registry import Metrics

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["InferenceAPIsService"].full_name
_DONE = object()


class InferenceServicer(Servicer, pb_grpc.InferenceAPIsServiceServicer):
    service_name = SERVICE_NAME
    access: ClassVar[Mapping[str, Access]] = {"Ping": OPEN}  # kubelet probes carry no token
    # in the metrics, api "TorchServe" (each message of StreamPredictions2 counts once)
    observed: ClassVar[Mapping[str, Observed]] = {"Predictions": Observed(calls.TS_PREDICTIONS),
                                                  "StreamPredictions": Observed(calls.TS_STREAM)}

    def __init__(self, dataplane: DataPlane, handlers: TorchServe) -> None:
        super().__init__()
        self.dp = dataplane
        self.handlers = handlers
        self.metrics = dataplane.metrics

    @unary
    async def Ping(self, request: Any, context: Any) -> pb.TorchServeHealthResponse:
        healthy = self.dp.server_ready() and self.handlers.healthy()
        return pb.TorchServeHealthResponse(health=json.dumps({"status": "Healthy" if healthy else "Unhealthy"},
                                                             indent=2))

    @unary
    async def Predictions(self, request: pb.PredictionsRequest, context: Any) -> pb.PredictionResponse:
        body = await self.handlers.predict(request.model_name, request.model_version, request.input,
                                           Metadata(context), request.sequence_id)
        return pb.PredictionResponse(prediction=body)

    @streaming
    async def StreamPredictions(self, request: pb.PredictionsRequest,
                                context: Any) -> AsyncIterator[pb.PredictionResponse]:
        """Every intermediate message in order, then the handler's answer, then OK."""
        async with contextlib.aclosing(_answers(self.handlers, request, context, request.sequence_id)) as answers:
            async for chunk in answers:
                yield pb.PredictionResponse(prediction=chunk)

    @bidi
    async def StreamPredictions2(self, requests: AsyncIterator[pb.PredictionsRequest],
                                 context: Any) -> AsyncIterator[pb.PredictionResponse]:
        """One answer per request, in order (a sequence's state sees its requests in the order sent)."""
        await enter(self.in_flight, context)
        try:
            async for msg in requests:
                seq = msg.sequence_id if msg.HasField("sequence_id") else None
                counted = None if self.metrics is None else _counted(self.metrics, msg, time.perf_counter())
                try:
                    answering = _answers(self.handlers, msg, context, seq or "", counted)
                    async with contextlib.aclosing(answering) as answers:
                        async for chunk in answers:
                            yield pb.PredictionResponse(prediction=chunk, sequence_id=seq)
                except Exception as exc:
                    yield pb.PredictionResponse(sequence_id=seq, status=_status(exc))
        finally:
            self.in_flight.leave()


async def _answers(handlers: TorchServe, msg: pb.PredictionsRequest, context: Any, sequence_id: str,
                   on_done: Callable[[asyncio.Future[bytes]], None] | None = None) -> AsyncGenerator[bytes, None]:
    """One request's messages from its handler: each intermediate one as it comes, then the answer
    (raising what the handler raised); the handler's call is cancelled if the stream ends first."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    call = asyncio.ensure_future(handlers.predict(msg.model_name, msg.model_version, msg.input, Metadata(context),
                                                  sequence_id, queue.put_nowait))
    call.add_done_callback(lambda _: queue.put_nowait(_DONE))
    if on_done is not None:
        call.add_done_callback(on_done)
    try:
        while (chunk := await queue.get()) is not _DONE:
            yield chunk
        yield call.result()
    finally:
        call.cancel()


def _status(exc: Exception) -> status_pb2.Status:
    """A failed message's in-band status; a refusal under load with its retry hint as the rich error model's
    RetryInfo detail (an in-band answer has no trailing metadata for ``grpc-retry-pushback-ms``)."""
    code = (status_of(exc) if isinstance(exc, ServerError) else grpc.StatusCode.INTERNAL).value[0]
    status = status_pb2.Status(code=code, message=in_band(exc, "StreamPredictions2"))
    if isinstance(exc, Overloaded):
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(exc.pushback_ms()))
        status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    return status


def _counted(metrics: Metrics, msg: pb.PredictionsRequest, started: float) -> Any:
    """A done-callback that counts one message of StreamPredictions2 in the metrics."""
    def done(call: asyncio.Future[bytes]) -> None:
        ok = not call.cancelled() and call.exception() is None
        metrics.done(calls.TS_STREAM2, msg.model_name, msg.model_version, ok, started)
    return done


def service(dataplane: DataPlane, handlers: TorchServe) -> Service:
    """TorchServe's inference API over ``handlers`` (Ping asks ``dataplane`` too), for a
    :class:`~..grpc.listener.GrpcListener`."""
    return Service(SERVICE_NAME, InferenceServicer(dataplane, handlers),
                   pb_grpc.add_InferenceAPIsServiceServicer_to_server)
