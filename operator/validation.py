"""What the CRD schema cannot say (Kubernetes 1.20 has no CEL): cross-field rules (pure).

``check(isvc)`` raises ``Invalid`` naming the field; the handler turns it into a
``kopf.PermanentError`` and a ``Ready=False`` condition with reason ``InvalidSpec``.
"""
from __future__ import annotations

import re

from . import names as n
from . import pods
from .storage_uri import BadStorageUri, plan

DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 63 - len("-transformer")  # children's names must stay valid Service names
MODEL_FORMATS = ("openvino", "onnx")
RUNTIMES = ("", "ovserve")
FRAMEWORKS = ("sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx", "lightgbm", "paddle",
              "pmml", "huggingface")
RESERVED_VOLUMES = (pods.MODELS_VOLUME, pods.PVC_VOLUME, pods.HOST_VOLUME)


class Invalid(ValueError):
    """A spec the operator cannot serve; ``field`` is its path, e.g. ``spec.predictor.maxReplicas``."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def check(isvc: dict) -> None:
    name = isvc.get("metadata", {}).get("name", "")
    if not DNS1035_LABEL.match(name) or len(name) > MAX_NAME:
        raise Invalid("metadata.name", f"{name!r} must be a DNS-1035 label of at most {MAX_NAME} characters "
                      "(lower case letters, digits and '-', starting with a letter)")
    spec = isvc.get("spec") or {}
    if not spec.get("predictor"):
        raise Invalid("spec.predictor", "is required")
    for component in n.present_components(isvc):
        _component(spec[component], f"spec.{component}")
    _predictor(spec["predictor"])
    for key in ("alibi", "art"):
        if (spec.get("explainer") or {}).get(key):
            raise Invalid(f"spec.explainer.{key}", "built-in explainers are not supported; give containers")


def _component(spec: dict, where: str) -> None:
    low, high = spec.get("minReplicas"), spec.get("maxReplicas")
    if high and low is not None and high < low:
        raise Invalid(f"{where}.maxReplicas", f"{high} is less than minReplicas {low}")
    for i, volume in enumerate(spec.get("volumes") or []):
        if volume.get("name") in RESERVED_VOLUMES:
            raise Invalid(f"{where}.volumes[{i}].name", f"{volume['name']!r} is reserved by the operator")
    if where != "spec.predictor" and not spec.get("containers"):
        raise Invalid(f"{where}.containers", "is required")


def _predictor(spec: dict) -> None:
    for key in FRAMEWORKS:
        if spec.get(key):
            raise Invalid(f"spec.predictor.{key}", "framework shorthands are not supported; use "
                          "model.modelFormat.name (openvino or onnx) or containers")
    if bool(spec.get("model")) == bool(spec.get("containers")):
        raise Invalid("spec.predictor", "give exactly one of model or containers")
    if spec.get("containers"):
        return
    model = spec["model"]
    fmt = str((model.get("modelFormat") or {}).get("name", ""))
    if fmt.lower() not in MODEL_FORMATS:
        raise Invalid("spec.predictor.model.modelFormat.name",
                      f"{fmt!r} is not supported (ovserve serves {' and '.join(MODEL_FORMATS)})")
    runtime = model.get("runtime") or ""
    if runtime not in RUNTIMES:
        raise Invalid("spec.predictor.model.runtime", f"{runtime!r} is not supported (leave it empty or 'ovserve')")
    if not model.get("storageUri"):
        raise Invalid("spec.predictor.model.storageUri", "is required: where the model comes from")
    try:
        plan(model["storageUri"])
    except BadStorageUri as exc:
        raise Invalid("spec.predictor.model.storageUri", str(exc)) from None
    if len({p.get("containerPort") for p in model.get("ports") or []}) > 2:
        raise Invalid("spec.predictor.model.ports", "at most two ports: REST and gRPC (named h2c or grpc)")
