"""Pure builders: an InferenceService dict -> the Deployments, Services and HPAs it needs.

Nothing here talks to the API. ``children()`` is the whole desired state; the
apply module makes the cluster match it. Input is assumed valid
(``validation.check`` ran first).
"""
from __future__ import annotations

import copy
from typing import Any

from . import names as n
from . import pods, tls
from .config import Config


def owner_reference(isvc: dict[str, Any]) -> dict[str, Any]:
    meta = isvc["metadata"]
    return {"apiVersion": isvc.get("apiVersion", n.API_VERSION), "kind": isvc.get("kind", n.KIND),
            "name": meta["name"], "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def _metadata(isvc: dict[str, Any], name: str, labels: dict[str, Any],
              annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {"name": name, "namespace": isvc["metadata"]["namespace"], "labels": labels,
            "ownerReferences": [owner_reference(isvc)]}
    if annotations:
        meta["annotations"] = annotations
    return meta


def replicas(spec: dict[str, Any]) -> tuple[int, int]:
    """(min, max) replicas; 0 or absent minReplicas is 1, absent maxReplicas is min."""
    low = max(1, int(spec.get("minReplicas") or 1))
    return low, max(low, int(spec.get("maxReplicas") or low))


def autoscaled(spec: dict[str, Any]) -> bool:
    low, high = replicas(spec)
    return high > low


def deployment(isvc: dict[str, Any], component: str, cfg: Config,
               storage_env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    name = isvc["metadata"]["name"]
    spec = isvc["spec"][component]
    labels = n.child_labels(name, component)
    user_labels = dict(spec.get("labels") or {})
    template = {"metadata": {"labels": {**user_labels, **labels}},
                "spec": pods.draining(pods.pod_spec(isvc, component, cfg, storage_env))}
    annotations = {**pods.scrape_annotations(isvc, component), **(spec.get("annotations") or {})}  # the spec's win
    if annotations:
        template["metadata"]["annotations"] = annotations
    body: dict[str, Any] = {"selector": {"matchLabels": n.selector_labels(name, component)}, "template": template}
    if not autoscaled(spec):  # with an HPA, the HPA owns spec.replicas
        body = {"replicas": replicas(spec)[0], **body}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": _metadata(isvc, n.child_name(name, component), {**user_labels, **labels}),
            "spec": body}


def _service_ports(isvc: dict[str, Any], ports: dict[str, int]) -> list[dict[str, Any]]:
    secure = tls.requested(isvc) is not None
    out = []
    for name, port in ports.items():
        listener = n.LISTENERS[name]
        entry: dict[str, Any] = {"name": listener.port_name, "protocol": "TCP", "port": listener.service_port,
                                 "targetPort": port}
        if listener.app_protocol:  # gRPC is marked h2c: HTTP/2 without TLS
            entry["appProtocol"] = listener.app_protocol
        if secure:  # REST at 443 as https, gRPC as h2 (operator/tls.py)
            entry = tls.service_port(entry, grpc=listener.app_protocol is not None)
        out.append(entry)
    return out


def service(isvc: dict[str, Any], component: str) -> dict[str, Any]:
    name = isvc["metadata"]["name"]
    ports = pods.serving_ports(isvc["spec"][component], component)
    labels = n.child_labels(name, component)
    if component == "predictor" and pods.metrics_port(isvc) is not None:
        labels[n.METRICS_LABEL] = "true"  # selected by the chart's ServiceMonitor
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _metadata(isvc, n.child_name(name, component), labels),
            "spec": {"selector": n.selector_labels(name, component), "ports": _service_ports(isvc, ports)}}


def entry_service(isvc: dict[str, Any]) -> dict[str, Any]:
    """``<isvc>``: the InferenceService's own address, routed to the transformer when there is one."""
    name = isvc["metadata"]["name"]
    target = "transformer" if isvc["spec"].get("transformer") else "predictor"
    ports = pods.serving_ports(isvc["spec"][target], target)
    labels = {n.ISVC_LABEL: name, n.MANAGED_BY_LABEL: n.MANAGER}
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(isvc, name, labels),
            "spec": {"selector": n.selector_labels(name, target), "ports": _service_ports(isvc, ports)}}


def hpa(isvc: dict[str, Any], component: str, api_version: str = "autoscaling/v2") -> dict[str, Any] | None:
    """An HPA when maxReplicas > minReplicas (autoscaling/v2 and v2beta2 share this shape)."""
    spec = isvc["spec"][component]
    if not autoscaled(spec):
        return None
    name = isvc["metadata"]["name"]
    low, high = replicas(spec)
    target = {"type": "Utilization", "averageUtilization": int(spec.get("scaleTarget") or 80)}
    return {"apiVersion": api_version, "kind": "HorizontalPodAutoscaler",
            "metadata": _metadata(isvc, n.child_name(name, component), n.child_labels(name, component)),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": n.child_name(name, component)},
                     "minReplicas": low, "maxReplicas": high,
                     "metrics": [{"type": "Resource", "resource": {
                         "name": spec.get("scaleMetric") or "cpu", "target": target}}]}}


def children(isvc: dict[str, Any], cfg: Config, hpa_api_version: str = "autoscaling/v2",
             storage_env: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every child object the InferenceService should have, in apply order; ``storage_env``: the predictor's
    storage initializer's (``credentials.s3_env``)."""
    isvc = copy.deepcopy(isvc)  # builders never share structure with their input
    out: list[dict[str, Any]] = []
    for component in n.present_components(isvc):
        out += [deployment(isvc, component, cfg, storage_env if component == "predictor" else None),
                service(isvc, component)]
        scaler = hpa(isvc, component, hpa_api_version)
        if scaler:
            out.append(scaler)
    out.append(entry_service(isvc))
    return out


def stale(existing: list[dict[str, Any]], desired: list[dict[str, Any]], owner_uid: str) -> list[dict[str, Any]]:
    """Existing children owned by this InferenceService that are no longer desired."""
    wanted = {(o["kind"], o["metadata"]["name"]) for o in desired}
    return [o for o in existing if (o["kind"], o["metadata"]["name"]) not in wanted
            and any(ref.get("uid") == owner_uid for ref in o["metadata"].get("ownerReferences") or [])]
