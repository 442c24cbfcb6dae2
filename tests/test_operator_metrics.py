"""The operator and metrics, in process: a predictor's scrape annotations, --metrics-enable and the
Service label the chart's ServiceMonitor selects (pure builders); the operator's own reconcile counts
and durations (its exposition)."""
from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from ovserve.operator import manifests, metrics
from ovserve.operator import names as n
from ovserve.operator.validation import validate

from .test_operator_manifests import CFG, K8S_VERSIONS, load

SCRAPE = {"prometheus.kserve.io/port": "8080", "prometheus.kserve.io/path": "/metrics",
          "prometheus.io/scrape": "true", "prometheus.io/port": "8080", "prometheus.io/path": "/metrics"}


def children(isvc: dict) -> dict[tuple[str, str], dict]:
    return {(c["kind"], c["metadata"]["name"]): c for c in manifests.children(validate(isvc), CFG)}


def with_metrics(annotation: str | None = "true", args: list[str] | None = None) -> dict:
    isvc = load("predictor")
    if annotation is not None:
        isvc["metadata"].setdefault("annotations", {})[n.SCRAPE_ANNOTATION] = annotation
    if args is not None:
        isvc["spec"]["predictor"]["model"]["args"] = args
    return isvc


def test_no_metrics_by_default() -> None:
    kids = children(load("predictor"))
    dep = kids[("Deployment", "resnet-predictor")]
    assert "annotations" not in dep["spec"]["template"]["metadata"]
    assert "--metrics-enable" not in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert n.METRICS_LABEL not in kids[("Service", "resnet-predictor")]["metadata"]["labels"]


@pytest.mark.parametrize("annotation,args,port,added", [
    ("true", None, "8080", True),  # KServe's annotation: the operator turns them on
    ("True", ["--metrics-list", "ovms_requests_success"], "8080", True),
    (None, ["--metrics-enable"], "8080", False),  # the args turn them on themselves
    (None, ["--metrics_enable", "true"], "8080", False),
    (None, ["--metrics-enable=1", "--metrics-port", "9100"], "9100", False),
    ("true", ["--metrics-port=9100"], "9100", True),
])
def test_metrics_on(annotation: str | None, args: list[str] | None, port: str, added: bool) -> None:
    kids = children(with_metrics(annotation, args))
    dep = kids[("Deployment", "resnet-predictor")]
    expected = {k: (port if k.endswith("/port") else v) for k, v in SCRAPE.items()}
    assert dep["spec"]["template"]["metadata"]["annotations"] == expected
    server_args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert server_args.count("--metrics-enable") == (1 if added else args.count("--metrics-enable") if args else 0)
    assert kids[("Service", "resnet-predictor")]["metadata"]["labels"][n.METRICS_LABEL] == "true"
    assert n.METRICS_LABEL not in kids[("Service", "resnet")]["metadata"]["labels"]  # the entry Service: no
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(dep, version, strict=True)


@pytest.mark.parametrize("annotation,args", [
    ("false", None), (None, ["--metrics-enable", "false"]), (None, ["--metrics_enable=off"]),
])
def test_metrics_off(annotation: str | None, args: list[str] | None) -> None:
    dep = children(with_metrics(annotation, args))[("Deployment", "resnet-predictor")]
    assert "prometheus.io/scrape" not in (dep["spec"]["template"]["metadata"].get("annotations") or {})


def test_the_specs_own_annotations_win() -> None:
    isvc = with_metrics()
    isvc["spec"]["predictor"]["annotations"] = {"prometheus.io/scrape": "false", "team": "ml"}
    meta = children(isvc)[("Deployment", "resnet-predictor")]["spec"]["template"]["metadata"]
    assert meta["annotations"]["prometheus.io/scrape"] == "false"
    assert meta["annotations"]["team"] == "ml" and meta["annotations"]["prometheus.kserve.io/port"] == "8080"


def test_only_ovserve_predictors_and_only_the_predictor() -> None:
    custom = load("custom")
    custom["metadata"]["annotations"] = {n.SCRAPE_ANNOTATION: "true"}
    for (kind, _), child in children(custom).items():
        if kind == "Deployment":
            assert "annotations" not in child["spec"]["template"]["metadata"]
    transformer = load("transformer")
    transformer["metadata"]["annotations"] = {n.SCRAPE_ANNOTATION: "true"}
    kids = children(copy.deepcopy(transformer))
    assert "annotations" not in kids[("Deployment", "classifier-transformer")]["spec"]["template"]["metadata"]
    assert "annotations" in kids[("Deployment", "classifier-predictor")]["spec"]["template"]["metadata"]


def test_the_operators_own_exposition() -> None:
    m = metrics.OperatorMetrics()
    text = m.render().decode()
    for outcome in metrics.OUTCOMES:  # every outcome at 0 from the start
        assert f'ovserve_operator_reconciles_total{{outcome="{outcome}"}} 0' in text
    m.reconciled("ok", 0.02)
    m.reconciled("ok", 0.3)
    m.reconciled("invalid", 0.001)
    text = m.render().decode()
    assert 'ovserve_operator_reconciles_total{outcome="ok"} 2' in text
    assert 'ovserve_operator_reconciles_total{outcome="invalid"} 1' in text
    assert 'ovserve_operator_reconcile_seconds_bucket{le="0.025"} 2' in text
    assert 'ovserve_operator_reconcile_seconds_bucket{le="+Inf"} 3' in text
    assert 'ovserve_operator_reconcile_seconds_count 3' in text
    assert "# TYPE ovserve_operator_reconcile_seconds histogram" in text
