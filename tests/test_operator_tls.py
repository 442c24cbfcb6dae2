"""The operator's TLS annotations (operator/tls.py): the Secret in every component, the server's TLS
through its environment, probes over TLS, the Services' TLS ports; checked field by field and against
the Kubernetes schemas. What the probes run is run for real in tests/test_tls.py."""
from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from ovserve.operator import manifests, tls
from ovserve.operator.validation import Invalid, check, validate

from .test_operator_manifests import CFG, K8S_VERSIONS, load

SECRET = "classifier-tls"
MOUNT = {"name": "ovserve-tls", "mountPath": "/etc/ovserve/tls", "readOnly": True}
VOLUME = {"name": "ovserve-tls", "secret": {"secretName": SECRET}}
SERVER_ENV = [{"name": "OVSERVE_TLS_CERT", "value": "/etc/ovserve/tls/tls.crt"},
              {"name": "OVSERVE_TLS_KEY", "value": "/etc/ovserve/tls/tls.key"}]
CLIENT_CA_ENV = {"name": "OVSERVE_TLS_CLIENT_CA", "value": "/etc/ovserve/tls/ca.crt"}
PREDICTOR_CA_ENV = {"name": "OVSERVE_PREDICTOR_CA", "value": "/etc/ovserve/tls/ca.crt"}
PREDICTOR_CERT_ENV = [{"name": "OVSERVE_PREDICTOR_CERT", "value": "/etc/ovserve/tls/tls.crt"},
                      {"name": "OVSERVE_PREDICTOR_KEY", "value": "/etc/ovserve/tls/tls.key"}]
#: what every Deployment's main container gets last (operator/pods.py draining): the drain delay, the gRPC age
DRAIN = [{"name": "OVSERVE_DRAIN_DELAY", "value": "5"}, {"name": "OVSERVE_GRPC_MAX_CONNECTION_AGE", "value": "10"}]


def annotated(stem: str, mutual: bool | None = None, secret: str = SECRET) -> dict:
    isvc = load(stem)
    notes = isvc["metadata"].setdefault("annotations", {})
    notes[tls.SECRET_ANNOTATION] = secret
    if mutual is not None:
        notes[tls.CLIENT_AUTH_ANNOTATION] = "true" if mutual else "false"
    return isvc


def children(isvc: dict) -> dict[tuple[str, str], dict]:
    return {(c["kind"], c["metadata"]["name"]): c for c in manifests.children(validate(isvc), CFG)}


def main_container(child: dict) -> dict:
    return child["spec"]["template"]["spec"]["containers"][0]


def test_without_the_annotation_nothing_changes() -> None:
    plain = children(load("transformer"))
    with_false = load("transformer")
    with_false["metadata"]["annotations"] = {"other.example.com/x": "y"}
    assert children(with_false) == plain
    assert "ovserve-tls" not in str(plain)


def test_tls_predictor_mounts_the_secret_serves_https_and_marks_its_ports() -> None:
    kids = children(annotated("predictor"))
    deployment = kids[("Deployment", "resnet-predictor")]
    server = main_container(deployment)
    assert VOLUME in deployment["spec"]["template"]["spec"]["volumes"]
    assert server["volumeMounts"][-1] == MOUNT
    assert server["env"] == [*SERVER_ENV, *DRAIN]
    for probe, path in (("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live"),
                        ("startupProbe", "/v2/health/ready")):
        assert server[probe]["httpGet"] == {"path": path, "port": "http", "scheme": "HTTPS"}
    for service in ("resnet-predictor", "resnet"):
        assert kids[("Service", service)]["spec"]["ports"] == [
            {"name": "http", "protocol": "TCP", "port": 443, "targetPort": 8080, "appProtocol": "https"},
            {"name": "h2c", "protocol": "TCP", "port": 8081, "targetPort": 8081, "appProtocol": "h2"}]


def test_tls_torchserve_port_is_marked_h2_too() -> None:
    ports = children(annotated("torchserve"))[("Service", "pets-predictor")]["spec"]["ports"]
    assert ports[2] == {"name": "grpc-ts", "protocol": "TCP", "port": 7070, "targetPort": 7070, "appProtocol": "h2"}


def test_tls_transformer_verifies_its_predictor_with_the_secrets_ca() -> None:
    kids = children(annotated("transformer"))
    transformer = main_container(kids[("Deployment", "classifier-transformer")])
    assert transformer["env"] == [*SERVER_ENV, PREDICTOR_CA_ENV, *DRAIN]
    assert transformer["volumeMounts"] == [MOUNT]
    assert VOLUME in kids[("Deployment", "classifier-transformer")]["spec"]["template"]["spec"]["volumes"]
    assert "readinessProbe" not in transformer  # a user's container keeps its own probes (none here)
    # the predictor keeps its own variables after the operator's
    predictor = main_container(kids[("Deployment", "classifier-predictor")])
    assert predictor["env"] == [*SERVER_ENV, {"name": "OVSERVE_LOG_LEVEL", "value": "debug"}, *DRAIN]
    assert kids[("Service", "classifier")]["spec"]["ports"] == [
        {"name": "http", "protocol": "TCP", "port": 443, "targetPort": 8080, "appProtocol": "https"}]


def test_mutual_tls_demands_client_certificates_and_probes_from_inside_the_pod() -> None:
    kids = children(annotated("transformer", mutual=True))
    transformer = main_container(kids[("Deployment", "classifier-transformer")])
    assert transformer["env"] == [*SERVER_ENV, CLIENT_CA_ENV, PREDICTOR_CA_ENV, *PREDICTOR_CERT_ENV, *DRAIN]
    predictor = main_container(kids[("Deployment", "classifier-predictor")])
    assert predictor["env"][:3] == [*SERVER_ENV, CLIENT_CA_ENV]
    for name, path, period, failures in (("readinessProbe", "/v2/health/ready", 5, 3),
                                         ("livenessProbe", "/v2/health/live", 10, 3),
                                         ("startupProbe", "/v2/health/ready", 5, 120)):
        probe = predictor[name]
        assert "httpGet" not in probe
        assert (probe["periodSeconds"], probe["failureThreshold"]) == (period, failures)
        command = probe["exec"]["command"]
        assert command[:2] == ["python", "-c"]
        assert f"'https://127.0.0.1:8080{path}'" in command[2]
        assert "load_cert_chain('/etc/ovserve/tls/tls.crt', '/etc/ovserve/tls/tls.key')" in command[2]


def test_the_probe_follows_a_moved_rest_port() -> None:
    kids = children(annotated("autoscale", mutual=True))
    probe = main_container(kids[("Deployment", "busy-predictor")])["readinessProbe"]
    assert "'https://127.0.0.1:9080/v2/health/ready'" in probe["exec"]["command"][2]


def test_a_variable_the_spec_sets_wins() -> None:
    isvc = annotated("predictor")
    isvc["spec"]["predictor"]["model"]["env"] = [{"name": "OVSERVE_TLS_CERT", "value": "/elsewhere/cert.pem"}]
    server = main_container(children(isvc)[("Deployment", "resnet-predictor")])
    assert server["env"] == [SERVER_ENV[1], {"name": "OVSERVE_TLS_CERT", "value": "/elsewhere/cert.pem"}, *DRAIN]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("stem", ["predictor", "transformer", "explainer", "custom", "torchserve"])
@pytest.mark.parametrize("mutual", [False, True])
def test_every_tls_child_is_valid_kubernetes(stem: str, mutual: bool, version: str) -> None:
    for child in manifests.children(validate(annotated(stem, mutual)), CFG):
        kubernetes_validate.validate(child, version, strict=True)


def test_tls_builders_are_pure() -> None:
    isvc = annotated("transformer", mutual=True)
    before = copy.deepcopy(isvc)
    first = manifests.children(validate(isvc), CFG)
    assert isvc == before and manifests.children(validate(isvc), CFG) == first


@pytest.mark.parametrize("notes, field, words", [
    ({tls.CLIENT_AUTH_ANNOTATION: "true"}, tls.CLIENT_AUTH_ANNOTATION, "give serving.ovserve.io/tls-secret too"),
    ({tls.SECRET_ANNOTATION: "Not_A_Name"}, tls.SECRET_ANNOTATION, "is not a Secret's name"),
    ({tls.SECRET_ANNOTATION: "ok", tls.CLIENT_AUTH_ANNOTATION: "maybe"}, tls.CLIENT_AUTH_ANNOTATION,
     "is not true or false"),
])
def test_bad_annotations_are_an_invalid_spec(notes: dict, field: str, words: str) -> None:
    isvc = load("predictor")
    isvc["metadata"]["annotations"] = notes
    with pytest.raises(Invalid) as info:
        check(isvc)
    assert info.value.field == f"metadata.annotations[{field}]" and words in info.value.reason


def test_the_tls_volume_name_is_reserved() -> None:
    isvc = annotated("predictor")
    isvc["spec"]["predictor"]["volumes"] = [{"name": "ovserve-tls", "emptyDir": {}}]
    with pytest.raises(Invalid, match="ovserve-tls"):
        check(isvc)


@pytest.mark.parametrize("args, scheme", [
    ([], "https"),
    (["--metrics-port", "9090"], "https"),
    (["--metrics-port", "9090", "--metrics-tls", "off"], None),  # Prometheus scrapes that port in plain text
    (["--rest-tls", "off"], None),
    (["--metrics-port", "9090", "--rest-tls", "off"], "https"),
])
def test_scrape_annotations_say_https_when_the_metrics_serve_tls(args: list[str], scheme: str | None) -> None:
    isvc = annotated("predictor")
    isvc["metadata"]["annotations"]["serving.kserve.io/enable-prometheus-scraping"] = "true"
    isvc["spec"]["predictor"]["model"]["args"] = args
    notes = children(isvc)[("Deployment", "resnet-predictor")]["spec"]["template"]["metadata"]["annotations"]
    assert notes.get("prometheus.io/scheme") == scheme
    assert notes["prometheus.io/scrape"] == "true"


def test_no_scheme_without_tls() -> None:
    isvc = load("predictor")
    isvc["metadata"]["annotations"] = {"serving.kserve.io/enable-prometheus-scraping": "true"}
    notes = children(isvc)[("Deployment", "resnet-predictor")]["spec"]["template"]["metadata"]["annotations"]
    assert "prometheus.io/scheme" not in notes
