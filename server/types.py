"""Neutral request and response objects: what the data plane speaks.

Transports convert their wire formats to and from these; nothing here knows
JSON, protobuf or HTTP. Tensor data is always a numpy array (BYTES tensors are
object arrays of ``bytes``). The request, response, tensor and metadata types
are :mod:`ovserve.common.types` (the predictor client speaks them too), re-exported
here beside the server's own.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ovserve.common.types import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    Parameters,
    RequestedOutput,
    Tensor,
    TensorSpec,
)

#: A request's headers (REST) or invocation metadata (gRPC), lower-case names: what a
#: transformer's handler sees; the model server ignores them.
Headers = Mapping[str, str]

__all__ = ["Parameters", "Headers", "Tensor", "RequestedOutput", "InferRequest", "InferResponse", "TensorSpec",
           "ModelMetadata", "Dim", "PortInfo", "ServerMetadata", "VersionStatus", "IndexEntry", "Explanation",
           "Registration", "Scaling", "Duration", "BatchStatistics", "VersionStatistics"]


@dataclass(frozen=True, slots=True)
class Dim:
    """One dimension of a model input: ``lo == hi`` when static, ``hi == -1`` when unbounded."""

    lo: int
    hi: int

    @property
    def static(self) -> bool:
        return self.lo == self.hi

    def accepts(self, n: int) -> bool:
        return n >= self.lo and (self.hi < 0 or n <= self.hi)

    def __str__(self) -> str:
        if self.static:
            return str(self.lo)
        if self.lo == 0 and self.hi < 0:
            return "-1"
        return f"{self.lo}:{'' if self.hi < 0 else self.hi}"


@dataclass(frozen=True, slots=True)
class PortInfo:
    name: str
    datatype: str
    dims: tuple[Dim, ...]
    index: int
    layout: str = ""  # e.g. "NHWC"; empty when the model does not say

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.datatype, tuple(d.lo if d.static else -1 for d in self.dims))


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """What server metadata reports: the component's name, version and protocol extensions."""

    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class VersionStatus:
    """One model version's state, as OpenVINO Model Server reports it (START, LOADING, AVAILABLE,
    UNLOADING, END) with the error of its last load or unload."""

    version: str
    state: str
    error_code: str = "OK"
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of the repository index (KServe/Triton): READY, LOADING, UNLOADING or UNAVAILABLE."""

    name: str
    version: str
    state: str
    reason: str = ""


@dataclass
class Explanation:
    """The explanations of one request (``:explain``), in neutral form; the transports encode it."""

    model_name: str
    kind: str  # "image" or "tabular"
    method: str  # "occlusion" or "ablation"
    output: str
    targets: list[int]
    scores: list[float]
    attributions: np.ndarray  # [N, H, W] or [N, F], FP32
    heatmaps: list[bytes] = field(default_factory=list)  # PNG per instance (images)
    predictor_calls: int = 0
    perturbations: int = 0
    settings: dict[str, Any] = field(default_factory=dict)  # the parameters as applied

    def summary(self) -> dict[str, Any]:
        return {"method": self.method, "output": self.output, "predictor_calls": self.predictor_calls,
                "perturbations": self.perturbations, "parameters": self.settings}


@dataclass(frozen=True, slots=True)
class Registration:
    """A model to register (TorchServe's RegisterModel); zeros and empty strings mean "the default"."""

    url: str
    model_name: str = ""
    handler: str = ""
    initial_workers: int = 0
    batch_size: int = 0
    max_batch_delay_ms: int = 0
    response_timeout_s: int = 0
    synchronous: bool = False
    runtime: str = ""


@dataclass(frozen=True, slots=True)
class Scaling:
    """A model version's new worker range (TorchServe's ScaleWorker)."""

    model_name: str
    model_version: str = ""
    min_worker: int = 0
    max_worker: int = 0
    synchronous: bool = False
    timeout: int = -1


@dataclass(frozen=True, slots=True)
class Duration:
    """How many times something happened, and its time summed in nanoseconds (Triton's StatisticDuration)."""

    count: int = 0
    ns: int = 0


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """The executions of one batch size: ``count`` of them in each duration."""

    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


@dataclass(frozen=True, slots=True)
class VersionStatistics:
    """One model version's cumulative statistics (the V2 statistics extension, Triton's fields)."""

    name: str
    version: str
    #: milliseconds since the epoch at the end of the last request (0: none yet)
    last_inference: int
    inference_count: int
    execution_count: int
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    batch_stats: tuple[BatchStatistics, ...] = ()
    #: ovserve has no response cache: always zero
    cache_hit: Duration = Duration()
    cache_miss: Duration = Duration()
