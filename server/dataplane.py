"""The data plane: the one interface every transport calls, and nothing else.

Transports parse their wire format into neutral types (:mod:`ovserve.server.types`),
call a :class:`DataPlane`, and encode what it answers. Three components implement
it: the model server (:class:`~ovserve.server.model_server.ModelServer`: the
repository and OpenVINO), the transformer and the explainer (handlers in front
of a predictor). An operation a component does not offer raises
:class:`~ovserve.server.errors.Unsupported`, which every transport maps to
501 / UNIMPLEMENTED from the one error table.
"""
from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import Unsupported
from .types import (
    Explanation,
    Headers,
    IndexEntry,
    InferRequest,
    InferResponse,
    ModelMetadata,
    Parameters,
    PortInfo,
    Registration,
    Scaling,
    ServerMetadata,
    VersionStatistics,
    VersionStatus,
)

if TYPE_CHECKING:  # loaded only when metrics are on
    from .metrics.registry import Metrics


class DataPlane(abc.ABC):
    #: Whether :meth:`input_specs` are exactly the inputs :meth:`infer` accepts (a model server),
    #: or only hints (a transformer's handler may turn other inputs into the predictor's).
    exact_inputs: bool = True

    def __init__(self) -> None:
        #: set by the Server once its listeners accept connections
        self.live = False
        #: the process's Prometheus metrics, when they are on (the transports' hooks and /metrics read them)
        self.metrics: Metrics | None = None

    # -- lifecycle (the Server calls these) -----------------------------------
    # Optional hooks, not abstract: a data plane with nothing to start or stop keeps these no-ops.
    async def start(self) -> None:  # noqa: B027 (an optional hook: the no-op is its default)
        """After the listeners accept connections: the initial load, or the first look at a predictor."""

    async def stop(self) -> None:  # noqa: B027 (an optional hook: the no-op is its default)
        """After the listeners have drained."""

    # -- health and metadata ------------------------------------------------
    def server_live(self) -> bool:
        return self.live

    @abc.abstractmethod
    def server_ready(self) -> bool: ...

    @abc.abstractmethod
    def server_metadata(self) -> ServerMetadata: ...

    @abc.abstractmethod
    def model_names(self) -> list[str]: ...

    @abc.abstractmethod
    def model_ready(self, name: str, version: str = "") -> bool:
        """NotFound for an unknown model; False for a known one that cannot serve now."""

    @abc.abstractmethod
    def model_metadata(self, name: str, version: str = "") -> ModelMetadata: ...

    @abc.abstractmethod
    def model_status(self, name: str) -> list[VersionStatus]: ...

    @abc.abstractmethod
    async def input_specs(self, name: str, version: str = "") -> list[PortInfo]:
        """The model's inputs, for decoders that need them (V1 instances, a headerless binary body)."""

    # -- inference ----------------------------------------------------------
    @abc.abstractmethod
    async def infer(self, request: InferRequest, headers: Headers | None = None) -> InferResponse: ...

    async def explain(self, request: InferRequest, parameters: Parameters,
                      headers: Headers | None = None) -> Explanation:
        self.model_ready(request.model_name)  # NotFound for an unknown model first
        raise Unsupported(f"model {request.model_name!r} has no explainer configured; "
                          "run an explainer component for :explain")

    # -- the statistics extension (Triton's) ---------------------------------
    def model_statistics(self, name: str = "", version: str = "") -> list[VersionStatistics]:
        """Each version's cumulative statistics: every model's ("" name), every version of ``name`` ("" version),
        or one; NotFound for an unknown model or version."""
        raise Unsupported(f"{self.server_metadata().name} keeps no inference statistics")

    # -- the model repository extension -------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        raise Unsupported(f"{self.server_metadata().name} has no model repository")

    async def load_model(self, name: str) -> None:
        raise Unsupported(f"{self.server_metadata().name} has no model repository to load {name!r} from")

    async def unload_model(self, name: str) -> None:
        raise Unsupported(f"{self.server_metadata().name} has no model repository to unload {name!r} from")

    # -- the TorchServe extension: handlers over the models, and their management ----------
    # Bytes in, bytes out through a model's handler (server/torchserve/); the management
    # operations answer TorchServe's messages and documents (neutral: strings, dicts, lists).
    async def predict(self, name: str, version: str, inputs: Mapping[str, bytes], headers: Headers,
                      sequence_id: str = "", send: Callable[[bytes], None] | None = None) -> bytes:
        """A model's handler on one request; ``send`` gets each intermediate message of a stream."""
        raise Unsupported(f"{self.server_metadata().name} has no TorchServe handlers")

    def handlers_healthy(self) -> bool:
        """TorchServe's Ping: whether every default version has its minimum of workers."""
        raise Unsupported(f"{self.server_metadata().name} has no TorchServe handlers")

    async def register_model(self, registration: Registration) -> str:
        raise Unsupported(f"{self.server_metadata().name} cannot register models")

    async def unregister_model(self, name: str, version: str = "") -> str:
        raise Unsupported(f"{self.server_metadata().name} cannot unregister models")

    async def scale_workers(self, scaling: Scaling) -> str:
        raise Unsupported(f"{self.server_metadata().name} has no workers to scale")

    def list_models(self, limit: int, token: int) -> dict[str, Any]:
        raise Unsupported(f"{self.server_metadata().name} cannot list models")

    async def describe_model(self, name: str, version: str = "",
                             customized: bool = False) -> list[dict[str, Any]]:
        raise Unsupported(f"{self.server_metadata().name} cannot describe models")

    def set_default_version(self, name: str, version: str) -> str:
        raise Unsupported(f"{self.server_metadata().name} has no default versions to set")
