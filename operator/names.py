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

#: KServe's switch for Prometheus scraping, an annotation on the InferenceService (its value "true")
SCRAPE_ANNOTATION = "serving.kserve.io/enable-prometheus-scraping"
#: on a predictor Service whose server serves metrics: what the chart's ServiceMonitor selects
METRICS_LABEL = "ovserve.io/metrics"
METRICS_PATH = "/metrics"
MODEL_MOUNT = "/mnt/models"


#: ``protocolVersion`` values KServe knows (its ``InferenceServiceProtocol``). ovserve serves v1, v2 and
#: grpc-v2 on every predictor; grpc-v1 is also the name KServe's TorchServe runtime gave TorchServe's own
#: gRPC API (its releases 0.9 to 0.11 list it), and asks for the TorchServe listener below.
PROTOCOL_VERSIONS = ("v1", "v2", "grpc-v1", "grpc-v2")
GRPC_H2C = "kubernetes.io/h2c"  # a Service port's appProtocol for gRPC: HTTP/2 without TLS (as KServe sets it)


@dataclass(frozen=True)
class Listener:
    """How one listener of the ovserve server shows in its pod and Service."""

    #: the container and Service port's name (unique in the pod; ``h2c``/``grpc*`` tell gRPC to KServe and Istio)
    port_name: str
    #: its container port unless the spec says otherwise
    default: int
    #: the Service's port
    service_port: int
    #: the `ovserve serve` flag that moves it
    flag: str
    app_protocol: str | None = None
    #: the predictor's ``protocolVersion`` that turns it on; None: every ovserve predictor has it. The
    #: server keeps such a listener off without its flag, so the pod always passes it.
    protocol: str | None = None
    #: the scheme ``ovserve run`` prints its address with
    scheme: str = "http"
    #: what messages call it
    title: str = "REST"


#: The server's listeners by the names it logs them under (``rest listening on ...``, ``ovserve.server.ports``),
#: in the order of a pod's ports. A new listener of the server (metrics, say) is a row here.
LISTENERS = {
    "rest": Listener("http", 8080, 80, "--rest-port"),
    "grpc": Listener("h2c", 8081, 8081, "--grpc-port", GRPC_H2C, scheme="grpc", title="gRPC"),
    # TorchServe's gRPC inference API at TorchServe's own port (its grpc_inference_port, 7070): a
    # TorchServe client keeps its port. Its Service port is 7070 too, as KServe gives every port after the first.
    "ts-inference": Listener("grpc-ts", 7070, 7070, "--ts-inference-port", GRPC_H2C, protocol="grpc-v1",
                             scheme="torchserve-grpc", title="TorchServe gRPC"),
}
REST_PORT = LISTENERS["rest"].default
GRPC_PORT = LISTENERS["grpc"].default


def listeners_for(protocol: str | None) -> list[str]:
    """The listeners an ovserve predictor with this ``protocolVersion`` has, in the order of its ports."""
    return [name for name, listener in LISTENERS.items() if listener.protocol in (None, protocol)]


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
