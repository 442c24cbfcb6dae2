"""examples/: every InferenceService there is accepted by the CRD's schema and the operator's
validation, and yields children that are valid Kubernetes objects; each is used by a test."""
from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ovserve.operator import manifests, validation
from ovserve.operator.config import Config

from .crd import VALIDATOR

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.yaml")
                  if yaml.safe_load(p.read_text()).get("kind") == "InferenceService")
IDS = [p.relative_to(ROOT / "examples").as_posix() for p in EXAMPLES]
K8S_VERSIONS = ["1.25", "1.31", "1.34"]


def load(path: Path) -> dict:
    """As the API server stores it: a namespace and a uid added."""
    isvc = yaml.safe_load(path.read_text())
    isvc["metadata"].setdefault("namespace", "default")
    isvc["metadata"]["uid"] = f"uid-{path.stem}"
    return isvc


def kids(name: str) -> dict[tuple[str, str], dict]:
    isvc = load(ROOT / "examples" / name)
    children = manifests.children(validation.validate(isvc), Config(image="ovserve:0.1.0"))
    return {(c["kind"], c["metadata"]["name"]): c for c in children}


def test_there_are_examples_of_each_shape() -> None:
    assert {"demo-add.yaml", "classifier.yaml", "classifier-transformer.yaml", "http.yaml", "pvc.yaml",
            "autoscaling.yaml", "torchserve.yaml"} <= set(IDS)


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_the_crd_schema_accepts_it(path: Path) -> None:
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in VALIDATOR.iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_the_operator_accepts_it(path: Path) -> None:
    validation.check(load(path))


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_its_children_are_valid_kubernetes(path: Path, version: str) -> None:
    children = manifests.children(validation.validate(load(path)), Config(image="ovserve:0.1.0"))
    assert children
    for child in children:
        kubernetes_validate.validate(copy.deepcopy(child), version, strict=True)


@pytest.mark.parametrize("name", [i for i in IDS if "/" not in i])
def test_each_example_is_used_by_a_test(name: str) -> None:
    users = [p.name for p in (ROOT / "tests").glob("test_run*.py") if name in p.read_text()]
    assert users, f"examples/{name} is run by no tests/test_run*.py"


def test_what_each_storage_kind_becomes() -> None:
    pod = kids("demo-add.yaml")[("Deployment", "add-one-predictor")]["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["command"] == ["ovserve", "storage-initializer", "/mnt/source/add_one",
                                                   "/mnt/models"]
    assert {"name": "ovserve-model-source", "hostPath": {"path": "/tmp/ovserve-demo/add_one"}} in pod["volumes"]
    pod = kids("http.yaml")[("Deployment", "linear-predictor")]["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["command"][2] == "http://127.0.0.1:8000/linear.tar.gz"
    pod = kids("pvc.yaml")[("Deployment", "linear-pvc-predictor")]["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert pod["volumes"] == [{"name": "ovserve-model-pvc",
                               "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}]
    assert pod["containers"][0]["args"][:5] == ["serve", "--model-name", "linear-pvc", "--model-path",
                                                "/mnt/pvc/linear"]


def test_autoscaling_gets_an_hpa_and_no_fixed_replicas() -> None:
    children = kids("autoscaling.yaml")
    hpa = children[("HorizontalPodAutoscaler", "linear-autoscaled-predictor")]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 60
    assert "replicas" not in children[("Deployment", "linear-autoscaled-predictor")]["spec"]


def test_the_transformer_is_wired_to_the_predictor_and_is_the_entry() -> None:
    children = kids("classifier-transformer.yaml")
    pod = children[("Deployment", "classifier-tf-transformer")]["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[:3] == ["transformer", "--handler", "ovserve.server.components.imagenet:ImageNetTransformer"]
    assert args[3:] == ["--model_name", "classifier-tf", "--predictor_host", "classifier-tf-predictor.default",
                        "--http_port", "8080"]
    entry = children[("Service", "classifier-tf")]
    assert entry["spec"]["selector"]["component"] == "transformer"
