"""The InferenceService CRD: one file, kept identical to the chart's copy, structural,
valid for Kubernetes, and accepting exactly the objects it should."""
from __future__ import annotations

import copy
import runpy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ovserve.operator.names import PROTOCOL_VERSIONS
from ovserve.operator.pods import POD_FIELDS

from .crd import CRD, ROOT, VALIDATOR, crd, schema

CHART_CRD = ROOT / "charts/ovserve/crds/serving.kserve.io_inferenceservices.yaml"
DATA = Path(__file__).parent / "data/isvc"
EXAMPLES = sorted(DATA.glob("*.yaml"))
BAD = sorted((DATA / "bad").glob("*.yaml"))
K8S_VERSIONS = ["1.25", "1.28", "1.31", "1.34", "1.37"]
LOGIC = {"allOf", "anyOf", "oneOf", "not"}
INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def test_chart_copy_is_identical() -> None:
    assert CHART_CRD.read_bytes() == CRD.read_bytes(), "run: python scripts/gen_crd.py"


def test_generator_is_in_sync() -> None:
    gen = runpy.run_path(str(ROOT / "scripts/gen_crd.py"))
    assert gen["render"]() == CRD.read_text(), "the CRD was edited by hand: change scripts/gen_crd.py and run it"


def test_names_columns_and_status_subresource() -> None:
    spec = crd()["spec"]
    assert (spec["group"], spec["scope"],
            spec["names"]["kind"]) == ("serving.kserve.io", "Namespaced", "InferenceService")
    assert spec["names"]["shortNames"] == ["isvc"]
    (version,) = spec["versions"]
    assert version["name"] == "v1beta1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"].upper(): c for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["URL", "READY", "AGE"]
    assert columns["READY"]["jsonPath"] == ".status.conditions[?(@.type=='Ready')].status"
    assert columns["AGE"]["type"] == "date"


def structural_violations(node: dict, where: str = "") -> list[str]:
    """The rules of a structural schema (apiextensions.k8s.io/v1), as far as this CRD uses them."""
    out: list[str] = []
    special = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
    if "type" not in node and not special:
        out.append(f"{where or '<root>'}: no type")
    if node.get("x-kubernetes-int-or-string"):
        if "type" in node or node.get("anyOf") != INT_OR_STRING:
            out.append(f"{where}: int-or-string must be exactly anyOf [integer, string] without a type")
    elif LOGIC & node.keys():
        for key in LOGIC & node.keys():
            branches = node[key] if isinstance(node[key], list) else [node[key]]
            for b in branches:
                if {"type", "description", "default", "additionalProperties", "nullable"} & b.keys():
                    out.append(f"{where}.{key}: only value validations are allowed inside")
    if "properties" in node and "additionalProperties" in node:
        out.append(f"{where}: properties and additionalProperties are exclusive")
    if node.get("type") == "array" and "items" not in node:
        out.append(f"{where}: array without items")
    for name, child in (node.get("properties") or {}).items():
        out += structural_violations(child, f"{where}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        out += structural_violations(node["additionalProperties"], f"{where}.*")
    if "items" in node:
        out += structural_violations(node["items"], f"{where}[]")
    return out


def test_schema_is_structural() -> None:
    root = schema()
    assert structural_violations(root) == []
    assert root["properties"]["metadata"] == {"type": "object"}, "metadata may only be typed"


def test_structural_checker_catches_violations() -> None:
    broken = copy.deepcopy(schema())
    del broken["properties"]["spec"]["properties"]["predictor"]["properties"]["minReplicas"]["type"]
    broken["properties"]["status"]["properties"]["conditions"].pop("items")
    assert len(structural_violations(broken)) == 2


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_crd_is_a_valid_kubernetes_object(version: str) -> None:
    kubernetes_validate.validate(crd(), version, strict=True)




@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_are_accepted(path: Path) -> None:
    errors = [e.message for e in VALIDATOR.iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_objects_are_rejected(path: Path) -> None:
    errors = list(VALIDATOR.iter_errors(yaml.safe_load(path.read_text())))
    assert errors, f"{path.name} should be refused by the schema"


def test_every_documented_field_is_in_the_schema() -> None:
    spec = schema()["properties"]["spec"]["properties"]
    model = spec["predictor"]["properties"]["model"]["properties"]
    assert {"modelFormat", "storageUri", "runtime", "protocolVersion", "args", "env", "resources",
            "ports"} <= model.keys()
    common = {"containers", "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "serviceAccountName",
              "nodeSelector", "tolerations", "timeout", "labels", "annotations"}
    for component in ("predictor", "transformer", "explainer"):
        assert common <= spec[component]["properties"].keys(), component
        # every pod field the operator passes through is in the schema: the API server prunes any other, so a
        # field missing here would reach the operator never (terminationGracePeriodSeconds did, until issue 35)
        known = spec[component]["properties"].keys()
        assert set(POD_FIELDS) <= known, (component, set(POD_FIELDS) - known)
    # the values KServe knows, as the operator's validation takes them (grpc-v1: TorchServe's gRPC API)
    assert spec["predictor"]["properties"]["model"]["properties"]["protocolVersion"]["enum"] == \
        list(PROTOCOL_VERSIONS) == ["v1", "v2", "grpc-v1", "grpc-v2"]
