"""Names, labels and addresses shared by the operator's modules (pure)."""
from __future__ import annotations

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
REST_PORT = 8080
GRPC_PORT = 8081
MODEL_MOUNT = "/mnt/models"


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


def present_components(isvc: dict) -> list[str]:
    spec = isvc.get("spec") or {}
    return [c for c in COMPONENTS if spec.get(c)]
