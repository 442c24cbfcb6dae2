"""KServe V2 gRPC to a predictor (``grpc-v2``): one grpc.aio channel, and the protobuf <-> neutral types.

Imported only when a client uses ``grpc-v2``, so that a process which never
talks gRPC never loads ovserve's protobuf package (``inference``, the one copy
in :mod:`ovserve.common.proto` that the server's servicer uses too).
"""
from __future__ import annotations

import asyncio
from typing import Any

import grpc
import numpy as np

from ovserve.common.codecs.tensors import check_shape, from_raw, from_values, reply_parameters, to_raw
from ovserve.common.proto import grpc_predict_v2_pb2 as pb
from ovserve.common.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from ovserve.common.proto.fields import CONTENTS_FIELD, params_from_pb, params_to_pb
from ovserve.common.types import InferRequest, InferResponse, ModelMetadata, Tensor, TensorSpec

from .connection import backoff
from .errors import PredictorTimeout, PredictorUnavailable, error_from_grpc

#: Reconnect quickly once the predictor is back (gRPC's default backoff grows to 120 s).
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 30000),
]


def request_to_pb(request: InferRequest, model: str) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name=model, model_version=request.model_version, id=request.id)
    params_to_pb(msg.parameters, request.parameters)
    for t in request.inputs:
        arr = np.asarray(t.data)
        tensor = msg.inputs.add(name=t.name, datatype=t.datatype, shape=list(arr.shape))
        params_to_pb(tensor.parameters, reply_parameters(t.parameters))  # REST's binary directives stay behind
        msg.raw_input_contents.append(to_raw(arr, t.datatype))
    for o in request.outputs:
        out = msg.outputs.add(name=o.name)
        params_to_pb(out.parameters, reply_parameters(o.parameters))
    return msg


def response_from_pb(msg: pb.ModelInferResponse) -> InferResponse:
    raw = msg.raw_output_contents
    outputs = []
    for i, out in enumerate(msg.outputs):
        where = f"predictor output {out.name!r}"
        shape = check_shape(out.shape, where)
        if raw:
            data = from_raw(where, out.datatype, shape, raw[i])
        else:
            data = from_values(where, out.datatype, shape, list(getattr(out.contents, CONTENTS_FIELD[out.datatype])))
        outputs.append(Tensor(out.name, out.datatype, shape, data, params_from_pb(out.parameters)))
    return InferResponse(model_name=msg.model_name, model_version=msg.model_version, outputs=outputs,
                         id=msg.id, parameters=params_from_pb(msg.parameters))


class GrpcPredictor:
    """One predictor over KServe V2 gRPC; retries only while the channel cannot reach it."""

    def __init__(self, target: str, use_ssl: bool, timeout: float, retries: int = 2) -> None:
        self.target = target
        self.timeout = timeout
        self.retries = retries
        if use_ssl:
            self.channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(), options=CHANNEL_OPTIONS)
        else:
            self.channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)

    async def _call(self, method: str, msg: Any, timeout: float | None = None) -> Any:
        rpc = getattr(self.stub, method)
        attempt = 0
        while True:
            try:
                return await rpc(msg, timeout=timeout or self.timeout)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    waited = timeout or self.timeout
                    raise PredictorTimeout(f"no answer from {self.target} within {waited:g}s") from None
                # UNAVAILABLE with a detail from a running predictor (model loading) is its answer;
                # the channel's own "failed to connect" is worth a retry.
                unreachable = code == grpc.StatusCode.UNAVAILABLE and _is_connection_failure(exc)
                if not unreachable:
                    raise error_from_grpc(code.name, exc.details() or code.name) from None
                if attempt >= self.retries:
                    raise PredictorUnavailable(
                        f"unreachable at {self.target} ({exc.details()})") from None
            await asyncio.sleep(backoff(attempt))
            attempt += 1

    async def live(self, timeout: float | None = None) -> bool:
        reply: pb.ServerLiveResponse = await self._call("ServerLive", pb.ServerLiveRequest(), timeout)
        return reply.live

    async def ready(self, model: str, timeout: float | None = None) -> bool:
        reply: pb.ModelReadyResponse = await self._call("ModelReady", pb.ModelReadyRequest(name=model), timeout)
        return reply.ready

    async def metadata(self, model: str, version: str = "") -> ModelMetadata:
        md = await self._call("ModelMetadata", pb.ModelMetadataRequest(name=model, version=version))

        def specs(items: Any) -> list[TensorSpec]:
            return [TensorSpec(t.name, t.datatype, tuple(t.shape)) for t in items]

        return ModelMetadata(md.name, list(md.versions), md.platform, specs(md.inputs), specs(md.outputs))

    async def infer(self, request: InferRequest, model: str) -> InferResponse:
        return response_from_pb(await self._call("ModelInfer", request_to_pb(request, model)))

    async def close(self) -> None:
        await self.channel.close()


def _is_connection_failure(exc: grpc.aio.AioRpcError) -> bool:
    detail = (exc.details() or "").lower()
    debug = (exc.debug_error_string() or "").lower()
    words = ("failed to connect", "connection refused", "connect failed", "socket closed", "connection reset",
             "unavailable", "dns resolution failed", "end of tcp stream", "keepalive")
    return any(w in detail or w in debug for w in words) and "not ready" not in detail and "loading" not in detail
