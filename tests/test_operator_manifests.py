"""The pure builders: example InferenceServices -> children, checked field by field
and validated against the Kubernetes schemas (strict) of several versions."""
from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ovserve.operator import manifests
from ovserve.operator.config import Config
from ovserve.operator.storage_uri import plan as storage_plan
from ovserve.operator.validation import validate

DATA = Path(__file__).parent / "data/isvc"
EXAMPLES = sorted(p.stem for p in DATA.glob("*.yaml"))
K8S_VERSIONS = ["1.25", "1.28", "1.31", "1.34", "1.37"]
CFG = Config(image="registry.example.com/ovserve:0.1.0", image_pull_policy="IfNotPresent")


def load(stem: str, namespace: str = "ml") -> dict:
    isvc = yaml.safe_load((DATA / f"{stem}.yaml").read_text())
    isvc["metadata"].update(namespace=namespace, uid=f"uid-{stem}", generation=1)
    return isvc


def build(stem: str, hpa_version: str = "autoscaling/v2") -> dict[tuple[str, str], dict]:
    return {(c["kind"], c["metadata"]["name"]): c for c in manifests.children(validate(load(stem)), CFG, hpa_version)}


def dig(obj: object, path: str) -> object:
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        obj = obj[int(part[1:-1])] if part.startswith("[") else obj[part]  # type: ignore[index]
    return obj


D, S, H = "Deployment", "Service", "HorizontalPodAutoscaler"
CHILDREN = {
    "predictor": {(D, "resnet-predictor"), (S, "resnet-predictor"), (S, "resnet")},
    "transformer": {(D, "classifier-predictor"), (S, "classifier-predictor"), (D, "classifier-transformer"),
                    (S, "classifier-transformer"), (S, "classifier")},
    "explainer": {(D, "income-predictor"), (S, "income-predictor"), (D, "income-explainer"),
                  (S, "income-explainer"), (S, "income")},
    "autoscale": {(D, "busy-predictor"), (S, "busy-predictor"), (H, "busy-predictor"), (S, "busy")},
    "custom": {(D, "custom-predictor"), (S, "custom-predictor"), (S, "custom")},
    "torchserve": {(D, "pets-predictor"), (S, "pets-predictor"), (S, "pets")},
}
POD = "spec.template.spec"
SERVER = f"{POD}.containers[0]"
#: what every Deployment's main container gets last (operator/pods.py draining): the drain delay, the gRPC age
DRAIN = [{"name": "OVSERVE_DRAIN_DELAY", "value": "5"}, {"name": "OVSERVE_GRPC_MAX_CONNECTION_AGE", "value": "10"}]
# (example, (kind, name), path, expected)
FACTS = [
    ("predictor", (D, "resnet-predictor"), f"{SERVER}.command", ["ovserve"]),
    ("predictor", (D, "resnet-predictor"), f"{SERVER}.args",
     ["serve", "--model-name", "resnet", "--model-path", "/mnt/models"]),
    ("predictor", (D, "resnet-predictor"), f"{SERVER}.name", "kserve-container"),
    ("predictor", (D, "resnet-predictor"), f"{SERVER}.image", CFG.image),
    ("predictor", (D, "resnet-predictor"), f"{SERVER}.ports",
     [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
      {"name": "h2c", "containerPort": 8081, "protocol": "TCP"}]),
    ("predictor", (D, "resnet-predictor"), f"{SERVER}.readinessProbe.httpGet",
     {"path": "/v2/health/ready", "port": "http"}),
    ("predictor", (D, "resnet-predictor"), f"{SERVER}.livenessProbe.httpGet",
     {"path": "/v2/health/live", "port": "http"}),
    ("predictor", (D, "resnet-predictor"), f"{SERVER}.startupProbe.failureThreshold", 120),
    ("predictor", (D, "resnet-predictor"), f"{SERVER}.volumeMounts",
     [{"name": "ovserve-models", "mountPath": "/mnt/models", "readOnly": True}]),
    ("predictor", (D, "resnet-predictor"), f"{POD}.initContainers[0].command",
     ["ovserve", "storage-initializer", "https://models.example.com/resnet.tar.gz", "/mnt/models"]),
    ("predictor", (D, "resnet-predictor"), f"{POD}.initContainers[0].image", CFG.image),
    ("predictor", (D, "resnet-predictor"), f"{POD}.volumes", [{"name": "ovserve-models", "emptyDir": {}}]),
    ("predictor", (D, "resnet-predictor"), "spec.replicas", 1),
    ("predictor", (D, "resnet-predictor"), "spec.selector.matchLabels",
     {"serving.kserve.io/inferenceservice": "resnet", "component": "predictor"}),
    ("predictor", (S, "resnet-predictor"), "spec.ports",
     [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
      {"name": "h2c", "protocol": "TCP", "port": 8081, "targetPort": 8081, "appProtocol": "kubernetes.io/h2c"}]),
    ("predictor", (S, "resnet"), "spec.selector",
     {"serving.kserve.io/inferenceservice": "resnet", "component": "predictor"}),
    ("transformer", (D, "classifier-transformer"), f"{SERVER}.args",
     ["--http_port", "8080", "--model_name", "classifier", "--predictor_host", "classifier-predictor.ml"]),
    ("transformer", (D, "classifier-transformer"), f"{SERVER}.resources",
     {"requests": {"cpu": "100m", "memory": "256Mi"}}),
    ("transformer", (D, "classifier-transformer"), f"{SERVER}.ports",
     [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]),
    ("transformer", (D, "classifier-predictor"), f"{SERVER}.args",
     ["serve", "--model-name", "classifier", "--model-path", "/mnt/models", "--nireq", "2"]),
    # the user's env, then the drain delay and the gRPC connections' age the operator's pods get (issue 35)
    ("transformer", (D, "classifier-predictor"), f"{SERVER}.env",
     [{"name": "OVSERVE_LOG_LEVEL", "value": "debug"}, *DRAIN]),
    ("transformer", (D, "classifier-predictor"), f"{POD}.terminationGracePeriodSeconds", 40),
    ("transformer", (D, "classifier-transformer"), f"{SERVER}.env", DRAIN),
    ("transformer", (D, "classifier-transformer"), f"{POD}.terminationGracePeriodSeconds", 40),
    ("transformer", (D, "classifier-predictor"), f"{SERVER}.resources.limits", {"cpu": "2", "memory": "2Gi"}),
    ("transformer", (S, "classifier"), "spec.selector",
     {"serving.kserve.io/inferenceservice": "classifier", "component": "transformer"}),
    ("transformer", (S, "classifier"), "spec.ports",
     [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}]),
    ("explainer", (D, "income-predictor"), f"{SERVER}.args",
     ["serve", "--model-name", "income", "--model-path", "/mnt/pvc/income/v3"]),
    ("explainer", (D, "income-predictor"), f"{POD}.volumes",
     [{"name": "ovserve-model-pvc", "persistentVolumeClaim": {"claimName": "model-store", "readOnly": True}}]),
    ("explainer", (D, "income-predictor"), f"{SERVER}.volumeMounts",
     [{"name": "ovserve-model-pvc", "mountPath": "/mnt/pvc", "readOnly": True}]),
    ("explainer", (D, "income-predictor"), f"{POD}.serviceAccountName", "models-reader"),
    ("explainer", (D, "income-predictor"), f"{POD}.nodeSelector", {"kubernetes.io/arch": "amd64"}),
    ("explainer", (D, "income-predictor"), f"{POD}.tolerations[0].key", "dedicated"),
    ("explainer", (D, "income-explainer"), f"{SERVER}.args",
     ["--model_name", "income", "--predictor_host", "income-predictor.ml", "--http_port", "9000"]),
    ("explainer", (S, "income-explainer"), "spec.ports[0].targetPort", 9000),
    ("explainer", (S, "income"), "spec.selector.component", "predictor"),
    ("autoscale", (H, "busy-predictor"), "spec.minReplicas", 2),
    ("autoscale", (H, "busy-predictor"), "spec.maxReplicas", 6),
    ("autoscale", (H, "busy-predictor"), "spec.scaleTargetRef",
     {"apiVersion": "apps/v1", "kind": "Deployment", "name": "busy-predictor"}),
    ("autoscale", (H, "busy-predictor"), "spec.metrics",
     [{"type": "Resource",
       "resource": {"name": "memory", "target": {"type": "Utilization", "averageUtilization": 70}}}]),
    ("autoscale", (D, "busy-predictor"), "spec.template.metadata.labels.team", "vision"),
    ("autoscale", (D, "busy-predictor"), "spec.template.metadata.annotations", {"prometheus.io/scrape": "true"}),
    ("autoscale", (D, "busy-predictor"), f"{SERVER}.args",
     ["serve", "--model-name", "busy", "--model-path", "/mnt/models", "--rest-port", "9080", "--grpc-port", "9081"]),
    ("autoscale", (D, "busy-predictor"), f"{POD}.volumes[1]",
     {"name": "ovserve-model-source", "hostPath": {"path": "/srv/models/busy"}}),
    ("autoscale", (D, "busy-predictor"), f"{POD}.initContainers[0].command",
     ["ovserve", "storage-initializer", "/mnt/source/busy", "/mnt/models"]),
    ("autoscale", (S, "busy-predictor"), "spec.ports[1].targetPort", 9081),
    ("custom", (D, "custom-predictor"), "spec.replicas", 1),
    ("custom", (D, "custom-predictor"), f"{SERVER}.readinessProbe", {"httpGet": {"path": "/ready", "port": 8080}}),
    ("custom", (D, "custom-predictor"), f"{SERVER}.image", "example.com/my-server:3"),
    ("custom", (S, "custom-predictor"), "spec.ports",
     [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}]),
    # protocolVersion grpc-v1: TorchServe's gRPC inference API at TorchServe's port, always turned on by its flag
    # (the server has it off without), before the user's args; the KServe ports and probes as for every predictor
    ("torchserve", (D, "pets-predictor"), f"{SERVER}.args",
     ["serve", "--model-name", "pets", "--model-path", "/mnt/models", "--ts-inference-port", "7070", "--nireq", "4"]),
    ("torchserve", (D, "pets-predictor"), f"{SERVER}.ports",
     [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
      {"name": "h2c", "containerPort": 8081, "protocol": "TCP"},
      {"name": "grpc-ts", "containerPort": 7070, "protocol": "TCP"}]),
    ("torchserve", (D, "pets-predictor"), f"{SERVER}.readinessProbe.httpGet",
     {"path": "/v2/health/ready", "port": "http"}),
    ("torchserve", (D, "pets-predictor"), f"{SERVER}.startupProbe.httpGet",
     {"path": "/v2/health/ready", "port": "http"}),
    ("torchserve", (S, "pets-predictor"), "spec.ports",
     [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
      {"name": "h2c", "protocol": "TCP", "port": 8081, "targetPort": 8081, "appProtocol": "kubernetes.io/h2c"},
      {"name": "grpc-ts", "protocol": "TCP", "port": 7070, "targetPort": 7070, "appProtocol": "kubernetes.io/h2c"}]),
    ("torchserve", (S, "pets"), "spec.ports[2]",
     {"name": "grpc-ts", "protocol": "TCP", "port": 7070, "targetPort": 7070, "appProtocol": "kubernetes.io/h2c"}),
]


@pytest.mark.parametrize("stem", EXAMPLES)
def test_children_names_and_kinds(stem: str) -> None:
    assert set(build(stem)) == CHILDREN[stem]


@pytest.mark.parametrize("stem,key,path,expected", FACTS, ids=[f"{f[0]}-{f[1][1]}-{f[2]}" for f in FACTS])
def test_fact(stem: str, key: tuple[str, str], path: str, expected: object) -> None:
    assert dig(build(stem)[key], path) == expected


def test_autoscaled_deployment_leaves_replicas_to_the_hpa() -> None:
    assert "replicas" not in build("autoscale")[(D, "busy-predictor")]["spec"]


@pytest.mark.parametrize("stem", EXAMPLES)
def test_owner_references_and_labels(stem: str) -> None:
    isvc = load(stem)
    for (kind, name), child in build(stem).items():
        meta = child["metadata"]
        assert meta["namespace"] == "ml"
        assert meta["ownerReferences"] == [{"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
                                            "name": isvc["metadata"]["name"], "uid": f"uid-{stem}",
                                            "controller": True, "blockOwnerDeletion": True}]
        assert meta["labels"]["serving.kserve.io/inferenceservice"] == isvc["metadata"]["name"]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "ovserve-operator"
        if kind == D:
            component = name.rsplit("-", 1)[1]
            for labels in (meta["labels"], child["spec"]["template"]["metadata"]["labels"]):
                assert labels["component"] == component


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("stem", EXAMPLES)
def test_every_child_is_valid_kubernetes(stem: str, version: str) -> None:
    for child in build(stem).values():
        kubernetes_validate.validate(child, version, strict=True)


def test_hpa_v2beta2_for_older_clusters() -> None:
    scaler = build("autoscale", "autoscaling/v2beta2")[(H, "busy-predictor")]
    assert scaler["apiVersion"] == "autoscaling/v2beta2"
    kubernetes_validate.validate(scaler, "1.25", strict=True)  # the last schema set with v2beta2


def test_strict_validation_catches_a_broken_child() -> None:
    child = build("predictor")[(D, "resnet-predictor")]
    child["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["verb"] = "GET"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(child, "1.31", strict=True)


@pytest.mark.parametrize("stem", EXAMPLES)
def test_builders_are_pure(stem: str) -> None:
    isvc = load(stem)
    before = copy.deepcopy(isvc)
    first = manifests.children(validate(isvc), CFG)
    assert isvc == before
    assert manifests.children(validate(isvc), CFG) == first
    first[0]["metadata"]["labels"]["x"] = "y"  # results share nothing with later results
    assert "x" not in manifests.children(validate(isvc), CFG)[0]["metadata"]["labels"]



def test_the_spec_is_read_once_and_frozen() -> None:
    """validate() reads the document into an immutable spec: changing the document afterwards changes
    nothing built from it, and neither the spec nor what it passes through can be changed in place."""
    isvc = load("transformer")
    spec = validate(isvc)
    first = manifests.children(spec, CFG)
    isvc["metadata"]["name"] = "other"
    isvc["spec"]["transformer"]["containers"][0]["args"].append("--changed")
    assert manifests.children(spec, CFG) == first
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]
    transformer = spec.components["transformer"]
    with pytest.raises(TypeError):
        transformer.containers[0]["image"] = "other"  # type: ignore[index]
    with pytest.raises(AttributeError):
        transformer.containers[0]["args"].append("--changed")
    assert spec.predictor.model is not None and spec.predictor.model.storage == storage_plan(
        isvc["spec"]["predictor"]["model"]["storageUri"])

def test_user_wiring_flags_win() -> None:
    isvc = load("transformer")
    isvc["spec"]["transformer"]["containers"][0]["args"] = ["--predictor_host=elsewhere:80", "--model_name", "m"]
    deployment = {(c["kind"], c["metadata"]["name"]): c
                  for c in manifests.children(validate(isvc), CFG)}[(D, "classifier-transformer")]
    assert dig(deployment,
               f"{SERVER}.args") == ["--predictor_host=elsewhere:80", "--model_name", "m", "--http_port", "8080"]


def test_user_wiring_flags_win_in_dashed_spelling_too() -> None:
    isvc = load("transformer")
    isvc["spec"]["transformer"]["containers"][0]["args"] = ["--predictor-host", "elsewhere:80", "--model-name=m",
                                                            "--http-port", "9"]
    deployment = {(c["kind"], c["metadata"]["name"]): c
                  for c in manifests.children(validate(isvc), CFG)}[(D, "classifier-transformer")]
    assert dig(deployment,
               f"{SERVER}.args") == ["--predictor-host", "elsewhere:80", "--model-name=m", "--http-port", "9"]


@pytest.mark.parametrize("protocol", [None, "v1", "v2", "grpc-v2"])
def test_only_grpc_v1_gets_the_torchserve_port(protocol: str | None) -> None:
    isvc = load("torchserve")
    isvc["spec"]["predictor"]["model"]["protocolVersion"] = protocol
    kids = {(c["kind"], c["metadata"]["name"]): c for c in manifests.children(validate(isvc), CFG)}
    container = dig(kids[(D, "pets-predictor")], SERVER)
    assert "--ts-inference-port" not in container["args"]
    assert [p["name"] for p in container["ports"]] == ["http", "h2c"]
    assert [p["port"] for p in dig(kids[(S, "pets-predictor")], "spec.ports")] == [80, 8081]


def test_the_torchserve_port_moves_with_a_port_named_grpc_ts() -> None:
    isvc = load("torchserve")
    isvc["spec"]["predictor"]["model"]["ports"] = [{"name": "grpc-ts", "containerPort": 7080},
                                                   {"name": "h2c", "containerPort": 9000}]
    kids = {(c["kind"], c["metadata"]["name"]): c for c in manifests.children(validate(isvc), CFG)}
    container = dig(kids[(D, "pets-predictor")], SERVER)
    assert container["args"][5:9] == ["--grpc-port", "9000", "--ts-inference-port", "7080"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http", 8080), ("h2c", 9000),
                                                                            ("grpc-ts", 7080)]
    # the Service keeps TorchServe's port for its clients, as it keeps 8081 for V2 gRPC
    assert [(p["name"], p["port"], p["targetPort"]) for p in dig(kids[(S, "pets-predictor")], "spec.ports")] == [
        ("http", 80, 8080), ("h2c", 8081, 9000), ("grpc-ts", 7070, 7080)]
    for child in kids.values():
        kubernetes_validate.validate(child, "1.31", strict=True)


def test_a_transformer_in_front_leaves_the_torchserve_port_on_the_predictor() -> None:
    isvc = load("torchserve")
    isvc["spec"]["transformer"] = load("transformer")["spec"]["transformer"]
    kids = {(c["kind"], c["metadata"]["name"]): c for c in manifests.children(validate(isvc), CFG)}
    assert [p["port"] for p in dig(kids[(S, "pets-predictor")], "spec.ports")] == [80, 8081, 7070]
    # the entry Service is the transformer's: TorchServe's API is the predictor's
    assert [p["port"] for p in dig(kids[(S, "pets")], "spec.ports")] == [80]


def test_stale_children() -> None:
    with_transformer = manifests.children(validate(load("transformer")), CFG)
    isvc = load("transformer")
    del isvc["spec"]["transformer"]
    desired = manifests.children(validate(isvc), CFG)
    foreign = copy.deepcopy(with_transformer[0])
    foreign["metadata"].update(name="someone-else", ownerReferences=[{"uid": "other"}])
    gone = manifests.stale([*with_transformer, foreign], desired, "uid-transformer")
    assert {(c["kind"],
             c["metadata"]["name"]) for c in gone} == {(D, "classifier-transformer"), (S, "classifier-transformer")}


def test_null_env_and_grace_period_are_unset_fields() -> None:
    """``env: null`` and ``terminationGracePeriodSeconds: null`` in a user's container or pod mean unset, as the
    API server reads them: the drain's variable and grace period are added (a null env made the builder fail;
    found by the property tests)."""
    isvc = load("custom")
    isvc["spec"]["predictor"]["containers"][0]["env"] = None
    isvc["spec"]["predictor"]["terminationGracePeriodSeconds"] = None
    pod = build_doc(isvc)[(D, "custom-predictor")]["spec"]["template"]["spec"]
    assert all(var in pod["containers"][0]["env"] for var in DRAIN)
    assert isinstance(pod["terminationGracePeriodSeconds"], int) and pod["terminationGracePeriodSeconds"] > 5


def build_doc(isvc: dict) -> dict[tuple[str, str], dict]:
    return {(c["kind"], c["metadata"]["name"]): c for c in manifests.children(validate(isvc), CFG)}
