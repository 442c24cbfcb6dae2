"""KServe V2 gRPC: the protobuf <-> neutral types both clients use, and the predictor's channel (``grpc-v2``).

The converters serve :class:`GrpcPredictor` (the transformer's and explainer's
connection) and :class:`~.kserve_grpc.InferenceGRPCClient` with KServe's types
(:mod:`.infer_type`). The messages are the client's own (:mod:`.proto`: a
descriptor pool apart from protobuf's default one, where the server's stubs,
tritonclient's and kserve's define package ``inference``); the converters read
any stub set's messages, field by field. Imported only when a client uses gRPC,
so that a process which never talks gRPC never loads protobuf.
"""
from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Sequence
from typing import Any

import grpc
import numpy as np

from ovserve.common import outgoing, requestids
from ovserve.common.codecs.datatypes import V2_TO_NUMPY
from ovserve.common.codecs.tensors import (
    MAX_DIMS,
    MAX_ELEMENTS,
    check_shape,
    from_raw,
    from_values,
    reply_parameters,
    to_raw,
)
from ovserve.common.errors import PUSHBACK_METADATA, RETRY_AFTER_METADATA, InvalidInput
from ovserve.common.proto.fields import CONTENTS_FIELD, params_from_pb, params_to_pb, typed_array
from ovserve.common.tokens import TokenFile
from ovserve.common.types import InferRequest, InferResponse, ModelMetadata, RequestedOutput, Tensor, TensorSpec

from .connection import PredictorTls, TlsMaterial, backoff
from .errors import PredictorTimeout, PredictorUnavailable, error_from_grpc
from .proto import is_message, stub
from .proto import v2 as pb

#: the service of KServe V2 gRPC (protobuf package ``inference``)
SERVICE = "inference.GRPCInferenceService"

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


#: One input as it goes on the wire: name, datatype, shape, parameters, raw bytes.
WireInput = tuple[str, str, Sequence[int], dict[str, Any], bytes]


def infer_request_pb(model: str, version: str, request_id: str, parameters: dict[str, Any],
                     inputs: Iterable[WireInput],
                     outputs: Iterable[tuple[str, dict[str, Any]]]) -> pb.ModelInferRequest:
    """A ModelInferRequest with every input in ``raw_input_contents`` (one form the server reads without a
    conversion). Input and output parameters go without REST's binary directives."""
    msg = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    if parameters:  # an empty map is skipped: every call makes this message (bench/client_cost.py)
        params_to_pb(msg.parameters, parameters)
    raws = msg.raw_input_contents
    for name, datatype, shape, params, raw in inputs:
        tensor = msg.inputs.add(name=name, datatype=datatype, shape=shape)
        if params and (len(params) > 1 or "binary_data_size" not in params):  # more than the wire's own
            params_to_pb(tensor.parameters, reply_parameters(params))
        raws.append(raw)
    for name, params in outputs:
        out = msg.outputs.add(name=name)
        if params:
            params_to_pb(out.parameters, reply_parameters(params))
    return msg


def request_to_pb(request: InferRequest, model: str) -> pb.ModelInferRequest:
    inputs = []
    for t in request.inputs:
        arr = np.asarray(t.data)
        inputs.append((t.name, t.datatype, arr.shape, t.parameters, to_raw(arr, t.datatype)))
    return infer_request_pb(model, request.model_version, request.id, request.parameters, inputs,
                            [(o.name, o.parameters) for o in request.outputs])


def _tensors(items: Any, raw: Sequence[bytes], what: str) -> list[Tensor]:
    """InferInputTensor or InferOutputTensor messages, with their raw contents when there are any.

    A raw tensor of a fixed-size datatype whose shape and length fit is decoded inline (a protobuf shape is
    integers already); anything else, and every error, goes through the codecs' checks and messages. The
    client decodes one reply per call, and its CPU per call is measured (bench/client_cost.py)."""
    out = []
    for i, t in enumerate(items):
        shape = tuple(t.shape)
        datatype = t.datatype
        params = params_from_pb(t.parameters) if t.parameters else {}
        buffer = raw[i] if i < len(raw) else None  # once: each read of a repeated bytes field is a copy
        if buffer is not None:
            dtype = V2_TO_NUMPY.get(datatype)
            if dtype is not None and dtype.kind != "O" and len(shape) <= MAX_DIMS and min(shape, default=0) >= 0 \
                    and math.prod(shape) <= MAX_ELEMENTS and len(buffer) == math.prod(shape) * dtype.itemsize:
                out.append(Tensor(t.name, datatype, shape, np.frombuffer(buffer, dtype).reshape(shape), params))
                continue
        where = f"{what} {t.name!r}"
        shape = check_shape(shape, where)
        if raw:
            if buffer is None:
                raise InvalidInput(f"{where}: {len(raw)} raw contents for {len(items)} tensors")
            data = from_raw(where, datatype, shape, buffer)
        else:
            field = CONTENTS_FIELD.get(datatype)
            values: Any = typed_array(t.contents, datatype)  # FP32/FP64/BOOL: their bytes, not a float each
            if values is None:
                values = list(getattr(t.contents, field)) if field else []
            data = from_values(where, datatype, shape, values, typed=True)
        out.append(Tensor(t.name, datatype, shape, data, params))
    return out


def request_from_pb(msg: pb.ModelInferRequest, what: str = "input") -> InferRequest:
    """A ModelInferRequest as neutral types (raw or typed contents)."""
    return InferRequest(model_name=msg.model_name, inputs=_tensors(msg.inputs, msg.raw_input_contents, what),
                        model_version=msg.model_version, id=msg.id, parameters=params_from_pb(msg.parameters),
                        outputs=[RequestedOutput(o.name, params_from_pb(o.parameters)) for o in msg.outputs])


def response_to_pb(response: InferResponse) -> pb.ModelInferResponse:
    """Neutral types as a ModelInferResponse, every output in ``raw_output_contents``."""
    msg = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version,
                                id=response.id)
    params_to_pb(msg.parameters, response.parameters)
    for t in response.outputs:
        arr = np.asarray(t.data)
        out = msg.outputs.add(name=t.name, datatype=t.datatype, shape=list(arr.shape))
        params_to_pb(out.parameters, reply_parameters(t.parameters))
        msg.raw_output_contents.append(to_raw(arr, t.datatype))
    return msg


def response_from_pb(msg: pb.ModelInferResponse, what: str = "predictor output") -> InferResponse:
    """A ModelInferResponse as neutral types (raw or typed contents); ``what`` names an output in errors."""
    return InferResponse(model_name=msg.model_name, model_version=msg.model_version,
                         outputs=_tensors(msg.outputs, msg.raw_output_contents, what),
                         id=msg.id, parameters=params_from_pb(msg.parameters) if msg.parameters else {})


def as_infer_request(message: Any) -> pb.ModelInferRequest | None:
    """``message`` if it is an ``inference.ModelInferRequest`` of any set of stubs (the client's own,
    ovserve's server stubs, tritonclient's, kserve's), sent as it is: the wire format is one, and the
    client's calls serialize a request with its own class; None for anything else."""
    if is_message(message, "inference.ModelInferRequest"):
        request: pb.ModelInferRequest = message
        return request
    return None


def model_metadata_dict(md: pb.ModelMetadataResponse) -> dict[str, Any]:
    """ModelMetadataResponse in V2 REST's JSON form."""

    def specs(items: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

    return {"name": md.name, "versions": list(md.versions), "platform": md.platform,
            "inputs": specs(md.inputs), "outputs": specs(md.outputs)}


def server_metadata_dict(md: pb.ServerMetadataResponse) -> dict[str, Any]:
    """ServerMetadataResponse in V2 REST's JSON form."""
    return {"name": md.name, "version": md.version, "extensions": list(md.extensions)}


class GrpcPredictor:
    """One predictor over KServe V2 gRPC; retries only while the channel cannot reach it."""

    def __init__(self, target: str, use_ssl: bool, timeout: float, retries: int = 2,
                 token: TokenFile | None = None, tls: PredictorTls | None = None) -> None:
        self.target = target
        self.token = token  # sent as a bearer token, the file's current first line each call
        self.timeout = timeout
        self.retries = retries
        self.tls = tls
        self._version = 0  # the TLS material the channel was made with
        self._closing: dict[asyncio.Task[None], grpc.aio.Channel] = {}  # channels of older material
        if tls is not None:
            self.channel = self._secure_channel(tls.current())
        elif use_ssl:
            self.channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(), options=CHANNEL_OPTIONS)
        else:
            self.channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self.stub = stub(self.channel, SERVICE)

    def _secure_channel(self, material: TlsMaterial) -> grpc.aio.Channel:
        self._version = material.version
        credentials = grpc.ssl_channel_credentials(material.ca, material.key, material.cert)
        return grpc.aio.secure_channel(self.target, credentials, options=CHANNEL_OPTIONS)

    def _rotate(self) -> None:
        """A channel's credentials are fixed: once the files have changed, calls go on a new channel, and
        the old one closes when the calls on it have finished (within the call timeout)."""
        assert self.tls is not None
        material = self.tls.current()
        if material.version == self._version:
            return
        old, self.channel = self.channel, self._secure_channel(material)
        self.stub = stub(self.channel, SERVICE)
        task = asyncio.get_running_loop().create_task(old.close(grace=self.timeout))
        self._closing[task] = old
        task.add_done_callback(lambda done: self._closing.pop(done, None))

    async def _call(self, method: str, msg: Any, timeout: float | None = None) -> Any:
        if self.tls is not None:
            self._rotate()
        rpc = getattr(self.stub, method)
        metadata = None if self.token is None else (("authorization", f"Bearer {self.token.first()}"),)
        rid = requestids.current.get()
        if rid is not None:  # the id of the request this call serves goes on with it
            metadata = (*(metadata or ()), (requestids.HEADER, rid))
        if outgoing.injectors:  # e.g. the trace context, with the server's tracing on (ovserve.common.outgoing)
            metadata = (*(metadata or ()), *outgoing.headers().items())
        attempt = 0
        while True:
            try:
                return await rpc(msg, timeout=timeout or self.timeout, metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    waited = timeout or self.timeout
                    raise PredictorTimeout(f"no answer from {self.target} within {waited:g}s") from None
                # UNAVAILABLE with a detail from a running predictor (model loading) is its answer;
                # the channel's own "failed to connect" is worth a retry.
                unreachable = code == grpc.StatusCode.UNAVAILABLE and _is_connection_failure(exc)
                if not unreachable:
                    raise error_from_grpc(code.name, exc.details() or code.name, _pushback(exc)) from None
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
        for task, old in list(self._closing.items()):  # the client is closing: no more grace for old channels
            task.cancel()
            await old.close()
        await self.channel.close()


def _pushback(exc: grpc.aio.AioRpcError) -> str | None:
    """The server's retry hint in milliseconds: ``grpc-retry-pushback-ms`` (gRFC A6), else ovserve's
    ``retry-after-ms`` (all an ovserve predictor on the native engine can send)."""
    hints = {key: value for key, value in exc.trailing_metadata() or ()
             if key in (PUSHBACK_METADATA, RETRY_AFTER_METADATA) and isinstance(value, str)}
    return hints.get(PUSHBACK_METADATA, hints.get(RETRY_AFTER_METADATA))


def _is_connection_failure(exc: grpc.aio.AioRpcError) -> bool:
    detail = (exc.details() or "").lower()
    debug = (exc.debug_error_string() or "").lower()
    words = ("failed to connect", "connection refused", "connect failed", "socket closed", "connection reset",
             "unavailable", "dns resolution failed", "end of tcp stream", "keepalive")
    return any(w in detail or w in debug for w in words) and "not ready" not in detail and "loading" not in detail
