"""ovserve's client: KServe's Python client API, and the predictor client of the transformer and explainer.

``InferenceGRPCClient`` and ``InferenceRESTClient`` (with ``RESTConfig`` and the
types ``InferInput``, ``InferRequest``, ``InferResponse``, ``InferOutput``) are
KServe's async clients, argument for argument (docs/client.md): code written for
``kserve`` runs by changing the import. ``PredictorClient`` is what ``ovserve
transformer`` and ``ovserve explainer`` use to reach their predictor, in neutral
types; both are built on the same connections and codecs. This package never
imports :mod:`ovserve.server`: it needs numpy, orjson, aiohttp (REST) or grpcio
and protobuf (gRPC, loaded only for a gRPC client), and :mod:`ovserve.common`,
which it shares with the server.

Layout: :mod:`.kserve_grpc` and :mod:`.kserve_rest` (KServe's clients, on
:mod:`.infer_type`, KServe's types, and :mod:`.exceptions`, its errors),
:mod:`.predictor` (the predictor client, one protocol picked per predictor),
:mod:`.rest` and :mod:`.rest_wire` (KServe V1/V2 REST), :mod:`.grpc_v2` (KServe
V2 gRPC), :mod:`.connection` (address, backoff, the protocols' interface),
:mod:`.errors` (the predictor's errors, marked ``predictor: ``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .connection import split_host
from .errors import (
    PREFIX,
    PredictorError,
    PredictorFailedPrecondition,
    PredictorInternal,
    PredictorInvalidInput,
    PredictorNotFound,
    PredictorPayloadTooLarge,
    PredictorTimeout,
    PredictorUnavailable,
    PredictorUnsupported,
)
from .exceptions import (
    ConnectError,
    HTTPStatusError,
    InferenceError,
    InvalidInput,
    InvalidURL,
    TimeoutException,
    UnsupportedProtocol,
)
from .infer_type import InferInput, InferOutput, InferRequest, InferResponse, RequestedOutput
from .kserve_rest import InferenceRESTClient, RESTConfig
from .predictor import PROTOCOLS, PredictorClient
from .timeouts import USE_CLIENT_DEFAULT

__all__ = [
    "InferenceGRPCClient", "InferenceRESTClient", "RESTConfig", "InferInput", "InferOutput", "InferRequest",
    "InferResponse", "RequestedOutput", "USE_CLIENT_DEFAULT", "InvalidInput", "InferenceError",
    "UnsupportedProtocol", "HTTPStatusError", "InvalidURL", "ConnectError", "TimeoutException",
    "PredictorClient", "PROTOCOLS", "split_host", "PREFIX", "PredictorError", "PredictorUnavailable",
    "PredictorTimeout", "PredictorNotFound", "PredictorInvalidInput", "PredictorInternal",
    "PredictorFailedPrecondition", "PredictorPayloadTooLarge", "PredictorUnsupported",
]

# TorchServe's gRPC client is loaded on first use: importing ovserve.client loads neither grpc nor ovserve's
# TorchServe stubs, which claim TorchServe's protobuf package in the default pool (a process holding a
# TorchServe user's own generated stubs, or the transformer, imports this package).
# So is KServe's gRPC client (ovserve's V2 stubs claim protobuf package ``inference``, as tritonclient's and
# kserve's do): ``from ovserve.client import InferenceRESTClient`` loads no protobuf.
__all__ += ["TorchServeGRPCClient", "PredictionsRequest", "StreamPredictionError"]
#: name -> the module that defines it, imported on first use
_LAZY = {"TorchServeGRPCClient": "torchserve", "PredictionsRequest": "torchserve",
         "StreamPredictionError": "torchserve", "InferenceGRPCClient": "kserve_grpc"}

if TYPE_CHECKING:
    from .kserve_grpc import InferenceGRPCClient
    from .torchserve import PredictionsRequest, StreamPredictionError, TorchServeGRPCClient


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
