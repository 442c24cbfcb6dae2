"""The chart's metrics pieces, rendered by the real (pinned) helm: the operator's metrics port and
Service, and ServiceMonitors made only where the cluster serves the Prometheus operator's API (the
chart renders, lints and validates with that API and without it)."""
from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest

from .test_chart import CHART, K8S_VERSIONS, by_kind, deployment, helm, needs_helm, render

pytestmark = pytest.mark.integration

MONITORING = ["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"]
ON = ["--set", "metrics.serviceMonitor.enabled=true"]
OPERATOR = ["--set", "metrics.operator=true"]
#: the fields of monitoring.coreos.com/v1 ServiceMonitor the chart writes, as the Prometheus operator's CRD
#: defines them (spec.selector a LabelSelector, endpoints' port a named Service port); nothing else allowed
SERVICE_MONITOR = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"type": "object", "additionalProperties": False, "properties": {
                    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 1}}},
                "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False, "required": ["port"],
                    "properties": {"port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"},
                                   "interval": {"type": "string", "pattern": "^([0-9]+(ms|s|m|h))+$"}}}},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
            },
        },
    },
}


def validate(docs: list[dict]) -> None:
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            jsonschema.validate(doc, SERVICE_MONITOR)
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


@needs_helm
@pytest.mark.parametrize("values", [ON, ON + OPERATOR, ON + MONITORING, ON + OPERATOR + MONITORING,
                                    OPERATOR + MONITORING,
                                    ON + MONITORING + ["--set", "watchNamespaces={team-a}",
                                                       "--set", "metrics.serviceMonitor.labels.release=prom"]],
                         ids=["on-no-crd", "on-operator-no-crd", "on-crd", "on-operator-crd", "off-crd", "namespaced"])
def test_renders_lints_and_validates(values: list[str]) -> None:
    lint = [v for v in values if v not in MONITORING]  # helm lint takes no --api-versions
    result = helm("lint", "--strict", str(CHART), *lint, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    docs = render(values)
    validate(docs)
    monitors = {d["metadata"]["name"]: d for d in by_kind(docs, "ServiceMonitor")}
    crd = "--api-versions" in values
    on = "metrics.serviceMonitor.enabled=true" in values
    operator = "metrics.operator=true" in values
    expected = {"ovserve-operator-predictors", "ovserve-operator"} if operator else {"ovserve-operator-predictors"}
    assert set(monitors) == (expected if crd and on else set())
    if monitors:
        predictors = monitors["ovserve-operator-predictors"]["spec"]
        # what the operator labels a predictor Service with when its server serves metrics
        assert predictors["selector"]["matchLabels"] == {
            "app.kubernetes.io/managed-by": "ovserve-operator", "component": "predictor", "ovserve.io/metrics": "true"}
        assert predictors["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
        if "watchNamespaces={team-a}" in values:
            assert predictors["namespaceSelector"] == {"matchNames": ["team-a"]}
            assert monitors["ovserve-operator-predictors"]["metadata"]["labels"]["release"] == "prom"
        else:
            assert predictors["namespaceSelector"] == {"any": True}


@needs_helm
def test_operator_metrics_port_and_service() -> None:
    off = deployment(render([]))["spec"]["template"]["spec"]["containers"][0]
    assert not any(a.startswith("--metrics-port") for a in off["args"])
    docs = render(OPERATOR)
    container = deployment(docs)["spec"]["template"]["spec"]["containers"][0]
    assert "--metrics-port=8081" in container["args"]
    assert {"name": "metrics", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    (service,) = by_kind(docs, "Service")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"] == deployment(docs)["spec"]["selector"]["matchLabels"]


@needs_helm
def test_notes_say_why_no_service_monitor_was_made() -> None:
    notes = helm("install", "ovserve", str(CHART), "--dry-run", *ON).stdout
    assert "no monitoring.coreos.com/v1 ServiceMonitor API" in notes


@needs_helm
@pytest.mark.parametrize("values, message", [
    (["--set", "metrics.serviceMonitor.interval=soon"], "interval"),
    (["--set", "metrics.operator=yes"], "operator"),
    (["--set", "metrics.serviceMonitr.enabled=true"], "serviceMonitr"),
])
def test_bad_metrics_values_are_refused(values: list[str], message: str) -> None:
    result = helm("template", "ovserve", str(CHART), *values, check=False)
    assert result.returncode != 0
    assert message in result.stderr
