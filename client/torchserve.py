"""TorchServe's gRPC API from Python, async: :class:`TorchServeGRPCClient`.

One client for both of TorchServe's gRPC services, as ovserve serves them (``ovserve serve
--ts-inference-port 7070 --ts-management-port 7071``) and as TorchServe itself does: the inference
service (Ping, Predictions, StreamPredictions, StreamPredictions2) and the management service
(RegisterModel, UnregisterModel, ScaleWorker, ListModels, DescribeModel, SetDefault), each at its own
address. Arguments and defaults are TorchServe's (its management.proto and
``ts_scripts/torchserve_grpc_client.py``); a bearer token is sent as TorchServe's token authorization
expects it (metadata ``authorization: Bearer <token>``).

Errors: a call that ends with a non-OK status raises grpc's own :class:`grpc.RpcError` (``.code()``,
``.details()``), unchanged; docs/client.md lists the codes ovserve answers beside TorchServe's. A
failed request inside StreamPredictions2 does not end the call: it arrives in the stream as a
:class:`StreamPredictionError` value. Arguments the wire cannot carry raise ``ValueError`` or
``TypeError`` before anything is sent.

The messages are the client's own (:mod:`.proto`), built in a descriptor pool apart from protobuf's
default one: a process may import this module beside stubs generated from TorchServe's own .proto files
(which register TorchServe's packages in the default pool, as ovserve's server stubs do), and
:meth:`TorchServeGRPCClient.stream_predictions2` takes their ``PredictionsRequest`` too. This module is
imported only when :class:`TorchServeGRPCClient` is first used (``ovserve.client`` loads it on demand).
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, cast

import grpc

from .connection import host_port, split_host
from .proto import empty, is_message, stub
from .proto import ts_inference as ipb
from .proto import ts_management as mpb
from .timeouts import USE_CLIENT_DEFAULT, Timeout, resolve

__all__ = ["TorchServeGRPCClient", "PredictionsRequest", "StreamPredictionError", "USE_CLIENT_DEFAULT"]


#: TorchServe's two services (their full names in protobuf)
SERVICES: Final = {"inference": "org.pytorch.serve.grpc.inference.InferenceAPIsService",
                   "management": "org.pytorch.serve.grpc.management.ManagementAPIsService"}
#: a StreamPredictions2 request of any stub set (the client's, ovserve's server stubs, a TorchServe user's)
PREDICTIONS_REQUEST: Final = "org.pytorch.serve.grpc.inference.PredictionsRequest"

#: Call metadata: a mapping or (key, value) pairs; keys are sent lower-cased, as gRPC requires.
Headers = Mapping[str, str] | Sequence[tuple[str, str]]

#: Without channel_args: no size limit on messages either way (an image or a model's answer can be large;
#: gRPC's 4 MB receive limit would fail it), as KServe's gRPC client does.
DEFAULT_CHANNEL_ARGS: Final[list[tuple[str, Any]]] = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]


@dataclass(frozen=True)
class PredictionsRequest:
    """One request of :meth:`TorchServeGRPCClient.stream_predictions2` (TorchServe's PredictionsRequest).

    ``input`` is the handler's input map (values bytes, or str sent as UTF-8); ``model_version`` empty means
    the model's default version; ``sequence_id`` ties a stateful model's requests together and comes back on
    every answer to this request.
    """

    model_name: str
    input: Mapping[str, bytes | str] = field(default_factory=dict)
    model_version: str = ""
    sequence_id: str | None = None


class StreamPredictionError(grpc.RpcError):
    """A request of a StreamPredictions2 call that failed while the call went on (the answer's ``status``).

    Handed out as a value in the stream, not raised; it has :class:`grpc.RpcError`'s ``code()`` and
    ``details()``, so ``raise`` it to treat it as any other failed call.
    """

    def __init__(self, code: grpc.StatusCode | int, message: str, sequence_id: str | None) -> None:
        self._code = code if isinstance(code, grpc.StatusCode) else _status_code(code)
        self._message = message
        self.sequence_id = sequence_id
        super().__init__(f"{self._code.name}: {message}")

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message


def _status_code(value: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code
    return grpc.StatusCode.UNKNOWN


def _read(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{what}: cannot read {path!r}: {exc.strerror or exc}") from None


def _input_map(values: Mapping[str, bytes | str]) -> dict[str, bytes]:
    out = {}
    for key, value in values.items():
        if isinstance(value, str):
            out[key] = value.encode()
        elif isinstance(value, (bytes, bytearray, memoryview)):
            out[key] = bytes(value)
        else:
            raise TypeError(f"input[{key!r}] must be bytes or str (the handler gets bytes), "
                            f"not {type(value).__name__}")
    return out


def _request(model_name: str, values: Mapping[str, bytes | str], model_version: str,
             sequence_id: str | None) -> ipb.PredictionsRequest:
    msg = ipb.PredictionsRequest(model_name=model_name, model_version=model_version, input=_input_map(values))
    if sequence_id is not None:  # proto3 optional: unset and "" are different on the wire
        msg.sequence_id = sequence_id
    return msg


def _to_pb(item: object) -> ipb.PredictionsRequest:
    if is_message(item, PREDICTIONS_REQUEST):  # sent as it is, by its own serializer: the wire format is one
        return cast("ipb.PredictionsRequest", item)
    if isinstance(item, PredictionsRequest):
        return _request(item.model_name, item.input, item.model_version, item.sequence_id)
    raise TypeError(f"stream_predictions2 takes PredictionsRequest items, not {type(item).__name__}")


def _not_negative(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None and value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")


class TorchServeGRPCClient:
    """TorchServe's gRPC inference and management APIs (grpc.aio; use it from a running event loop).

    ``inference_url`` and ``management_url``: ``host:port`` of each service (TorchServe's defaults are
    7070 and 7071); either may be None when only the other is used, and a call to a service without an
    address raises ``RuntimeError``. Without a port, 443 with TLS and 80 without, as KServe's client does.
    ``token``: sent on every call as ``authorization: Bearer <token>`` (TorchServe's token authorization
    gives inference and management different keys: one client per service then). TLS as KServe's gRPC
    client: ``use_ssl``, with ``root_certificates``, ``private_key`` and ``certificate_chain`` as PEM file
    paths (the last two present a client certificate); ``creds`` (grpc.ChannelCredentials) wins over
    them. ``channel_args`` replaces the default channel options (no message size limit). ``timeout``:
    each call's deadline in seconds unless the call gives its own (None: no deadline).
    """

    def __init__(self, inference_url: str | None = None, management_url: str | None = None, *,
                 token: str | None = None, use_ssl: bool = False, root_certificates: str | None = None,
                 private_key: str | None = None, certificate_chain: str | None = None,
                 creds: grpc.ChannelCredentials | None = None,
                 channel_args: Sequence[tuple[str, Any]] | None = None, timeout: float | None = 60) -> None:
        if inference_url is None and management_url is None:
            raise ValueError("give inference_url, management_url or both (TorchServe: host:7070, host:7071)")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive seconds or None (no deadline), got {timeout}")
        files = {"root_certificates": root_certificates, "private_key": private_key,
                 "certificate_chain": certificate_chain}
        if not use_ssl and creds is None and any(v is not None for v in files.values()):
            named = ", ".join(k for k, v in files.items() if v is not None)
            # ignoring a client certificate would send the call in the clear: refuse
            raise ValueError(f"{named} given without use_ssl=True")
        if (private_key is None) != (certificate_chain is None) and creds is None:
            raise ValueError("private_key and certificate_chain go together (a client certificate and its key)")
        self.use_ssl = use_ssl or creds is not None
        self.inference_url = self._target(inference_url)
        self.management_url = self._target(management_url)
        self.timeout = timeout
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._options = list(DEFAULT_CHANNEL_ARGS if channel_args is None else channel_args)
        self._creds = creds
        if creds is None and use_ssl:
            self._creds = grpc.ssl_channel_credentials(
                root_certificates=_read(root_certificates, "root_certificates"),
                private_key=_read(private_key, "private_key"),
                certificate_chain=_read(certificate_chain, "certificate_chain"))
        # Channels are made on first use, inside the event loop that uses them (grpc.aio binds a channel
        # to the loop it was made in: a client built before asyncio.run() would otherwise be unusable).
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, Any] = {}
        self._closed = False

    def _target(self, url: str | None) -> str | None:
        if url is None:
            return None
        address, port = split_host(url, self.use_ssl)
        return host_port(address, port)

    def _stub(self, service: str) -> Any:
        if self._closed:
            raise RuntimeError("the client is closed")
        known = self._stubs.get(service)
        if known is not None:
            return known
        target = self.inference_url if service == "inference" else self.management_url
        if target is None:
            raise RuntimeError(f"no {service} address: TorchServeGRPCClient({service}_url='host:port')")
        if self._creds is not None:
            channel = grpc.aio.secure_channel(target, self._creds, options=self._options)
        else:
            channel = grpc.aio.insecure_channel(target, options=self._options)
        self._channels[service] = channel
        made = self._stubs[service] = stub(channel, SERVICES[service])
        return made

    def _call_args(self, timeout: Timeout, headers: Headers | None) -> dict[str, Any]:
        pairs = list(self._metadata)
        if headers:
            items = headers.items() if isinstance(headers, Mapping) else headers
            given = [(str(k).lower(), str(v)) for k, v in items]
            mine = {k for k, _ in given}
            pairs = [p for p in pairs if p[0] not in mine] + given  # the call's own authorization wins
        return {"timeout": resolve(timeout, self.timeout), "metadata": tuple(pairs) or None}

    # -- inference -----------------------------------------------------------------------------------

    async def ping(self, timeout: Timeout = USE_CLIENT_DEFAULT, headers: Headers | None = None) -> dict[str, Any]:
        """The server's health: TorchServe's JSON, parsed (``{"status": "Healthy"}`` or ``"Unhealthy"``)."""
        reply = await self._stub("inference").Ping(empty.Empty(), **self._call_args(timeout, headers))
        health: dict[str, Any] = json.loads(reply.health)
        return health

    async def predictions(self, model_name: str, input: Mapping[str, bytes | str], model_version: str = "",
                          sequence_id: str | None = None, timeout: Timeout = USE_CLIENT_DEFAULT,
                          headers: Headers | None = None) -> bytes:
        """One request, the handler's answer as bytes (``input``: the handler's input map, e.g.
        ``{"data": jpeg_bytes}``; ``model_version`` empty: the default version)."""
        msg = _request(model_name, input, model_version, sequence_id)
        reply = await self._stub("inference").Predictions(msg, **self._call_args(timeout, headers))
        return bytes(reply.prediction)

    async def stream_predictions(self, model_name: str, input: Mapping[str, bytes | str], model_version: str = "",
                                 sequence_id: str | None = None, timeout: Timeout = USE_CLIENT_DEFAULT,
                                 headers: Headers | None = None) -> AsyncIterator[bytes]:
        """One request; each message the handler sends (its intermediate ones, then its answer), in order.
        Leaving the loop early cancels the call."""
        msg = _request(model_name, input, model_version, sequence_id)
        call = self._stub("inference").StreamPredictions(msg, **self._call_args(timeout, headers))
        try:
            async for reply in call:
                yield bytes(reply.prediction)
        finally:
            call.cancel()  # a no-op once the call has ended

    async def stream_predictions2(
        self, requests: AsyncIterable[PredictionsRequest | Any] | Iterable[PredictionsRequest | Any],
        timeout: Timeout = USE_CLIENT_DEFAULT, headers: Headers | None = None,
    ) -> AsyncIterator[tuple[str | None, bytes | StreamPredictionError]]:
        """The bidirectional stream: sends ``requests`` (:class:`PredictionsRequest`, from a sync or an
        async iterable; the stream half-closes when it ends) and yields ``(sequence_id, answer)`` for
        each message that comes back: ``answer`` is the prediction's bytes, or a
        :class:`StreamPredictionError` for a request that failed (the call goes on). ``sequence_id`` is
        the request's (None when it set none). A streaming handler's intermediate messages come as
        answers of their own, in order. The call's own failure raises grpc.RpcError.
        """
        failure: list[BaseException] = []
        call: Any = None

        async def messages() -> AsyncIterator[ipb.PredictionsRequest]:
            try:
                if isinstance(requests, AsyncIterable):
                    async for item in requests:
                        yield _to_pb(item)
                else:
                    for item in requests:
                        yield _to_pb(item)
            except Exception as exc:
                # grpc.aio would log this and cancel the call; the caller hears it instead
                failure.append(exc)
                if call is not None:
                    call.cancel()

        call = self._stub("inference").StreamPredictions2(messages(), **self._call_args(timeout, headers))
        try:
            try:
                async for reply in call:
                    seq = reply.sequence_id if reply.HasField("sequence_id") else None
                    if reply.HasField("status") and reply.status.code != 0:
                        yield seq, StreamPredictionError(reply.status.code, reply.status.message, seq)
                    else:
                        yield seq, bytes(reply.prediction)
            except (grpc.RpcError, asyncio.CancelledError):
                if failure:  # the call was cancelled because of it (grpc.aio raises CancelledError then)
                    raise failure[0] from None
                raise
            if failure:
                raise failure[0]
        finally:
            call.cancel()

    # -- management ----------------------------------------------------------------------------------

    async def register(self, url: str, model_name: str = "", handler: str = "", initial_workers: int = 0,
                       batch_size: int | None = None, max_batch_delay: int | None = None,
                       response_timeout: int | None = None, synchronous: bool = False, runtime: str = "", *,
                       startup_timeout: int | None = None, s3_sse_kms: bool = False,
                       timeout: Timeout = USE_CLIENT_DEFAULT, headers: Headers | None = None) -> str:
        """RegisterModel: load ``url`` (a name in the server's model store, or an allowed file/http(s) URL);
        the server's message. ``model_name`` and ``handler`` override the archive's. None (and, on this
        wire, 0) leaves a setting to the archive's model-config.yaml, else TorchServe's default: batch_size
        1, max_batch_delay 100 ms, response_timeout 120 s, startup_timeout 120 s. ``initial_workers``
        (TorchServe's default 0: none until ScaleWorker) yields to the archive's minWorkers.
        ``synchronous``: answer once the workers are up (TorchServe's default: at once)."""
        _not_negative(initial_workers=initial_workers, batch_size=batch_size, max_batch_delay=max_batch_delay,
                      response_timeout=response_timeout, startup_timeout=startup_timeout)
        msg = mpb.RegisterModelRequest(
            url=url, model_name=model_name, handler=handler, initial_workers=initial_workers,
            batch_size=batch_size or 0, max_batch_delay=max_batch_delay or 0,
            response_timeout=response_timeout or 0, synchronous=synchronous, runtime=runtime,
            startup_timeout=startup_timeout or 0, s3_sse_kms=s3_sse_kms)
        reply = await self._stub("management").RegisterModel(msg, **self._call_args(timeout, headers))
        return str(reply.msg)

    async def unregister(self, model_name: str, model_version: str = "", timeout: Timeout = USE_CLIENT_DEFAULT,
                         headers: Headers | None = None) -> str:
        """UnregisterModel: the version named, else the default one (refused while other versions exist)."""
        msg = mpb.UnregisterModelRequest(model_name=model_name, model_version=model_version)
        reply = await self._stub("management").UnregisterModel(msg, **self._call_args(timeout, headers))
        return str(reply.msg)

    async def scale(self, model_name: str, model_version: str = "", min_worker: int = 1,
                    max_worker: int | None = None, number_gpu: int = 0, synchronous: bool = False,
                    worker_timeout: int = -1, timeout: Timeout = USE_CLIENT_DEFAULT,
                    headers: Headers | None = None) -> str:
        """ScaleWorker: how many requests the version (default: the default one) handles at once.
        TorchServe's defaults: ``min_worker`` 1, ``max_worker`` = ``min_worker``, asynchronous.
        ``worker_timeout`` is the request's ``timeout`` field (TorchServe: how long a retiring worker may
        finish its requests, -1 no limit; ovserve: how long a synchronous scaling may take, -1 or 0 no
        limit); ``timeout`` is this call's deadline, as for every method."""
        _not_negative(min_worker=min_worker, max_worker=max_worker, number_gpu=number_gpu)
        msg = mpb.ScaleWorkerRequest(model_name=model_name, model_version=model_version, min_worker=min_worker,
                                     max_worker=min_worker if max_worker is None else max_worker,
                                     number_gpu=number_gpu, synchronous=synchronous, timeout=worker_timeout)
        reply = await self._stub("management").ScaleWorker(msg, **self._call_args(timeout, headers))
        return str(reply.msg)

    async def list_models(self, limit: int = 100, next_page_token: int | str = 0,
                          timeout: Timeout = USE_CLIENT_DEFAULT, headers: Headers | None = None) -> dict[str, Any]:
        """ListModels: one page, parsed: ``{"models": [{"modelName", "modelUrl"}, ...]}`` with
        ``"nextPageToken"`` when more follow (pass it back as ``next_page_token``, str or int).
        ``limit``: 1 to 1000, TorchServe's default 100 (sent as such: TorchServe answers 0 with an empty page)."""
        msg = mpb.ListModelsRequest(limit=limit, next_page_token=int(next_page_token))
        reply = await self._stub("management").ListModels(msg, **self._call_args(timeout, headers))
        page: dict[str, Any] = json.loads(reply.msg)
        return page

    async def describe(self, model_name: str, model_version: str = "", customized: bool = False,
                       timeout: Timeout = USE_CLIENT_DEFAULT, headers: Headers | None = None) -> list[dict[str, Any]]:
        """DescribeModel: TorchServe's JSON array, parsed: one element (the default version, or the one
        named), or every version with ``model_version="all"``. ovserve adds each model's ``inputs`` and
        ``outputs`` (name, datatype, shape)."""
        msg = mpb.DescribeModelRequest(model_name=model_name, model_version=model_version, customized=customized)
        reply = await self._stub("management").DescribeModel(msg, **self._call_args(timeout, headers))
        described: list[dict[str, Any]] = json.loads(reply.msg)
        return described

    async def set_default(self, model_name: str, model_version: str, timeout: Timeout = USE_CLIENT_DEFAULT,
                          headers: Headers | None = None) -> str:
        """SetDefault: the version served when a request names none."""
        msg = mpb.SetDefaultRequest(model_name=model_name, model_version=model_version)
        reply = await self._stub("management").SetDefault(msg, **self._call_args(timeout, headers))
        return str(reply.msg)

    # -- lifetime ------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close both channels (calls in progress are cancelled); closing twice is a no-op."""
        self._closed = True
        channels, self._channels = list(self._channels.values()), {}
        self._stubs.clear()
        for channel in channels:
            await channel.close()

    async def __aenter__(self) -> TorchServeGRPCClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
