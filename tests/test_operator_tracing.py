"""The operator's tracing annotations (docs/operator.md "Tracing"): pure manifest builders, as
tests/test_operator_manifests.py checks them; the servers' side is tests/test_tracing.py."""
from __future__ import annotations

from ovserve.operator import manifests
from ovserve.operator.pods import TRACE_ENDPOINT_ANNOTATION, TRACE_SAMPLE_RATIO_ANNOTATION
from ovserve.operator.validation import validate

from .test_operator_manifests import CFG, load


def env_of(isvc: dict, deployment: str) -> dict[str, str]:
    (child,) = [c for c in manifests.children(validate(isvc), CFG) if c["kind"] == "Deployment"
                and c["metadata"]["name"] == deployment]
    return {v["name"]: v.get("value") for v in child["spec"]["template"]["spec"]["containers"][0].get("env", [])}


def traced(stem: str, **annotations: str) -> dict:
    isvc = load(stem)
    isvc["metadata"].setdefault("annotations", {}).update(annotations)
    return isvc


def test_every_component_gets_opentelemetrys_variables() -> None:
    isvc = traced("transformer", **{TRACE_ENDPOINT_ANNOTATION: "http://collector.obs:4318",
                                    TRACE_SAMPLE_RATIO_ANNOTATION: "0.25"})
    for component in ("predictor", "transformer"):
        env = env_of(isvc, f"classifier-{component}")
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector.obs:4318"
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf" and env["OTEL_TRACES_EXPORTER"] == "otlp"
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio" and env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        assert env["OTEL_SERVICE_NAME"] == f"classifier-{component}"


def test_the_ratio_defaults_to_every_trace_and_the_containers_env_wins() -> None:
    isvc = traced("explainer", **{TRACE_ENDPOINT_ANNOTATION: "http://collector:4318"})
    isvc["spec"]["explainer"]["containers"][0]["env"] = [{"name": "OTEL_SERVICE_NAME", "value": "mine"}]
    env = env_of(isvc, "income-explainer")
    assert env["OTEL_SERVICE_NAME"] == "mine" and env["OTEL_TRACES_SAMPLER_ARG"] == "1"
    assert env_of(isvc, "income-predictor")["OTEL_SERVICE_NAME"] == "income-predictor"


def test_without_the_annotation_nothing_changes() -> None:
    for stem, deployment in (("predictor", "resnet-predictor"), ("transformer", "classifier-transformer")):
        assert not any(name.startswith("OTEL_") for name in env_of(load(stem), deployment))
    # the sample ratio alone turns nothing on
    isvc = traced("predictor", **{TRACE_SAMPLE_RATIO_ANNOTATION: "0.5"})
    assert not any(name.startswith("OTEL_") for name in env_of(isvc, "resnet-predictor"))
