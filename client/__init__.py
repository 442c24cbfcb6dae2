"""ovserve's client: calls a KServe V1/V2 predictor over REST or gRPC, in neutral types.

``PredictorClient`` is what ``ovserve transformer`` and ``ovserve explainer``
use to reach their predictor. This package never imports :mod:`ovserve.server`:
it needs numpy, orjson, aiohttp (REST) or grpcio and protobuf (gRPC, loaded
only for a gRPC predictor), and :mod:`ovserve.common`, which it shares with the
server.

Layout: :mod:`.predictor` (the client, one protocol picked per predictor),
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
from .predictor import PROTOCOLS, PredictorClient

__all__ = [
    "PredictorClient", "PROTOCOLS", "split_host", "PREFIX", "PredictorError", "PredictorUnavailable",
    "PredictorTimeout", "PredictorNotFound", "PredictorInvalidInput", "PredictorInternal",
    "PredictorFailedPrecondition", "PredictorPayloadTooLarge", "PredictorUnsupported",
]

# TorchServe's gRPC client is loaded on first use: importing ovserve.client loads neither grpc nor ovserve's
# TorchServe stubs, which claim TorchServe's protobuf package in the default pool (a process holding a
# TorchServe user's own generated stubs, or the transformer, imports this package).
__all__ += ["TorchServeGRPCClient", "PredictionsRequest", "StreamPredictionError"]
#: name -> the module that defines it, imported on first use
_LAZY = {"TorchServeGRPCClient": "torchserve", "PredictionsRequest": "torchserve",
         "StreamPredictionError": "torchserve"}

if TYPE_CHECKING:
    from .torchserve import PredictionsRequest, StreamPredictionError, TorchServeGRPCClient


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
