"""The InferenceService CRD (crds/), and its schema as a JSON Schema validator of InferenceService objects."""
from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT / "crds/serving.kserve.io_inferenceservices.yaml"


def crd() -> dict:
    return yaml.safe_load(CRD.read_text())


def schema() -> dict:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def as_json_schema(node: object) -> object:
    """OpenAPI v3 (as Kubernetes uses it) -> JSON Schema: drop the x-kubernetes-* markers."""
    if isinstance(node, dict):
        return {k: as_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if isinstance(node, list):
        return [as_json_schema(v) for v in node]
    return node


VALIDATOR = jsonschema.Draft7Validator(as_json_schema(schema()))
