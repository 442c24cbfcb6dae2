"""What a request was, as OVMS's metrics label it (``api``, ``interface``, ``method``), for every call
ovserve's transports count. Imported by the transports whether metrics are on or not: it holds nothing
but these constants (the families and the series load only when metrics are on).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a dict look-up per request stays cheap
class Call:
    """What a request was, as OVMS labels it: ``api``, ``interface``, ``method``."""

    api: str
    interface: str
    method: str
    #: counted per version (ModelInfer), or per model (OVMS's ModelReady and GetModelStatus have no version)
    versioned: bool = True
    #: an inference: its time, once answered, goes to ovms_request_time_us (as OVMS times them)
    timed: bool = False


# The calls of ovserve's transports. KServe V1 (/v1/models/{m}:predict and the model status)
# counts as OVMS counted those same URLs: api "TensorFlowServing", methods Predict and GetModelStatus.
REST_INFER = Call("KServe", "REST", "ModelInfer", timed=True)
REST_METADATA = Call("KServe", "REST", "ModelMetadata")
REST_READY = Call("KServe", "REST", "ModelReady", versioned=False)
REST_PREDICT = Call("TensorFlowServing", "REST", "Predict", timed=True)
REST_STATUS = Call("TensorFlowServing", "REST", "GetModelStatus", versioned=False)
GRPC_INFER = Call("KServe", "gRPC", "ModelInfer", timed=True)
GRPC_METADATA = Call("KServe", "gRPC", "ModelMetadata")
GRPC_READY = Call("KServe", "gRPC", "ModelReady", versioned=False)
TS_PREDICTIONS = Call("TorchServe", "gRPC", "Predictions", timed=True)
TS_STREAM = Call("TorchServe", "gRPC", "StreamPredictions", timed=True)
TS_STREAM2 = Call("TorchServe", "gRPC", "StreamPredictions2", timed=True)
REST_CALLS = (REST_INFER, REST_METADATA, REST_READY, REST_PREDICT, REST_STATUS)
GRPC_CALLS = (GRPC_INFER, GRPC_METADATA, GRPC_READY)
TORCHSERVE_CALLS = (TS_PREDICTIONS,)
