"""Names, labels and addresses shared by the operator's modules (pure)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GROUP = "serving.kserve.io"
VERSION = "v1beta1"
PLURAL = "inferenceservices"
KIND = "InferenceService"
API_VERSION = f"{GROUP}/{VERSION}"

#: Components in the order they are built and reported.
COMPONENTS = ("predictor", "transformer", "explainer")
CONDITION_TYPES = {"predictor": "PredictorReady", "transformer": "TransformerReady", "explainer": "ExplainerReady"}

ISVC_LABEL = "serving.kserve.io/inferenceservice"
COMPONENT_LABEL = "component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGER = "ovserve-operator"

CONTAINER_NAME = "kserve-container"
MODEL_MOUNT = "/mnt/models"


@dataclass(frozen=True)
class Listener:
    """How one listener of the ovserve server shows in its pod and Service."""

    #: the container and Service port's name (``h2c``: HTTP/2 without TLS, how gRPC is marked)
    port_name: str
    #: its container port unless the spec says otherwise
    default: int
    #: the Service's port
    service_port: int
    #: the `ovserve serve` flag that moves it
    flag: str
    app_protocol: str | None = None


#: The server's listeners by the names it logs them under (``rest listening on ...``, ``ovserve.server.ports``),
#: in the order of a pod's ports. A new listener of the server (TorchServe's, metrics) is a row here.
LISTENERS = {
    "rest": Listener("http", 8080, 80, "--rest-port"),
    "grpc": Listener("h2c", 8081, 8081, "--grpc-port", "kubernetes.io/h2c"),
}
REST_PORT = LISTENERS["rest"].default
GRPC_PORT = LISTENERS["grpc"].default


def child_name(isvc_name: str, component: str) -> str:
    """``<isvc>-predictor``: the Deployment, Service and HPA of one component."""
    return f"{isvc_name}-{component}"


def selector_labels(isvc_name: str, component: str) -> dict[str, str]:
    """The labels that select a component's pods (a Deployment's immutable selector)."""
    return {ISVC_LABEL: isvc_name, COMPONENT_LABEL: component}


def child_labels(isvc_name: str, component: str) -> dict[str, str]:
    return {**selector_labels(isvc_name, component), MANAGED_BY_LABEL: MANAGER}


def host(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.svc.cluster.local"


def url(name: str, namespace: str) -> str:
    return f"http://{host(name, namespace)}"


def present_components(isvc: dict[str, Any]) -> list[str]:
    spec = isvc.get("spec") or {}
    return [c for c in COMPONENTS if spec.get(c)]
