"""KServe's async gRPC client (``kserve.InferenceGRPCClient``), on the client's V2 messages and ovserve's codecs.

The constructor, its defaults and the four KServe methods are KServe's
(``python/kserve/kserve/inference_client.py``): code written for KServe's client
runs by changing the import. Beyond KServe: :meth:`model_metadata`,
:meth:`server_metadata`, :meth:`stream_infer`; ``infer`` takes a raw
``ModelInferRequest`` (as KServe documents, though its code refuses one);
``headers`` may also be a dict; ``retries`` is checked against gRPC's limits;
``channel_args`` is copied, never changed in place. docs/client.md has the
whole comparison. Its messages are the client's own (:mod:`.proto`), out of
protobuf's default pool: it lives in one process with ``tritonclient.grpc``
and ``kserve``, and takes their ``ModelInferRequest`` too.
"""
from __future__ import annotations

import json
import logging
import warnings
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import grpc

from .exceptions import InferenceError, InvalidInput
from .grpc_v2 import SERVICE, as_infer_request, model_metadata_dict, server_metadata_dict
from .infer_type import InferRequest, InferResponse
from .proto import stub
from .proto import v2 as pb
from .timeouts import USE_CLIENT_DEFAULT, Timeout, resolve

log = logging.getLogger("ovserve.client")



Headers = grpc.aio.Metadata | Sequence[tuple[str, str]] | Mapping[str, str] | None

#: gRPC's bounds on a retry policy's ``maxAttempts``, which KServe fills with ``retries``.
MIN_ATTEMPTS, MAX_ATTEMPTS = 2, 5


def service_config(max_attempts: int) -> str:
    """KServe's default retry policy: every method, UNAVAILABLE retried, 0.1 s backoff doubling to 1 s."""
    return json.dumps({"methodConfig": [{"name": [{}], "retryPolicy": {
        "maxAttempts": max_attempts, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}]})


def checked_retries(retries: int | None) -> int:
    """``retries`` as KServe's channel uses it (gRPC's ``maxAttempts``, the first attempt included), or a
    ValueError that says why gRPC would refuse it; a value above gRPC's cap warns and is capped."""
    if retries is None:
        return 0
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise TypeError(f"retries must be an integer, got {retries!r}")
    if retries < 0:
        raise ValueError(f"retries must be 0 (no retry policy) or {MIN_ATTEMPTS} to {MAX_ATTEMPTS}, got {retries}")
    if retries == 1:
        raise ValueError(
            "retries=1 is no retry policy gRPC accepts: KServe's client passes retries as the policy's maxAttempts "
            f"(every attempt, the first included), which must be at least {MIN_ATTEMPTS}, and with 1 every call fails "
            f"INVALID_ARGUMENT. Use 0 for a single attempt, or {MIN_ATTEMPTS} to {MAX_ATTEMPTS}.")
    if retries > MAX_ATTEMPTS:
        warnings.warn(f"retries={retries}: gRPC caps a retry policy's maxAttempts (KServe's retries) at "
                      f"{MAX_ATTEMPTS}; using {MAX_ATTEMPTS}", UserWarning, stacklevel=3)
        return MAX_ATTEMPTS
    return retries


def channel_options(channel_args: Sequence[tuple[str, Any]] | None, retries: int) -> list[tuple[str, Any]]:
    """The channel's options, as KServe's client makes them.

    No ``channel_args``: unlimited message sizes and, with ``retries``, the
    default retry policy. With ``channel_args``: those (a copy), plus the default
    policy unless they hold ``("grpc.enable_retries", 0)`` or a
    ``grpc.service_config`` of their own.
    """
    if channel_args is None:
        options: list[tuple[str, Any]] = [("grpc.max_send_message_length", -1),
                                          ("grpc.max_receive_message_length", -1)]
        if retries > 0:
            options += [("grpc.enable_retries", 1), ("grpc.service_config", service_config(retries))]
        return options
    options = list(channel_args)
    if ("grpc.enable_retries", 0) in options:
        return options
    if ("grpc.enable_retries", 1) not in options:
        options.append(("grpc.enable_retries", 1))
    if retries > 0 and not any(key == "grpc.service_config" for key, _ in options):
        options.append(("grpc.service_config", service_config(retries)))
    return options


def target_of(url: str, use_ssl: bool) -> str:
    """A gRPC target from KServe's ``url``: without a port, 443 with SSL and 80 without, as KServe appends.
    An ``http://`` or ``https://`` prefix is dropped (KServe hands it to gRPC, which cannot resolve it);
    gRPC's own target schemes (``dns:``, ``unix:``) stay as they are."""
    for scheme in ("http://", "https://"):
        if url.startswith(scheme):
            url = url[len(scheme):].rstrip("/")
    if url.startswith("[") and url.endswith("]"):  # a bare IPv6 address
        return f"{url}:{443 if use_ssl else 80}"
    if ":" not in url:
        return f"{url}:{443 if use_ssl else 80}"
    return url


def _read(path: str | None, argument: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise type(exc)(exc.errno, f"{argument}: cannot read {path!r}: {exc.strerror}") from None


def _metadata(headers: Headers) -> Any:
    """Call metadata from KServe's ``headers`` (a dict too); None for none."""
    if headers is None or isinstance(headers, grpc.aio.Metadata):
        return headers
    if isinstance(headers, Mapping):
        return tuple((str(k).lower(), v) for k, v in headers.items())
    return tuple(headers)


class InferenceGRPCClient:
    """Asynchronous KServe V2 gRPC client (KServe's ``InferenceGRPCClient``).

    :param url: ``host:port`` (without a port: 443 with ``use_ssl``, else 80).
    :param verbose: log each request and response (logger ``ovserve.client``, INFO).
    :param use_ssl: TLS; the three certificate arguments are file paths (PEM): the
        roots to trust (None: gRPC's defaults), and the client's key and
        certificate chain for mutual TLS (refused without ``use_ssl``). ``creds``
        (``grpc.ChannelCredentials``) wins over all four.
    :param channel_args: gRPC channel options; they replace the default ones
        (unlimited message sizes), and a ``grpc.service_config`` among them, or
        ``("grpc.enable_retries", 0)``, replaces the default retry policy.
    :param timeout: seconds a call may take, unless the call says otherwise (None: no deadline).
    :param retries: the default retry policy's ``maxAttempts`` (attempts in all, UNAVAILABLE
        retried): 0 for no policy, else 2 to 5 (gRPC refuses 1 and caps at 5).
    """

    def __init__(self, url: str, verbose: bool = False, use_ssl: bool = False, root_certificates: str | None = None,
                 private_key: str | None = None, certificate_chain: str | None = None,
                 creds: grpc.ChannelCredentials | None = None, channel_args: list[tuple[str, Any]] | None = None,
                 timeout: float | None = 60, retries: int | None = 3) -> None:
        self._target = target_of(url, use_ssl or creds is not None)
        options = channel_options(channel_args, checked_retries(retries))
        if creds is None and use_ssl:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(root_certificates, "root_certificates"),
                private_key=_read(private_key, "private_key"),
                certificate_chain=_read(certificate_chain, "certificate_chain"))
        elif creds is None and (root_certificates or private_key or certificate_chain):
            # KServe's client ignores them and talks in the clear; a TLS server then fails every call obscurely
            raise ValueError("root_certificates, private_key and certificate_chain need use_ssl=True (or creds): "
                             "without it the channel is plaintext")
        if creds is not None:
            self._channel = grpc.aio.secure_channel(self._target, creds, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(self._target, options=options)
        self._client_stub = stub(self._channel, SERVICE)
        self._verbose = verbose
        self._timeout = timeout

    def __repr__(self) -> str:
        return f"InferenceGRPCClient({self._target!r})"

    async def __aenter__(self) -> InferenceGRPCClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; calls after this fail."""
        await self._channel.close()

    def _deadline(self, timeout: Timeout) -> float | None:
        return resolve(timeout, self._timeout)

    async def _unary(self, method: str, request: Any, timeout: Timeout, headers: Headers) -> Any:
        if self._verbose:
            log.info("%s metadata: %s request: %s", method, headers, request)
        response = await getattr(self._client_stub, method)(request, timeout=self._deadline(timeout),
                                                            metadata=_metadata(headers))
        if self._verbose:
            log.info("%s response: %s", method, response)
        return response

    # -- KServe's methods ---------------------------------------------------
    async def infer(self, infer_request: InferRequest | pb.ModelInferRequest, timeout: Timeout = USE_CLIENT_DEFAULT,
                    headers: Headers = None) -> InferResponse:
        """Run one inference. ``infer_request``: an :class:`InferRequest`, or a ``ModelInferRequest`` sent as it is
        (of any stub set: the client's, ovserve's, tritonclient's, kserve's).

        :raises InvalidInput: the request is malformed (its data does not fit its shape or datatype).
        :raises grpc.RpcError: the server answered a status other than OK.
        """
        response = await self._unary("ModelInfer", self._message(infer_request), timeout, headers)
        return InferResponse.from_grpc(response)

    async def is_server_ready(self, timeout: Timeout = USE_CLIENT_DEFAULT, headers: Headers = None) -> bool:
        reply: pb.ServerReadyResponse = await self._unary("ServerReady", pb.ServerReadyRequest(), timeout, headers)
        return reply.ready

    async def is_server_live(self, timeout: Timeout = USE_CLIENT_DEFAULT, headers: Headers = None) -> bool:
        reply: pb.ServerLiveResponse = await self._unary("ServerLive", pb.ServerLiveRequest(), timeout, headers)
        return reply.live

    async def is_model_ready(self, model_name: str, timeout: Timeout = USE_CLIENT_DEFAULT,
                             headers: Headers = None) -> bool:
        """Is the model ready? ``grpc.RpcError`` (NOT_FOUND) for a model the server does not have."""
        reply: pb.ModelReadyResponse = await self._unary("ModelReady", pb.ModelReadyRequest(name=model_name), timeout,
                                                         headers)
        return reply.ready

    # -- beyond KServe ----------------------------------------------------
    async def model_metadata(self, model_name: str, model_version: str = "", timeout: Timeout = USE_CLIENT_DEFAULT,
                             headers: Headers = None) -> dict[str, Any]:
        """The model's metadata in V2 REST's JSON form: ``name``, ``versions``, ``platform``, ``inputs`` and
        ``outputs`` (each ``{"name", "datatype", "shape"}``, -1 for a dynamic dimension)."""
        reply = await self._unary("ModelMetadata", pb.ModelMetadataRequest(name=model_name, version=model_version),
                                  timeout, headers)
        return model_metadata_dict(reply)

    async def server_metadata(self, timeout: Timeout = USE_CLIENT_DEFAULT, headers: Headers = None) -> dict[str, Any]:
        """The server's ``name``, ``version`` and ``extensions``."""
        return server_metadata_dict(await self._unary("ServerMetadata", pb.ServerMetadataRequest(), timeout, headers))

    async def stream_infer(self, requests: AsyncIterable[InferRequest | pb.ModelInferRequest]
                           | Iterable[InferRequest | pb.ModelInferRequest], timeout: Timeout = USE_CLIENT_DEFAULT,
                           headers: Headers = None, return_errors: bool = False
                           ) -> AsyncIterator[InferResponse | InferenceError]:
        """Inferences over one ``ModelStreamInfer`` stream: the answers in the server's order, as they come.

        ``requests`` may be a list or an async iterable (requests sent as it
        yields them). ``timeout`` bounds the whole stream. A request the server
        refuses is answered in the stream: it raises :class:`InferenceError`
        (ending the iteration), or with ``return_errors`` is yielded as one and
        the stream goes on. A status other than OK for the stream itself raises
        ``grpc.RpcError``.
        """
        refused: list[Exception] = []  # a request that could not be encoded: raised once the stream has drained
        call = self._client_stub.ModelStreamInfer(self._stream_messages(requests, refused),
                                                  timeout=self._deadline(timeout), metadata=_metadata(headers))
        try:
            async for reply in call:
                if reply.error_message:
                    error = InferenceError(reply.error_message)
                    if not return_errors:
                        raise error
                    yield error
                else:
                    yield InferResponse.from_grpc(reply.infer_response)
        finally:
            call.cancel()  # nothing once the stream is over; stops it when the caller leaves early
        if refused:
            raise refused[0]

    async def _stream_messages(self, requests: Any, refused: list[Exception]) -> AsyncIterator[pb.ModelInferRequest]:
        """The requests as messages; a bad one ends the stream (the ones before it are still answered) and is
        kept for the caller, since grpc.aio would only log an exception raised here and cancel the call."""
        try:
            if isinstance(requests, AsyncIterable):
                async for request in requests:
                    yield self._message(request)
            else:
                for request in requests:
                    yield self._message(request)
        except (InvalidInput, TypeError, ValueError) as exc:
            refused.append(exc)

    def _message(self, request: Any) -> pb.ModelInferRequest:
        if isinstance(request, InferRequest):
            encoded: pb.ModelInferRequest = request.to_grpc()
            return encoded
        message = as_infer_request(request)
        if message is None:
            raise InvalidInput(f"infer takes an InferRequest or a ModelInferRequest, got {type(request).__name__}")
        return message


__all__ = ["InferenceGRPCClient", "USE_CLIENT_DEFAULT", "service_config", "checked_retries", "channel_options"]
