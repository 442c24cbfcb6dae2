"""Pure status and validation: child Deployment status -> conditions; specs the schema cannot refuse."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from ovserve.operator import status, validation
from ovserve.operator.storage_uri import BadStorageUri, StoragePlan, plan

DATA = Path(__file__).parent / "data/isvc"
NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def load(stem: str) -> dict:
    isvc = yaml.safe_load((DATA / f"{stem}.yaml").read_text())
    isvc["metadata"].update(namespace="ml", uid="u", generation=1)
    return isvc


def deployment(name: str = "d", generation: int = 1, observed: int = 1, ready: int = 0, replicas: int = 1,
               **conditions: tuple[str, str, str]) -> dict:
    conds = [{"type": t, "status": s, "reason": r, "message": f"{t} says {r}"} for t, (s, r) in
             ((t, v[:2]) for t, v in conditions.items())]
    return {"metadata": {"name": name, "generation": generation}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "readyReplicas": ready, "conditions": conds}}


AVAILABLE = ("True", "MinimumReplicasAvailable", "")
UNAVAILABLE = ("False", "MinimumReplicasUnavailable", "")
# (deployment, expected status, expected reason)
CASES = [
    (None, "Unknown", "DeploymentMissing"),
    (deployment(ready=1, Available=AVAILABLE, Progressing=("True", "NewReplicaSetAvailable", "")), "True", "MinimumReplicasAvailable"),
    (deployment(ready=0, Available=UNAVAILABLE, Progressing=("True", "ReplicaSetUpdated", "")), "Unknown", "MinimumReplicasUnavailable"),
    (deployment(ready=0, Available=UNAVAILABLE, Progressing=("True", "NewReplicaSetAvailable", "")), "False", "MinimumReplicasUnavailable"),
    (deployment(ready=0, Available=UNAVAILABLE, Progressing=("False", "ProgressDeadlineExceeded", "")), "False", "ProgressDeadlineExceeded"),
    (deployment(ready=1, Available=AVAILABLE, ReplicaFailure=("True", "FailedCreate", "")), "False", "FailedCreate"),
    (deployment(generation=2, observed=1, ready=1, Available=AVAILABLE), "Unknown", "RolloutPending"),
    (deployment(ready=0), "Unknown", "Pending"),
]


@pytest.mark.parametrize("dep,want_status,want_reason", CASES)
def test_component_condition(dep: dict | None, want_status: str, want_reason: str) -> None:
    cond = status.component_condition("predictor", dep)
    assert (cond["type"], cond["status"], cond["reason"]) == ("PredictorReady", want_status, want_reason)
    assert cond["message"]


def test_failure_message_is_the_childs() -> None:
    dep = deployment(Progressing=("False", "ProgressDeadlineExceeded", ""))
    assert status.component_condition("predictor", dep)["message"] == "Progressing says ProgressDeadlineExceeded"


def test_full_status_with_transformer() -> None:
    isvc = load("transformer")
    ok = deployment(ready=1, Available=AVAILABLE)
    st = status.compute(isvc, {"predictor": ok}, NOW)
    assert st["url"] == st["address"]["url"] == "http://classifier.ml.svc.cluster.local"
    assert st["components"] == {"predictor": {"url": "http://classifier-predictor.ml.svc.cluster.local"},
                                "transformer": {"url": "http://classifier-transformer.ml.svc.cluster.local"},
                                "explainer": None}
    conds = {c["type"]: c for c in st["conditions"]}
    assert list(conds) == ["PredictorReady", "TransformerReady", "Ready"]
    assert conds["PredictorReady"]["status"] == "True"
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("Unknown", "DeploymentMissing")
    assert conds["Ready"]["message"].startswith("TransformerReady: ")
    st = status.compute(isvc, {"predictor": ok, "transformer": ok}, NOW)
    assert [c["status"] for c in st["conditions"]] == ["True", "True", "True"]


def test_a_false_component_wins_over_an_unknown_one() -> None:
    isvc = load("explainer")
    broken = deployment(Progressing=("False", "ProgressDeadlineExceeded", ""))
    ready = status.compute(isvc, {"explainer": broken}, NOW)["conditions"][-1]
    assert (ready["status"], ready["reason"]) == ("False", "ProgressDeadlineExceeded")
    assert ready["message"].startswith("ExplainerReady: ")


def test_transition_times_move_only_on_change() -> None:
    isvc = load("predictor")
    isvc["status"] = status.compute(isvc, {}, NOW)
    again = status.compute(isvc, {}, LATER)
    assert {c["lastTransitionTime"] for c in again["conditions"]} == {NOW}
    assert not status.changed(isvc["status"], again)
    flipped = status.compute(isvc, {"predictor": deployment(ready=1, Available=AVAILABLE)}, LATER)
    assert {c["lastTransitionTime"] for c in flipped["conditions"]} == {LATER}
    assert status.changed(isvc["status"], flipped)


def test_invalid_spec_is_reported_by_field() -> None:
    isvc = load("predictor")
    isvc["spec"]["predictor"]["model"]["modelFormat"]["name"] = "sklearn"
    (ready,) = status.compute(isvc, {}, NOW)["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    assert ready["message"].startswith("spec.predictor.model.modelFormat.name: 'sklearn' is not supported")


def test_sticky_apply_failure_lasts_for_its_generation() -> None:
    isvc = load("predictor")
    failure = {"type": "Ready", "status": "False", "reason": status.APPLY_FAILED, "message": "refused"}
    isvc["status"] = {**status.compute(isvc, {}, NOW, failure), "observedGeneration": 1}
    assert status.sticky_failure(isvc) == failure
    isvc["metadata"]["generation"] = 2
    assert status.sticky_failure(isvc) is None


def test_removed_component_is_cleared() -> None:
    isvc = load("transformer")
    isvc["status"] = status.compute(isvc, {}, NOW)
    del isvc["spec"]["transformer"]
    st = status.compute(isvc, {}, NOW)
    assert st["components"]["transformer"] is None
    assert status.changed(isvc["status"], st)


def mutate(stem: str, path: str, value: object) -> dict:
    isvc = copy.deepcopy(load(stem))
    *parents, last = path.split(".")
    node = isvc
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return isvc


# (example, path to set, value, field named in the error)
INVALID = [
    ("predictor", "metadata.name", "Resnet", "metadata.name"),
    ("predictor", "metadata.name", "a" * 52, "metadata.name"),
    ("predictor", "spec.predictor.model.modelFormat.name", "tensorflow", "spec.predictor.model.modelFormat.name"),
    ("predictor", "spec.predictor.model.runtime", "kserve-mlserver", "spec.predictor.model.runtime"),
    ("predictor", "spec.predictor.model.storageUri", "s3://bucket/model", "spec.predictor.model.storageUri"),
    ("predictor", "spec.predictor.model.storageUri", "pvc:///path", "spec.predictor.model.storageUri"),
    ("predictor", "spec.predictor.model.storageUri", "ftp://host/m", "spec.predictor.model.storageUri"),
    ("predictor", "spec.predictor.model.storageUri", "", "spec.predictor.model.storageUri"),
    ("predictor", "spec.predictor.minReplicas", 4, "spec.predictor.maxReplicas"),
    ("predictor", "spec.predictor.sklearn", {"storageUri": "gs://x"}, "spec.predictor.sklearn"),
    ("predictor", "spec.predictor.containers", [{"image": "x"}], "spec.predictor"),
    ("predictor", "spec.predictor.volumes", [{"name": "ovserve-models", "emptyDir": {}}], "spec.predictor.volumes[0].name"),
    ("explainer", "spec.explainer.alibi", {"type": "AnchorTabular"}, "spec.explainer.alibi"),
    ("transformer", "spec.transformer.containers", [], "spec.transformer.containers"),
]


@pytest.mark.parametrize("stem,path,value,field", INVALID, ids=[f"{i[1]}={str(i[2])[:12]}" for i in INVALID])
def test_invalid_specs_name_the_field(stem: str, path: str, value: object, field: str) -> None:
    isvc = mutate(stem, path, value)
    if path == "spec.predictor.minReplicas":
        isvc["spec"]["predictor"]["maxReplicas"] = 2
    with pytest.raises(validation.Invalid) as err:
        validation.check(isvc)
    assert err.value.field == field
    assert str(err.value).startswith(field + ": ")


@pytest.mark.parametrize("stem", sorted(p.stem for p in DATA.glob("*.yaml")))
def test_examples_are_valid(stem: str) -> None:
    validation.check(load(stem))


@pytest.mark.parametrize("uri,expected", [
    ("pvc://store/a/b/", StoragePlan("pvc", "store", "a/b")),
    ("pvc://store", StoragePlan("pvc", "store", "")),
    ("https://h/m.tgz", StoragePlan("http", "https://h/m.tgz")),
    ("file:///srv/m/", StoragePlan("host", "/srv/m")),
    ("/srv/m", StoragePlan("host", "/srv/m")),
])
def test_storage_plans(uri: str, expected: StoragePlan) -> None:
    assert plan(uri) == expected


@pytest.mark.parametrize("uri,why", [("gs://b/m", "not supported"), ("pvc://Bad_Name/x", "claim name"),
                                     ("http:///m", "no host"), ("file://host/m", "file:///absolute"),
                                     ("/", "root folder"), ("relative/path", "unknown scheme")])
def test_bad_storage_uris_say_why(uri: str, why: str) -> None:
    with pytest.raises(BadStorageUri, match=why):
        plan(uri)
