"""Metrics through the operator, against a real kube-apiserver: an InferenceService with KServe's
scraping annotation gets a predictor whose server serves metrics, its pods the scrape annotations and its
Service the label the chart's ServiceMonitor selects (as the API server stores them); the operator counts
and times its reconciles at /metrics on --metrics-port."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from ovserve.server.child import free_ports

from . import k8s
from .k8s import ControlPlane
from .k8s_client import (
    Kube,
    Operator,
    deploy_path,
    eventually,
    example,
    isvc_path,
    operator_kubeconfig,
    svc_path,
)

pytestmark = [pytest.mark.operator,
              pytest.mark.skipif(k8s.missing_reason() is not None, reason=k8s.missing_reason() or ""),
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]


@pytest.fixture(scope="module")
def metrics_operator(cluster: ControlPlane, kube: Kube, crd: dict,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Operator, int]]:
    (port,) = free_ports(1)
    op = Operator(operator_kubeconfig(cluster, kube), tmp_path_factory.mktemp("operator-cwd"),
                  "--metrics-port", str(port)).start()
    yield op, port
    op.stop()


def counts(port: int) -> dict[str, float]:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {ln.rpartition(" ")[0]: float(ln.rpartition(" ")[2]) for ln in text.splitlines()
            if ln and not ln.startswith("#")}


def test_scraping_annotation_and_reconcile_metrics(kube: Kube, metrics_operator: tuple[Operator, int],
                                                   ns: str) -> None:
    _, port = metrics_operator
    before = counts(port)
    assert before['ovserve_operator_reconciles_total{outcome="invalid"}'] == 0
    scraped = example("predictor", ns)
    scraped["metadata"]["annotations"] = {"serving.kserve.io/enable-prometheus-scraping": "true"}
    kube.create(isvc_path(ns), scraped)
    plain = example("predictor", ns)
    plain["metadata"]["name"] = "plain"
    kube.create(isvc_path(ns), plain)
    bad = example("predictor", ns)
    bad["metadata"]["name"] = "bad"
    bad["spec"]["predictor"]["model"]["storageUri"] = "hdfs://namenode/model"
    kube.create(isvc_path(ns), bad)

    name = scraped["metadata"]["name"]
    dep = eventually(lambda: kube.get(deploy_path(ns, f"{name}-predictor")), what="predictor Deployment")
    template = dep["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "prometheus.kserve.io/port": "8080", "prometheus.kserve.io/path": "/metrics",
        "prometheus.io/scrape": "true", "prometheus.io/port": "8080", "prometheus.io/path": "/metrics"}
    assert "--metrics-enable" in template["spec"]["containers"][0]["args"]
    service = eventually(lambda: kube.get(svc_path(ns, f"{name}-predictor")), what="predictor Service")
    assert service["metadata"]["labels"]["ovserve.io/metrics"] == "true"
    other = eventually(lambda: kube.get(deploy_path(ns, "plain-predictor")), what="plain Deployment")
    assert "annotations" not in other["spec"]["template"]["metadata"]
    assert "--metrics-enable" not in other["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "ovserve.io/metrics" not in kube.get(svc_path(ns, "plain-predictor"))["metadata"]["labels"]

    def counted() -> dict[str, float] | None:
        now = counts(port)
        ok = 'ovserve_operator_reconciles_total{outcome="ok"}'
        done = now[ok] - before[ok]
        refused = (now['ovserve_operator_reconciles_total{outcome="invalid"}']
                   - before['ovserve_operator_reconciles_total{outcome="invalid"}'])
        return now if done >= 2 and refused >= 1 else None

    now = eventually(counted, what="the reconciles counted")
    total = sum(v for k, v in now.items() if k.startswith("ovserve_operator_reconciles_total"))
    assert now["ovserve_operator_reconcile_seconds_count"] == total
    assert now['ovserve_operator_reconcile_seconds_bucket{le="+Inf"}'] == total
    assert now["ovserve_operator_reconcile_seconds_sum"] > 0
