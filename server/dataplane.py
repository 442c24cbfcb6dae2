"""The data plane: the interfaces every transport calls, and nothing else.

Transports parse their wire format into neutral types (:mod:`ovserve.server.types`),
call a data plane, and encode what it answers. The interface is split as MLServer
splits its handlers. Every component implements the core, :class:`DataPlane`
(lifecycle, health, metadata, infer); each extension is a protocol a component
offers or not, and its class says which:

- :class:`Explains`: ``:explain`` (the explainer)
- :class:`ModelRepository`: KServe V2's model repository extension (the model server)
- :class:`Statistics`: Triton's statistics extension (the model server)
- :class:`TorchServe`: TorchServe's handlers and their management (the model server's
  handler registry, which ``serve.py`` hands to TorchServe's two services)

A transport asks for the extension a call needs with :func:`explainer_of`,
:func:`repository_of` or :func:`statistics_of`. A component without it is refused
with :class:`~ovserve.server.errors.Unsupported`, which every transport maps to
501 / UNIMPLEMENTED from the one error table, after NotFound for a model the
component does not know; a component may say why in :attr:`DataPlane.refusals`.
TorchServe's services are built over a :class:`TorchServe` and never ask.
"""
from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast, runtime_checkable

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

__all__ = ["DataPlane", "Explains", "ModelRepository", "Statistics", "TorchServe", "EXTENSIONS", "REFUSALS",
           "explainer_of", "repository_of", "statistics_of"]


class DataPlane(abc.ABC):
    """The core every component implements: lifecycle, health, metadata and inference."""

    #: Whether :meth:`input_specs` are exactly the inputs :meth:`infer` accepts (a model server),
    #: or only hints (a transformer's handler may turn other inputs into the predictor's).
    exact_inputs: bool = True
    #: Why this component lacks an extension, by extension, where it has more to say than
    #: :data:`REFUSALS` (the same placeholders: ``{server}``, ``{model}``).
    refusals: ClassVar[Mapping[type, str]] = {}

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


# -- the extensions: a component offers each or not ------------------------------------------------
# Runtime-checkable, for the transports' question (issubclass); abstract, so a class that declares one
# and misses a method cannot be made.

@runtime_checkable
class Explains(Protocol):
    """``:explain`` (KServe V1) and ``/v2/models/{m}/explain`` (an ovserve extension)."""

    @abc.abstractmethod
    async def explain(self, request: InferRequest, parameters: Parameters,
                      headers: Headers | None = None) -> Explanation: ...


@runtime_checkable
class ModelRepository(Protocol):
    """KServe V2's model repository extension: the index, load and unload."""

    @abc.abstractmethod
    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]: ...

    @abc.abstractmethod
    async def load_model(self, name: str) -> None: ...

    @abc.abstractmethod
    async def unload_model(self, name: str) -> None: ...


@runtime_checkable
class Statistics(Protocol):
    """Triton's statistics extension."""

    @abc.abstractmethod
    def model_statistics(self, name: str = "", version: str = "") -> list[VersionStatistics]:
        """Each version's cumulative statistics: every model's ("" name), every version of ``name`` ("" version),
        or one; NotFound for an unknown model or version."""


@runtime_checkable
class TorchServe(Protocol):
    """TorchServe's handlers over the models, and their management.

    Bytes in, bytes out through a model's handler (server/torchserve/); the management operations
    answer TorchServe's messages and documents (neutral: strings, dicts, lists)."""

    @abc.abstractmethod
    async def predict(self, name: str, version: str, inputs: Mapping[str, bytes], headers: Headers,
                      sequence_id: str = "", send: Callable[[bytes], None] | None = None) -> bytes:
        """A model's handler on one request; ``send`` gets each intermediate message of a stream."""

    @abc.abstractmethod
    def healthy(self) -> bool:
        """TorchServe's Ping: whether every default version has its minimum of workers."""

    @abc.abstractmethod
    async def register(self, reg: Registration) -> str: ...

    @abc.abstractmethod
    async def unregister(self, name: str, version: str = "") -> str: ...

    @abc.abstractmethod
    async def scale(self, s: Scaling) -> str: ...

    @abc.abstractmethod
    def list_models(self, limit: int, token: int) -> dict[str, Any]: ...

    @abc.abstractmethod
    async def describe(self, name: str, version: str = "", customized: bool = False) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def set_default(self, name: str, version: str) -> str: ...


#: the extensions a data plane may offer (TorchServe's is offered beside it: see :class:`TorchServe`)
EXTENSIONS: tuple[type, ...] = (Explains, ModelRepository, Statistics)

#: what a refusal says when the component has nothing more to say (:attr:`DataPlane.refusals`)
REFUSALS: Mapping[type, str] = {
    Explains: "model {model!r} has no explainer configured; run an explainer component for :explain",
    ModelRepository: "{server} has no model repository",
    Statistics: "{server} keeps no inference statistics",
}


# -- what the transports call to ask ----------------------------------------------------------------
# The class is asked, not the instance: what a component offers is its type's to say, and issubclass is
# answered from the ABC cache (under 1 us) where isinstance on a runtime protocol checks every member
# (10-20 us on Python 3.11).
def explainer_of(plane: DataPlane, model: str) -> Explains:
    """``plane`` as the explainer of ``model``, or refused (:func:`refused`)."""
    if issubclass(type(plane), Explains):
        return cast(Explains, plane)
    raise refused(plane, Explains, model)


def repository_of(plane: DataPlane, model: str = "") -> ModelRepository:
    """``plane`` as its model repository (asked about ``model``, when a call names one), or refused."""
    if issubclass(type(plane), ModelRepository):
        return cast(ModelRepository, plane)
    raise refused(plane, ModelRepository, model)


def statistics_of(plane: DataPlane, model: str = "") -> Statistics:
    """``plane`` as its statistics (asked about ``model``, when a call names one), or refused."""
    if issubclass(type(plane), Statistics):
        return cast(Statistics, plane)
    raise refused(plane, Statistics, model)


def refused(plane: DataPlane, extension: type, model: str = "") -> Unsupported:
    """Why ``plane`` does not offer ``extension``: NotFound (raised) for a model it does not know, first."""
    if model:
        plane.model_ready(model)
    why = plane.refusals.get(extension) or REFUSALS[extension]
    return Unsupported(why.format(server=plane.server_metadata().name, model=model))
