"""Neutral request and response objects: what the data plane speaks.

Transports convert their wire formats to and from these; nothing here knows
JSON, protobuf or HTTP. Tensor data is always a numpy array (BYTES tensors are
object arrays of ``bytes``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Parameters = dict[str, Any]


@dataclass(slots=True)
class Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model_name: str
    inputs: list[Tensor]
    model_version: str = ""
    id: str = ""
    parameters: Parameters = field(default_factory=dict)
    outputs: list[RequestedOutput] = field(default_factory=list)


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    outputs: list[Tensor]
    id: str = ""
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class TensorSpec:
    """A model input or output as metadata reports it (-1 = dynamic dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(slots=True)
class ModelMetadata:
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


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
