"""What the CRD schema cannot say (Kubernetes 1.20 has no CEL): cross-field rules, and the typed spec (pure).

``validate(isvc)`` returns the :class:`~.spec.InferenceServiceSpec` every builder takes, or
raises ``Invalid`` naming the field; the handler turns that into a ``kopf.PermanentError``
and a ``Ready=False`` condition with reason ``InvalidSpec``. ``check(isvc)`` is the same
without the result.

``validate`` takes any value and either returns (the builders can then build it) or raises
``Invalid``, nothing else: the types of the fields the builders and ``ovserve run`` read
are checked here too, and read here only. In a cluster the CRD's schema has refused most wrong types already,
but ``ovserve run`` reads YAML that no API server has seen, and an operator may meet a
CRD installed from elsewhere with a looser schema.
"""
from __future__ import annotations

import re
from typing import Any

from . import credentials, pods, tls
from . import names as n
from .spec import ComponentSpec, InferenceServiceSpec, ModelSpec, freeze
from .storage_uri import BadStorageUri, plan

DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 63 - len("-transformer")  # children's names must stay valid Service names
MODEL_FORMATS = ("openvino", "onnx")
RUNTIMES = ("", "ovserve")
FRAMEWORKS = ("sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx", "lightgbm", "paddle",
              "pmml", "huggingface")
RESERVED_VOLUMES = (pods.MODELS_VOLUME, pods.PVC_VOLUME, pods.HOST_VOLUME, tls.VOLUME, credentials.GCS_VOLUME)
INT32 = 2**31 - 1  # replicas and ports are int32 in the Deployment and Service they end up in
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
SCALE_METRICS = ("cpu", "memory")


class Invalid(ValueError):
    """A spec the operator cannot serve; ``field`` is its path, e.g. ``spec.predictor.maxReplicas``."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def check(isvc: object) -> None:
    """``validate`` for its verdict alone."""
    validate(isvc)


def validate(isvc: object) -> InferenceServiceSpec:
    """The InferenceService as the builders read it; ``Invalid`` when it cannot be served."""
    if not isinstance(isvc, dict):
        raise Invalid("<document>", f"must be a mapping (an InferenceService), got {_kind(isvc)}")
    meta = _mapping(isvc, "metadata", "metadata")
    name = meta.get("name", "")
    if not isinstance(name, str) or not DNS1035_LABEL.match(name) or len(name) > MAX_NAME:
        raise Invalid("metadata.name", f"{name!r} must be a DNS-1035 label of at most {MAX_NAME} characters "
                      "(lower case letters, digits and '-', starting with a letter)")
    namespace, uid = (_typed(meta, key, str, f"metadata.{key}")  # set by the API server (and by ovserve run)
                      for key in ("namespace", "uid"))
    spec = _mapping(isvc, "spec", "spec")
    if not spec.get("predictor"):
        raise Invalid("spec.predictor", "is required")
    parts = {component: _component(_mapping(spec, component, f"spec.{component}"), f"spec.{component}")
             for component in n.present_components(isvc)}
    model = _predictor(spec["predictor"])
    for key in ("alibi", "art"):
        if (spec.get("explainer") or {}).get(key):
            raise Invalid(f"spec.explainer.{key}", "built-in explainers are not supported; give containers")
    try:
        secure = tls.requested(isvc)  # serving.ovserve.io/tls-secret and tls-client-auth
    except tls.BadTlsAnnotation as exc:
        raise Invalid(exc.field, exc.reason) from None
    annotations = meta.get("annotations") or {}
    components = {component: ComponentSpec(
        component=component, model=model if component == "predictor" else None, **fields,
        pod_fields=freeze({key: spec[component][key] for key in pods.POD_FIELDS if spec[component].get(key)}),
        service_account=str(spec[component].get("serviceAccountName") or "default"),
        ports=freeze(_serving_ports(model if component == "predictor" else None, fields["containers"])),
    ) for component, fields in parts.items()}
    return InferenceServiceSpec(
        name=name, namespace=namespace, uid=uid, unset=tuple(key for key in ("namespace", "uid") if key not in meta),
        api_version=freeze(isvc.get("apiVersion", n.API_VERSION)),
        kind=freeze(isvc.get("kind", n.KIND)), labels=freeze(meta.get("labels") or {}),
        annotations=freeze(annotations), tls=secure,
        scrape=str(annotations.get(n.SCRAPE_ANNOTATION, "")).lower() == "true",
        components=freeze(components))


# -- the types the builders rely on ---------------------------------------------------------

_KINDS = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
          float: "a number", type(None): "null"}


def _kind(value: object) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _typed(parent: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """``parent[key]`` when absent, null or a ``kind`` (a boolean is no integer); else Invalid naming ``where``."""
    value = parent.get(key)
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise Invalid(where, f"must be {_KINDS[kind]}, got {_kind(value)}")
    return value


def _mapping(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    return _typed(parent, key, dict, where) or {}


def _list(parent: dict[str, Any], key: str, where: str) -> list[Any]:
    return _typed(parent, key, list, where) or []


def _integer(parent: dict[str, Any], key: str, where: str, low: int, high: int = INT32) -> int | None:
    value: int | None = _typed(parent, key, int, where)
    if value is not None and not low <= value <= high:
        raise Invalid(where, f"{value} is out of range ({low}-{high})")
    return value


def _choice(parent: dict[str, Any], key: str, where: str, choices: tuple[str, ...]) -> str:
    """The value ("" when absent), one of ``choices``."""
    value = _typed(parent, key, str, where)
    if value and value not in choices:
        raise Invalid(where, f"{value!r} is not one of {', '.join(choices)}")
    return value or ""


def _strings(parent: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    items = _list(parent, key, where)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise Invalid(f"{where}[{i}]", f"must be a string, got {_kind(item)}")
    return tuple(items)


def _string_map(parent: dict[str, Any], key: str, where: str) -> dict[str, str]:
    found = _mapping(parent, key, where)
    for k, v in found.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise Invalid(f"{where}.{k}", f"keys and values must be strings, got {_kind(v)}")
    return found


def _items(parent: dict[str, Any], key: str, where: str) -> list[tuple[str, dict[str, Any]]]:
    """A list of mappings: (path, item) for each."""
    out = []
    for i, item in enumerate(_list(parent, key, where)):
        if not isinstance(item, dict):
            raise Invalid(f"{where}[{i}]", f"must be a mapping, got {_kind(item)}")
        out.append((f"{where}[{i}]", item))
    return out


def _env(parent: dict[str, Any], where: str) -> list[dict[str, Any]]:
    items = _items(parent, "env", f"{where}.env")
    for at, var in items:
        if not isinstance(var.get("name"), str) or not var["name"]:
            raise Invalid(f"{at}.name", "is required (a string)")
        _typed(var, "value", str, f"{at}.value")
        _mapping(var, "valueFrom", f"{at}.valueFrom")
    return [var for _, var in items]


def _ports(parent: dict[str, Any], where: str) -> list[dict[str, Any]]:
    items = _items(parent, "ports", f"{where}.ports")
    for at, port in items:
        if _integer(port, "containerPort", f"{at}.containerPort", 1, 65535) is None:
            raise Invalid(f"{at}.containerPort", "is required")
        _typed(port, "name", str, f"{at}.name")
    return [port for _, port in items]


def _container(container: dict[str, Any], where: str) -> None:
    """The container fields the builders and ``ovserve run`` read (the rest pass through to the pod)."""
    if not isinstance(container.get("image"), str) or not container["image"]:
        raise Invalid(f"{where}.image", "is required (a string)")
    _typed(container, "name", str, f"{where}.name")
    _strings(container, "command", f"{where}.command")
    _strings(container, "args", f"{where}.args")
    _env(container, where)
    _ports(container, where)
    _mapping(container, "resources", f"{where}.resources")
    _choice(container, "imagePullPolicy", f"{where}.imagePullPolicy", PULL_POLICIES)


def _component(spec: dict[str, Any], where: str) -> dict[str, Any]:
    """The component's fields of :class:`ComponentSpec` but its model, pod fields and ports."""
    low = _integer(spec, "minReplicas", f"{where}.minReplicas", 0)
    high = _integer(spec, "maxReplicas", f"{where}.maxReplicas", 0)
    if high and low is not None and high < low:
        raise Invalid(f"{where}.maxReplicas", f"{high} is less than minReplicas {low}")
    target = _integer(spec, "scaleTarget", f"{where}.scaleTarget", 1)
    metric = _choice(spec, "scaleMetric", f"{where}.scaleMetric", SCALE_METRICS)
    labels = _string_map(spec, "labels", f"{where}.labels")
    annotations = _string_map(spec, "annotations", f"{where}.annotations")
    volumes = _items(spec, "volumes", f"{where}.volumes")
    for i, (at, volume) in enumerate(volumes):
        if not isinstance(volume.get("name"), str):
            raise Invalid(f"{at}.name", "is required (a string)")
        if volume["name"] in RESERVED_VOLUMES:
            raise Invalid(f"{where}.volumes[{i}].name", f"{volume['name']!r} is reserved by the operator")
    containers = _items(spec, "containers", f"{where}.containers")
    for at, container in containers:
        _container(container, at)
    if where != "spec.predictor" and not containers:
        raise Invalid(f"{where}.containers", "is required")
    min_replicas = max(1, low or 1)
    return {"min_replicas": min_replicas, "max_replicas": max(min_replicas, high or min_replicas),
            "scale_target": target or 80, "scale_metric": metric or "cpu",
            "labels": freeze(labels), "annotations": freeze(annotations),
            # a predictor's model wins over its containers (refused together, by _predictor)
            "containers": () if where == "spec.predictor" and spec.get("model") else
            tuple(freeze(container) for _, container in containers),
            "volumes": tuple(freeze(volume) for _, volume in volumes)}


def _predictor(spec: dict[str, Any]) -> ModelSpec | None:
    """The predictor's model, None when its containers run."""
    for key in FRAMEWORKS:
        if spec.get(key):
            raise Invalid(f"spec.predictor.{key}", "framework shorthands are not supported; use "
                          "model.modelFormat.name (openvino or onnx) or containers")
    if bool(spec.get("model")) == bool(spec.get("containers")):
        raise Invalid("spec.predictor", "give exactly one of model or containers")
    if spec.get("containers"):
        return None
    model = _mapping(spec, "model", "spec.predictor.model")
    where = "spec.predictor.model"
    fmt = _typed(_mapping(model, "modelFormat", f"{where}.modelFormat"), "name", str, f"{where}.modelFormat.name")
    if (fmt or "").lower() not in MODEL_FORMATS:
        raise Invalid(f"{where}.modelFormat.name",
                      f"{fmt or ''!r} is not supported (ovserve serves {' and '.join(MODEL_FORMATS)})")
    runtime = _typed(model, "runtime", str, f"{where}.runtime") or ""
    if runtime not in RUNTIMES:
        raise Invalid(f"{where}.runtime", f"{runtime!r} is not supported (leave it empty or 'ovserve')")
    uri = _typed(model, "storageUri", str, f"{where}.storageUri")
    if not uri:
        raise Invalid(f"{where}.storageUri", "is required: where the model comes from")
    try:
        storage = plan(uri)
    except BadStorageUri as exc:
        raise Invalid(f"{where}.storageUri", str(exc)) from None
    name, image = (_typed(model, key, str, f"{where}.{key}") for key in ("name", "image"))
    args = _strings(model, "args", f"{where}.args")
    env = _env(model, where)
    ports = _ports(model, where)
    resources = _mapping(model, "resources", f"{where}.resources")
    pull = _choice(model, "imagePullPolicy", f"{where}.imagePullPolicy", PULL_POLICIES)
    protocol = _typed(model, "protocolVersion", str, f"{where}.protocolVersion")
    if protocol is not None and protocol not in n.PROTOCOL_VERSIONS:
        raise Invalid(f"{where}.protocolVersion", f"{protocol!r} is not a protocol KServe knows "
                      f"({', '.join(n.PROTOCOL_VERSIONS)}); every ovserve predictor serves v1, v2 and grpc-v2, "
                      "and grpc-v1 adds TorchServe's gRPC inference API")
    found = ModelSpec(format=fmt or "", storage_uri=uri, storage=storage, protocol_version=protocol,
                      name=name or "", image=image or "", image_pull_policy=pull, args=args,
                      env=tuple(freeze(var) for var in env), resources=freeze(resources),
                      ports=tuple(freeze(port) for port in ports))
    _listener_ports(model, found, where)
    return found


def _serving_ports(model: ModelSpec | None, containers: tuple[Any, ...]) -> dict[str, int]:
    """The component's main container's ports by listener name (``rest``, and ``grpc`` when it has one):
    an ovserve server's every listener (those its ``protocolVersion`` asks for) at its default port unless
    its ``ports`` say otherwise."""
    if model is not None:
        declared = model.ports
        out = {name: n.LISTENERS[name].default for name in n.listeners_for(model.protocol_version)}
    else:
        declared = containers[0].get("ports") or ()
        out = {"rest": n.REST_PORT}
    for port in declared:
        out[pods.listener_of(port)] = port["containerPort"]
    return out


def _listener_ports(model: dict[str, Any], found: ModelSpec, where: str) -> None:
    """Each declared port moves one listener the predictor has, and no two listeners share a port (the
    server could not bind the second)."""
    have = n.listeners_for(model.get("protocolVersion"))
    moved: dict[str, int] = {}
    for i, port in enumerate(model.get("ports") or []):
        listener = pods.listener_of(port)
        row = n.LISTENERS[listener]
        if listener not in have:
            raise Invalid(f"{where}.ports[{i}].name", f"{port.get('name')!r} names the {row.title} port, "
                          f"which only protocolVersion {row.protocol} has")
        if listener in moved:
            raise Invalid(f"{where}.ports[{i}]", f"a second {row.title} port (ports[{moved[listener]}] is one); "
                          f"{_PORT_NAMING}")
        moved[listener] = i
    taken: dict[int, str] = {}
    for listener, number in _serving_ports(found, ()).items():
        if number in taken:
            raise Invalid(f"{where}.ports", f"the {n.LISTENERS[taken[number]].title} and "
                          f"{n.LISTENERS[listener].title} ports are both {number}; {_PORT_NAMING}")
        taken[number] = listener


_PORT_NAMING = ("a port named h2c or grpc* is the gRPC port, one named grpc-ts the TorchServe gRPC port "
                "(protocolVersion grpc-v1), any other the REST port")
