"""The InferenceService as the builders read it: typed and immutable, parsed once (pure).

``validation.validate(isvc)`` checks the raw InferenceService and returns an
:class:`InferenceServiceSpec`; every builder (``manifests``, ``pods``, ``credentials``,
``ovserve run``'s planner) takes that instead of the dict, so each
field is read, defaulted and parsed (the ``storageUri`` into its :class:`StoragePlan`,
the TLS annotations into a :class:`Tls`, the serving ports) in one place. What the
operator passes through to the pods as written (the user's containers, volumes, env,
resources and the pod fields of ``pods.POD_FIELDS``) is kept as frozen JSON
(:func:`freeze`: mappings become read-only, lists tuples); :func:`thaw` gives a
builder a fresh, mutable copy, so built objects share nothing with the spec.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .storage_uri import StoragePlan
from .tls import Tls

#: A frozen JSON value: a read-only mapping, a tuple, or a scalar as the document had it.
Json = Any
#: A JSON object's fields, frozen or not (a port as declared, say)
Fields = Mapping[str, Any]


def freeze(value: object) -> Json:
    """``value`` with every dict read-only and every list a tuple (scalars as they are), order kept."""
    if isinstance(value, dict):
        return MappingProxyType({key: freeze(item) for key, item in value.items()})
    if isinstance(value, list):
        return tuple(freeze(item) for item in value)
    return value


def thaw(value: Json) -> Any:
    """A fresh mutable copy of a frozen value (:func:`freeze` undone): mappings dicts, tuples lists."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [thaw(item) for item in value]
    return value


@dataclass(frozen=True)
class ModelSpec:
    """A predictor's ``model``: what the ovserve server container is built from."""

    format: str  # modelFormat.name (openvino or onnx, any case)
    storage_uri: str
    storage: StoragePlan  # where the storage initializer fetches the model from, or the claim mounted
    protocol_version: str | None
    name: str  # the container's name; "" when not given
    image: str  # "" when not given: the operator's image
    image_pull_policy: str  # "" when not given
    args: tuple[str, ...]  # appended to the server's own
    env: tuple[Json, ...]
    resources: Mapping[str, Json]
    ports: tuple[Mapping[str, Json], ...]  # as declared: each moves one listener (``pods.listener_of``)


@dataclass(frozen=True)
class ComponentSpec:
    """One of predictor, transformer and explainer."""

    component: str
    #: replicas (0 or absent minReplicas is 1, absent maxReplicas is min): an HPA when max > min
    min_replicas: int
    max_replicas: int
    scale_target: int  # the HPA's averageUtilization (80 when not given)
    scale_metric: str  # cpu or memory
    labels: Mapping[str, str]  # on the pods and the Deployment
    annotations: Mapping[str, str]  # on the pods
    #: a predictor's ``model`` (the ovserve server runs it), None when the user's containers run
    model: ModelSpec | None
    containers: tuple[Mapping[str, Json], ...]  # the user's, () for a model
    volumes: tuple[Mapping[str, Json], ...]  # the user's
    pod_fields: Mapping[str, Json]  # the ``pods.POD_FIELDS`` it gives (non-empty), in that order
    service_account: str  # the ServiceAccount its pods run under ("default" when not given)
    #: the main container's ports by listener (``rest``, ``grpc``, ``ts-inference``), in the pod's order
    ports: Mapping[str, int]

    @property
    def autoscaled(self) -> bool:
        return self.max_replicas > self.min_replicas


@dataclass(frozen=True)
class InferenceServiceSpec:
    """A valid InferenceService, as the builders need it."""

    name: str
    #: set by the API server (and by ``ovserve run``); None when the document has none, or null: ``placed``
    namespace: str | None
    uid: str | None
    unset: tuple[str, ...]  # which of namespace and uid the document has no key for
    api_version: Json  # the document's (``serving.kserve.io/v1beta1`` when absent): the children's owner
    kind: Json
    labels: Json  # the InferenceService's own metadata, frozen as given
    annotations: Json
    tls: Tls | None  # ``serving.ovserve.io/tls-secret`` and ``tls-client-auth`` (operator/tls.py)
    scrape: bool  # KServe's ``serving.kserve.io/enable-prometheus-scraping: "true"``
    #: the components present, predictor first (``names.COMPONENTS`` order)
    components: Mapping[str, ComponentSpec]

    def placed(self, key: str) -> str | None:
        """``namespace`` or ``uid``, which the API server sets (and ``ovserve run``) and the builders need for
        the children's metadata, owner reference and the predictor's address: KeyError when the document has
        no such key, as indexing it did (an explicit null stays None)."""
        if key in self.unset:
            raise KeyError(key)
        return self.namespace if key == "namespace" else self.uid

    @property
    def predictor(self) -> ComponentSpec:
        return self.components["predictor"]

    @property
    def entry(self) -> str:
        """The component the InferenceService's own address routes to: the transformer when there is one."""
        return "transformer" if "transformer" in self.components else "predictor"
