"""Neutral request and response objects: what the data plane and the predictor client speak.

Transports and clients convert their wire formats to and from these; nothing
here knows JSON, protobuf or HTTP. Tensor data is always a numpy array (BYTES
tensors are object arrays of ``bytes``). Shared by server and client (a
transformer hands the very objects its predictor client returns to its handler);
:mod:`ovserve.server.types` re-exports them beside the server's own types.
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
    #: extensions beyond the V2 protocol (REST only: gRPC's ModelMetadataResponse has no such field), e.g. the
    #: OpenVINO precision ovserve compiled the model in and how it chose it
    parameters: dict[str, Any] = field(default_factory=dict)
