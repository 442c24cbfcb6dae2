"""Property-based tests (hypothesis) of what turns an InferenceService into objects and processes:
the operator's pure builders (``operator/validation.py``, ``manifests.py``, ``pods.py``,
``storage_uri.py``) and ``ovserve run``'s reader and planner (``operator/local/plan.py``).

- A valid InferenceService, drawn from the real shapes of its fields, passes the operator's
  validation and gives children that are valid Kubernetes objects (``kubernetes-validate``,
  strict), the same every time; ``ovserve run`` plans it or refuses it with its one error.
- Anything else (a valid document with one field replaced by a value of another type, a huge
  number, a key removed; a document that is not a mapping at all) ends in the documented error
  only: ``validation.Invalid`` (the operator's ``InvalidSpec``), ``local_plan.RunError``; never a
  KeyError, TypeError, AttributeError, ValueError or RecursionError.
- ``ovserve run FILE`` on bytes that are not an InferenceService (not UTF-8, not YAML, not a
  mapping, nested thousands deep, huge numbers) exits 2 with one line and no traceback.
"""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ovserve.operator import manifests, validation
from ovserve.operator.config import Config
from ovserve.operator.local import plan as local_plan
from ovserve.operator.local.plan import RunError
from ovserve.operator.storage_uri import BadStorageUri
from ovserve.operator.storage_uri import plan as storage_plan

CFG = Config(image="registry.example.com/ovserve:0.1.0", image_pull_policy="IfNotPresent")
K8S_VERSION = "1.31"
FAST = settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
#: for properties that validate every child against the Kubernetes schemas (~15 ms a child)
SLOW = settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- the real shapes of the fields ---------------------------------------------------------

dns_label = st.from_regex(r"[a-z]([-a-z0-9]{0,14}[a-z0-9])?", fullmatch=True)
isvc_name = dns_label.filter(lambda s: len(s) <= validation.MAX_NAME)
path_part = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,11}", fullmatch=True).filter(lambda s: s not in (".", ".."))
rel_path = st.lists(path_part, min_size=1, max_size=3).map("/".join)
storage_uri = st.one_of(
    st.builds(lambda claim, path: f"pvc://{claim}/{path}", dns_label, rel_path),
    st.builds(lambda scheme, host, path: f"{scheme}://{host}/{path}", st.sampled_from(["http", "https"]),
              st.sampled_from(["models.example.com", "127.0.0.1:8000", "store.ml.svc:80"]), rel_path),
    st.builds(lambda path: f"file:///{path}", rel_path),
    st.builds(lambda path: f"/{path}", rel_path),
)
env_name = st.from_regex(r"[A-Z_][A-Z0-9_]{0,15}", fullmatch=True)
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
env = st.lists(st.fixed_dictionaries({"name": env_name, "value": text}), max_size=3,
               unique_by=lambda e: e["name"])
quantity = st.one_of(st.sampled_from(["100m", "1", "2", "250m", "1Gi", "512Mi", "0.5"]), st.integers(1, 64))
resources = st.fixed_dictionaries({}, optional={
    "requests": st.fixed_dictionaries({}, optional={"cpu": quantity, "memory": st.sampled_from(["256Mi", "1Gi"])}),
    "limits": st.fixed_dictionaries({}, optional={"cpu": quantity, "memory": st.sampled_from(["512Mi", "2Gi"])}),
})
args = st.lists(st.one_of(st.sampled_from(["--nireq", "4", "--log-level", "debug", "--model_name=m",
                                           "--predictor-host", "elsewhere:80"]), text), max_size=4)
port = st.integers(1, 65535)
label_value = st.from_regex(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?)?", fullmatch=True)
labels = st.dictionaries(st.sampled_from(["team", "app.example.com/tier", "cost-center"]), label_value, max_size=2)
annotations = st.dictionaries(st.sampled_from(["prometheus.io/scrape", "note"]), text, max_size=2)


@st.composite
def model_ports(draw: st.DrawFn) -> list[dict]:
    rest, grpc = draw(st.lists(port, min_size=2, max_size=2, unique=True))
    chosen = draw(st.sampled_from([[], [("http", rest)], [("h2c", grpc)], [("http", rest), ("grpc", grpc)]]))
    return [{"name": name, "containerPort": number, "protocol": "TCP"} for name, number in chosen]


@st.composite
def replicas(draw: st.DrawFn) -> dict:
    out: dict = {}
    low = draw(st.one_of(st.none(), st.integers(0, 5)))
    if low is not None:
        out["minReplicas"] = low
    high = draw(st.one_of(st.none(), st.integers(max(low or 0, 1), 8)))
    if high is not None:
        out["maxReplicas"] = high
    if draw(st.booleans()):
        out["scaleTarget"] = draw(st.integers(1, 100))
        out["scaleMetric"] = draw(st.sampled_from(["cpu", "memory"]))
    return out


probe = st.builds(
    lambda action, period, failures: {**action, "periodSeconds": period, "failureThreshold": failures},
    st.one_of(st.builds(lambda path, port: {"httpGet": {"path": path, "port": port}},
                        st.sampled_from(["/v2/health/ready", "/ready"]), st.one_of(st.just("http"), port)),
              st.builds(lambda port: {"tcpSocket": {"port": port}}, port)),
    st.integers(1, 10), st.integers(1, 5))


@st.composite
def container(draw: st.DrawFn) -> dict:
    c: dict = {"image": draw(st.sampled_from(["example.com/t:1", "registry.example.com/ovserve:0.1.0"]))}
    if draw(st.booleans()):
        c["name"] = draw(dns_label)
    if draw(st.booleans()):  # the ovserve image's own components run locally under ovserve run
        c["command"] = draw(st.sampled_from([["ovserve", "transformer"], ["ovserve", "explainer"],
                                             ["python", "-m", "ovserve.server", "transformer"], ["/bin/server"]]))
    if draw(st.booleans()):
        c["args"] = draw(args)
    if draw(st.booleans()):
        c["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    for key in ("readinessProbe", "startupProbe"):
        if draw(st.booleans()):
            c[key] = draw(probe)
    if draw(st.booleans()):
        c["env"] = draw(env)
    if draw(st.booleans()):
        c["ports"] = [{"containerPort": draw(port), "name": "http", "protocol": "TCP"}]
    if draw(st.booleans()):
        c["resources"] = draw(resources)
    return c


@st.composite
def component(draw: st.DrawFn, predictor: bool) -> dict:
    spec: dict = draw(replicas())
    if predictor and draw(st.booleans()):
        model: dict = {"modelFormat": {"name": draw(st.sampled_from(["openvino", "onnx", "OpenVINO", "ONNX"]))},
                       "storageUri": draw(storage_uri)}
        for key, strategy in (("args", args), ("env", env), ("resources", resources), ("ports", model_ports()),
                              ("runtime", st.sampled_from(["", "ovserve"])),
                              ("protocolVersion", st.sampled_from(["v1", "v2", "grpc-v2"])),
                              ("imagePullPolicy", st.sampled_from(["Always", "IfNotPresent", "Never"]))):
            if draw(st.booleans()):
                model[key] = draw(strategy)
        spec["model"] = model
    else:
        spec["containers"] = [draw(container())]
    if draw(st.booleans()):
        spec["labels"] = draw(labels)
    if draw(st.booleans()):
        spec["annotations"] = draw(annotations)
    if draw(st.booleans()):
        spec["serviceAccountName"] = draw(dns_label)
    if draw(st.booleans()):
        spec["nodeSelector"] = {"kubernetes.io/arch": draw(st.sampled_from(["amd64", "arm64"]))}
    if draw(st.booleans()) or any("volumeMounts" in c for c in spec.get("containers", [])):
        spec["volumes"] = [draw(st.sampled_from([{"name": "scratch", "emptyDir": {}},
                                                 {"name": "scratch", "hostPath": {"path": "/srv/scratch"}}]))]
    return spec


@st.composite
def inference_service(draw: st.DrawFn) -> dict:
    spec = {"predictor": draw(component(predictor=True))}
    for extra in ("transformer", "explainer"):
        if draw(st.booleans()):
            spec[extra] = draw(component(predictor=False))
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": draw(isvc_name), "namespace": draw(dns_label), "uid": draw(st.uuids()).hex},
            "spec": spec}


# -- garbage: one field of a valid document replaced, or removed ----------------------------

json_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(2**63, 2**200), st.floats(), text)
json_value = st.recursive(json_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                               st.dictionaries(text, inner, max_size=3)),
                          max_leaves=8)


def paths(node: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside ``node`` (dict keys and list indexes)."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += paths(value, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> dict:
    doc = draw(inference_service())
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(paths(doc)))
        parent = doc
        for step in where[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[where[-1]]
        else:
            parent[where[-1]] = draw(json_value)
        if not paths(doc):
            break
    return doc


# -- the properties ----------------------------------------------------------------------------


@SLOW
@given(inference_service())
def test_a_valid_spec_builds_valid_kubernetes_objects_deterministically(isvc: dict) -> None:
    before = copy.deepcopy(isvc)
    validation.check(isvc)
    children = manifests.children(validation.validate(isvc), CFG)
    assert isvc == before, "the builders changed their input"
    assert manifests.children(validation.validate(copy.deepcopy(isvc)), CFG) == children
    names = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert len(names) == len(set(names))
    for child in children:
        kubernetes_validate.validate(copy.deepcopy(child), K8S_VERSION, strict=True)


@FAST
@given(inference_service(), st.sampled_from(["autoscaling/v2", "autoscaling/v2beta2"]))
def test_the_operator_resync_sees_no_drift_in_what_it_built(isvc: dict, hpa: str) -> None:
    from ovserve.operator.resync import drift

    children = manifests.children(validation.validate(isvc), CFG, hpa)
    uid = isvc["metadata"]["uid"]
    assert drift(children, children, uid) == []
    for i, child in enumerate(children):  # any one child gone is named
        rest = children[:i] + children[i + 1:]
        assert drift(rest, children, uid) == [f"{child['kind']} {child['metadata']['name']} missing"]


@FAST
@given(isvc=inference_service())
def test_run_plans_a_valid_spec_or_says_why_not(isvc: dict, tmp_path_factory: pytest.TempPathFactory) -> None:
    prepared = local_plan.prepare(isvc)
    workdir = tmp_path_factory.mktemp("plan")
    try:
        first = local_plan.plan(prepared, workdir)
    except RunError as exc:
        assert str(exc)
        return
    assert local_plan.plan(prepared, workdir) == first
    assert next(c.name for c in first) == "predictor"


def refused_or_built(doc: object) -> None:
    """The operator's view: ``validation.check`` refuses it with ``Invalid``, or the builders build it."""
    try:
        validation.check(doc)  # type: ignore[arg-type]
    except validation.Invalid as exc:
        assert exc.field and exc.reason and str(exc).startswith(exc.field)
        event(f"operator: Invalid {exc.field.split('[')[0]}")
        return
    event("operator: built")
    doc = copy.deepcopy(doc)
    meta = doc["metadata"]  # type: ignore[index]
    meta.setdefault("namespace", "ns")
    meta.setdefault("uid", "uid")
    manifests.children(validation.validate(doc), CFG)  # type: ignore[arg-type]


def run_refused_or_planned(doc: object, workdir: Path) -> None:
    """``ovserve run``'s view: ``RunError`` with a message, or a plan."""
    try:
        local_plan.plan(local_plan.prepare(doc), workdir)  # type: ignore[arg-type]
    except RunError as exc:
        assert str(exc)
        event(f"run: RunError {'invalid' if str(exc).startswith('invalid') else 'from the plan'}")
        return
    event("run: planned")


@FAST
@given(doc=mutated())
@example(doc={"metadata": {"name": "a"}, "spec": {"predictor": {"model": {
    "modelFormat": {"name": "openvino"}, "storageUri": "http://[x"}}}}).via("urlsplit raised ValueError")
def test_a_broken_spec_is_refused_with_the_documented_error(doc: dict,
                                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    refused_or_built(doc)
    run_refused_or_planned(doc, tmp_path_factory.mktemp("plan"))


@FAST
@given(doc=json_value)
def test_any_document_at_all_is_refused_with_the_documented_error(doc: object,
                                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    refused_or_built(doc)
    run_refused_or_planned(doc, tmp_path_factory.mktemp("plan"))


@FAST
@given(st.text(max_size=40))
def test_storage_uri_plans_or_says_why(uri: str) -> None:
    try:
        where = storage_plan(uri)
    except BadStorageUri as exc:
        assert str(exc)
        return
    assert where.kind in ("pvc", "http", "host") and where.source


# -- what the messages say, for some of the shapes the properties above draw ------------------

BASE = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "m"},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "openvino"}, "storageUri": "/srv/m"}},
                 "transformer": {"containers": [{"image": "registry.example.com/ovserve:0.1.0",
                                                 "command": ["ovserve", "transformer"]}]}}}
WRONG = [  # (path, value, the message's start)
    ("metadata", [], "metadata: must be a mapping, got a list"),
    ("metadata.name", 5, "metadata.name: 5 must be a DNS-1035 label"),
    ("spec.predictor", "x", "spec.predictor: must be a mapping, got a string"),
    ("spec.predictor.minReplicas", "3", "spec.predictor.minReplicas: must be an integer, got a string"),
    ("spec.predictor.maxReplicas", True, "spec.predictor.maxReplicas: must be an integer, got a boolean"),
    ("spec.predictor.minReplicas", 10**30,
     "spec.predictor.minReplicas: 1000000000000000000000000000000 is out of range"),
    ("spec.predictor.model.storageUri", 5, "spec.predictor.model.storageUri: must be a string, got an integer"),
    ("spec.predictor.model.storageUri", "http://[x", "spec.predictor.model.storageUri: 'http://[x': Invalid IPv6 URL"),
    ("spec.predictor.model.modelFormat", "openvino", "spec.predictor.model.modelFormat: must be a mapping"),
    ("spec.predictor.model.ports", [5], "spec.predictor.model.ports[0]: must be a mapping, got an integer"),
    ("spec.predictor.model.env", [{"name": 1}], "spec.predictor.model.env[0].name: is required (a string)"),
    ("spec.predictor.labels", {"team": 1}, "spec.predictor.labels.team: keys and values must be strings"),
    ("spec.transformer.containers", {"image": "x"}, "spec.transformer.containers: must be a list, got a mapping"),
    ("spec.transformer.containers[0].args", ["--a", 1], "spec.transformer.containers[0].args[1]: must be a string"),
    ("spec.transformer.scaleMetric", "rps", "spec.transformer.scaleMetric: 'rps' is not one of cpu, memory"),
]


def with_value(path: str, value: object) -> dict:
    doc = copy.deepcopy(BASE)
    *parents, last = path.replace("[0]", ".0").split(".")
    node: object = doc
    for step in parents:
        node = node[int(step)] if step.isdigit() else node[step]  # type: ignore[index]
    node[last] = value  # type: ignore[index]
    return doc


@pytest.mark.parametrize("path,value,message", WRONG, ids=[f"{w[0]}={str(w[1])[:10]}" for w in WRONG])
def test_a_wrong_type_is_refused_naming_the_field(path: str, value: object, message: str) -> None:
    with pytest.raises(validation.Invalid) as err:
        validation.check(with_value(path, value))
    assert str(err.value).startswith(message)
    with pytest.raises(RunError) as err:  # ovserve run says the same, before anything starts
        local_plan.prepare(with_value(path, value))
    assert str(err.value) == f"invalid InferenceService: {message}" or str(err.value).startswith(
        f"invalid InferenceService: {message}")


PASSED_THROUGH = [  # pod fields the operator passes as written, read by ovserve run only
    ("readinessProbe", "x", "transformer: container 'kserve-container': readinessProbe must be a mapping"),
    ("readinessProbe", {"httpGet": {"port": [8080]}},
     "transformer: container 'kserve-container': readinessProbe.httpGet.port must be an integer or a string"),
    ("startupProbe", {"tcpSocket": {}, "periodSeconds": "10"},
     "transformer: container 'kserve-container': startupProbe.periodSeconds must be an integer or a number"),
    ("startupProbe", {"tcpSocket": {}, "failureThreshold": 1e308},
     "transformer: container 'kserve-container': startupProbe.failureThreshold must be between 0 and 1000000"),
    ("volumeMounts", [{"name": ["scratch"], "mountPath": "/s"}],
     "transformer: container 'kserve-container': volumeMounts[0].name must be a string"),
    ("volumeMounts", [{"name": "scratch"}],
     "transformer: container 'kserve-container': volumeMounts[0].mountPath is required"),
    ("readinessProbe", {"httpGet": {"port": "²"}}, ""),  # str.isdigit() is true for it, int() refuses it
]


@pytest.mark.parametrize("key,value,message", PASSED_THROUGH, ids=[f"{p[0]}-{i}" for i, p in enumerate(PASSED_THROUGH)])
def test_ovserve_run_checks_the_pod_fields_it_reads(key: str, value: object, message: str, tmp_path: Path) -> None:
    doc = with_value(f"spec.transformer.containers[0].{key}", value)
    doc["spec"]["transformer"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    validation.check(doc)  # the operator passes these fields through; the API server would judge them
    if not message:  # a named port that does not exist: the probe falls back to the REST port
        (_, transformer) = local_plan.plan(local_plan.prepare(doc), tmp_path)
        assert transformer.main.readiness.port == transformer.main.rest_port
        return
    with pytest.raises(RunError) as err:
        local_plan.plan(local_plan.prepare(doc), tmp_path)
    assert str(err.value).startswith(message)


# -- ovserve run's reader: bytes in a file -------------------------------------------------------


def deep(n: int) -> bytes:
    return b"a: " + b"[" * n + b"]" * n + b"\n"


ISVC_YAML = (b"apiVersion: serving.kserve.io/v1beta1\nkind: InferenceService\nmetadata: {name: m}\n"
             b"spec: {predictor: {model: {modelFormat: {name: openvino}, storageUri: /tmp/m}}}\n")


@FAST
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                     st.builds(lambda doc: yaml.safe_dump(doc).encode(), json_value)))
@example(raw=b"\xff\xfe\x00a").via("not UTF-8")
@example(raw=deep(5000)).via("nested 5000 deep")
@example(raw=b"- 1\n- 2\n").via("a list")
@example(raw=ISVC_YAML.replace(b"{name: m}", b"{name: m, generation: 1e999999}"))
@example(raw=ISVC_YAML.replace(b"/tmp/m}", b"/tmp/m}, minReplicas: 99999999999999999999999999"))
@example(raw=ISVC_YAML.replace(b"{name: m}",
                               b"{name: m, creationTimestamp: 2026-13-45}")).via("a date PyYAML cannot build")
def test_the_yaml_reader_refuses_what_is_not_an_inference_service(raw: bytes,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("yaml") / "isvc.yaml"
    path.write_bytes(raw)
    try:
        doc = local_plan.load(path)
    except RunError as exc:
        assert str(exc).startswith(str(path))
        return
    run_refused_or_planned(doc, path.parent)


CLI_CASES = {
    "not-utf8": b"\xff\xfe\x00\x01garbage",
    "not-yaml": b"a: [\n",
    "a-list": b"- kind: InferenceService\n",
    "a-scalar": b"42\n",
    "deeply-nested": deep(20000),
    "huge-number": ISVC_YAML.replace(b"/tmp/m}", b"/tmp/m}, minReplicas: 1" + b"0" * 400),
    "bad-date": ISVC_YAML.replace(b"{name: m}", b"{name: m, creationTimestamp: 2026-13-45}"),
    "control-character": ISVC_YAML.replace(b"name: m", b"name: m\x00"),
    "wrong-types": ISVC_YAML.replace(b"{name: m}", b"[m]"),
}


@pytest.mark.local
@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_ovserve_run_on_garbage_is_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(CLI_CASES[case])
    done = subprocess.run([sys.executable, "-m", "ovserve.server", "run", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ovserve run: error: "), done.stderr
    assert done.stdout == ""
