"""Pure builders: an InferenceService's typed spec -> the Deployments, Services and HPAs it needs.

Nothing here talks to the API. ``children()`` is the whole desired state; the
apply module makes the cluster match it. Input is the spec ``validation.validate``
returned (so it is valid), never the raw dict.
"""
from __future__ import annotations

from typing import Any

from . import names as n
from . import pods, tls
from .config import Config
from .credentials import StorageAccess
from .spec import ComponentSpec, InferenceServiceSpec, thaw


def owner_reference(spec: InferenceServiceSpec) -> dict[str, Any]:
    return {"apiVersion": thaw(spec.api_version), "kind": thaw(spec.kind),
            "name": spec.name, "uid": spec.placed("uid"), "controller": True, "blockOwnerDeletion": True}


def _metadata(spec: InferenceServiceSpec, name: str, labels: dict[str, Any],
              annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {"name": name, "namespace": spec.placed("namespace"), "labels": labels,
            "ownerReferences": [owner_reference(spec)]}
    if annotations:
        meta["annotations"] = annotations
    return meta


def deployment(spec: InferenceServiceSpec, component: str, cfg: Config,
               storage_access: StorageAccess | None = None) -> dict[str, Any]:
    own = spec.components[component]
    labels = n.child_labels(spec.name, component)
    user_labels = dict(own.labels)
    template = {"metadata": {"labels": {**user_labels, **labels}},
                "spec": pods.draining(pods.pod_spec(spec, component, cfg, storage_access))}
    annotations = {**pods.scrape_annotations(spec, component), **own.annotations}  # the spec's win
    if annotations:
        template["metadata"]["annotations"] = annotations
    body: dict[str, Any] = {"selector": {"matchLabels": n.selector_labels(spec.name, component)},
                            "template": template}
    if not own.autoscaled:  # with an HPA, the HPA owns spec.replicas
        body = {"replicas": own.min_replicas, **body}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": _metadata(spec, n.child_name(spec.name, component), {**user_labels, **labels}),
            "spec": body}


def _service_ports(spec: InferenceServiceSpec, ports: dict[str, int]) -> list[dict[str, Any]]:
    out = []
    for name, port in ports.items():
        listener = n.LISTENERS[name]
        entry: dict[str, Any] = {"name": listener.port_name, "protocol": "TCP", "port": listener.service_port,
                                 "targetPort": port}
        if listener.app_protocol:  # gRPC is marked h2c: HTTP/2 without TLS
            entry["appProtocol"] = listener.app_protocol
        if spec.tls is not None:  # REST at 443 as https, gRPC as h2 (operator/tls.py)
            entry = tls.service_port(entry, grpc=listener.app_protocol is not None)
        out.append(entry)
    return out


def service(spec: InferenceServiceSpec, component: str) -> dict[str, Any]:
    labels = n.child_labels(spec.name, component)
    if component == "predictor" and pods.metrics_port(spec) is not None:
        labels[n.METRICS_LABEL] = "true"  # selected by the chart's ServiceMonitor
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _metadata(spec, n.child_name(spec.name, component), labels),
            "spec": {"selector": n.selector_labels(spec.name, component),
                     "ports": _service_ports(spec, dict(spec.components[component].ports))}}


def entry_service(spec: InferenceServiceSpec) -> dict[str, Any]:
    """``<isvc>``: the InferenceService's own address, routed to the transformer when there is one."""
    labels = {n.ISVC_LABEL: spec.name, n.MANAGED_BY_LABEL: n.MANAGER}
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(spec, spec.name, labels),
            "spec": {"selector": n.selector_labels(spec.name, spec.entry),
                     "ports": _service_ports(spec, dict(spec.components[spec.entry].ports))}}


def hpa(spec: InferenceServiceSpec, component: str, api_version: str = "autoscaling/v2") -> dict[str, Any] | None:
    """An HPA when maxReplicas > minReplicas (autoscaling/v2 and v2beta2 share this shape)."""
    own: ComponentSpec = spec.components[component]
    if not own.autoscaled:
        return None
    target = {"type": "Utilization", "averageUtilization": own.scale_target}
    return {"apiVersion": api_version, "kind": "HorizontalPodAutoscaler",
            "metadata": _metadata(spec, n.child_name(spec.name, component), n.child_labels(spec.name, component)),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": n.child_name(spec.name, component)},
                     "minReplicas": own.min_replicas, "maxReplicas": own.max_replicas,
                     "metrics": [{"type": "Resource", "resource": {"name": own.scale_metric, "target": target}}]}}


def children(spec: InferenceServiceSpec, cfg: Config, hpa_api_version: str = "autoscaling/v2",
             storage_access: StorageAccess | None = None) -> list[dict[str, Any]]:
    """Every child object the InferenceService should have, in apply order; ``storage_access``: the predictor's
    storage initializer's credentials (``credentials.storage_access``). Built objects share nothing with
    ``spec`` or each other."""
    out: list[dict[str, Any]] = []
    for component in spec.components:
        out += [deployment(spec, component, cfg, storage_access if component == "predictor" else None),
                service(spec, component)]
        scaler = hpa(spec, component, hpa_api_version)
        if scaler:
            out.append(scaler)
    out.append(entry_service(spec))
    return out


def stale(existing: list[dict[str, Any]], desired: list[dict[str, Any]], owner_uid: str) -> list[dict[str, Any]]:
    """Existing children owned by this InferenceService that are no longer desired."""
    wanted = {(o["kind"], o["metadata"]["name"]) for o in desired}
    return [o for o in existing if (o["kind"], o["metadata"]["name"]) not in wanted
            and any(ref.get("uid") == owner_uid for ref in o["metadata"].get("ownerReferences") or [])]
