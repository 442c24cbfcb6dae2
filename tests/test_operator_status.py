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
    (deployment(ready=1, Available=AVAILABLE, Progressing=("True", "NewReplicaSetAvailable", "")), "True",
     "MinimumReplicasAvailable"),
    (deployment(ready=0, Available=UNAVAILABLE, Progressing=("True", "ReplicaSetUpdated", "")), "Unknown",
     "MinimumReplicasUnavailable"),
    (deployment(ready=0, Available=UNAVAILABLE, Progressing=("True", "NewReplicaSetAvailable", "")), "False",
     "MinimumReplicasUnavailable"),
    (deployment(ready=0, Available=UNAVAILABLE, Progressing=("False", "ProgressDeadlineExceeded", "")), "False",
     "ProgressDeadlineExceeded"),
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


def pod(name: str = "resnet-predictor-7d9-abc", init: list[dict] | None = None, main: list[dict] | None = None,
        terminating: bool = False) -> dict:
    meta = {"name": name, "labels": {"component": "predictor"}}
    if terminating:
        meta["deletionTimestamp"] = NOW
    return {"metadata": meta, "status": {"initContainerStatuses": init or [], "containerStatuses": main or []}}


def waiting(reason: str, message: str = "", name: str = "kserve-container", **extra: object) -> dict:
    return {"name": name, "state": {"waiting": {"reason": reason, "message": message}}, **extra}


def running(name: str = "kserve-container") -> dict:
    return {"name": name, "state": {"running": {"startedAt": NOW}}, "ready": True}


def exited(code: int, reason: str = "Error", name: str = "storage-initializer", message: str = "") -> dict:
    term = {"exitCode": code, "reason": reason, **({"message": message} if message else {})}
    return {"name": name, "state": {"terminated": term}}


PULL_MSG = 'Back-off pulling image "registry.example.com/ovserve:nope"'
# (pod, expected (reason, words in the message) or None)
POD_CASES = [
    (pod(main=[waiting("ImagePullBackOff", PULL_MSG)]),
     ("ImagePullBackOff", ["pod resnet-predictor-7d9-abc", "container kserve-container", PULL_MSG])),
    (pod(main=[waiting("ErrImagePull", "manifest unknown")]), ("ErrImagePull", ["manifest unknown"])),
    (pod(main=[waiting("InvalidImageName", 'couldn\'t parse image reference "A:"')]),
     ("InvalidImageName", ["parse image"])),
    (pod(main=[waiting("CreateContainerConfigError", 'secret "creds" not found')]),
     ("CreateContainerConfigError", ['secret "creds" not found'])),
    (pod(main=[waiting("CrashLoopBackOff", "back-off 40s restarting failed container",
                       lastState={"terminated": {"exitCode": 3, "reason": "Error"}})]),
     ("CrashLoopBackOff", ["last exit code 3 (Error)", "back-off 40s"])),
    (pod(init=[waiting("ImagePullBackOff", PULL_MSG, name="storage-initializer")], main=[waiting("PodInitializing")]),
     ("ImagePullBackOff", ["init container storage-initializer", PULL_MSG])),
    (pod(init=[exited(1, message="404 Not Found: https://models.example.com/resnet.tar.gz")],
         main=[waiting("PodInitializing")]),
     ("Error", ["init container storage-initializer", "exited with code 1", "404 Not Found"])),
    (pod(init=[exited(0, reason="Completed")], main=[running()]), None),
    (pod(init=[running("storage-initializer")], main=[waiting("PodInitializing")]), None),
    (pod(main=[waiting("ContainerCreating")]), None),
    (pod(main=[running()]), None),
    (pod(), None),  # Pending, not scheduled: no container statuses yet
    (pod(main=[waiting("ImagePullBackOff", PULL_MSG)], terminating=True), None),
]


@pytest.mark.parametrize("p,want", POD_CASES, ids=range(len(POD_CASES)))
def test_container_problem(p: dict, want: tuple[str, list[str]] | None) -> None:
    got = status.container_problem(p)
    if want is None:
        assert got is None
        return
    assert got is not None and got[0] == want[0]
    for words in want[1]:
        assert words in got[1]


PULLING = pod(main=[waiting("ImagePullBackOff", PULL_MSG)])
HEALTHY = {"ready": 1, "Available": AVAILABLE, "Progressing": ("True", "NewReplicaSetAvailable", "")}


def rolled(dep: dict, replicas: int, updated: int) -> dict:
    dep["status"].update(replicas=replicas, updatedReplicas=updated)
    return dep


# (deployment, pods, expected status, expected reason)
FOLD_CASES = [
    (deployment(ready=0, Available=UNAVAILABLE, Progressing=("True", "ReplicaSetUpdated", "")), [PULLING],
     "False", "ImagePullBackOff"),
    (deployment(ready=0), [PULLING], "False", "ImagePullBackOff"),  # before the controller reports anything
    (deployment(generation=2, observed=1, ready=1, Available=AVAILABLE), [PULLING], "False", "ImagePullBackOff"),
    (deployment(ready=0, Available=UNAVAILABLE, Progressing=("False", "ProgressDeadlineExceeded", "")), [PULLING],
     "False", "ImagePullBackOff"),  # the cause, not the symptom
    # a rollout: the old pod serves, the new one cannot pull
    (rolled(deployment(**HEALTHY), replicas=2, updated=1), [PULLING, pod("resnet-predictor-old", main=[running()])],
     "False", "ImagePullBackOff"),
    # healthy and fully rolled out: a stale failing pod does not flip it
    (rolled(deployment(**HEALTHY), replicas=1, updated=1), [PULLING], "True", "MinimumReplicasAvailable"),
    (deployment(**HEALTHY), [PULLING], "True", "MinimumReplicasAvailable"),
    # terminating pods and healthy pods change nothing
    (deployment(ready=0, Available=UNAVAILABLE, Progressing=("True", "ReplicaSetUpdated", "")),
     [pod(main=[waiting("ImagePullBackOff")], terminating=True), pod("b", main=[waiting("ContainerCreating")])],
     "Unknown", "MinimumReplicasUnavailable"),
    (None, [PULLING], "Unknown", "DeploymentMissing"),
]


@pytest.mark.parametrize("dep,pods,want_status,want_reason", FOLD_CASES, ids=range(len(FOLD_CASES)))
def test_pod_problems_fold_into_the_component(dep: dict | None, pods: list[dict], want_status: str,
                                              want_reason: str) -> None:
    cond = status.component_condition("predictor", dep, pods)
    assert (cond["type"], cond["status"], cond["reason"]) == ("PredictorReady", want_status, want_reason)


def test_the_first_failing_pod_by_name_is_reported() -> None:
    pods = [pod("z", main=[waiting("CrashLoopBackOff", "back-off")]),
            pod("a", main=[waiting("ErrImagePull", "denied")])]
    cond = status.component_condition("predictor", deployment(ready=0), pods)
    assert (cond["reason"],
            cond["message"]) == ("ErrImagePull", "pod a, container kserve-container: ErrImagePull: denied")


def test_pod_problem_reaches_ready() -> None:
    isvc = load("transformer")
    ok = deployment(ready=1, Available=AVAILABLE)
    st = status.compute(isvc, {"predictor": ok, "transformer": deployment(ready=0)}, NOW,
                        pods={"transformer": [pod("classifier-transformer-1",
                                                  main=[waiting("ImagePullBackOff", PULL_MSG)])],
                              "predictor": [PULLING]})
    conds = {c["type"]: c for c in st["conditions"]}
    assert (conds["PredictorReady"]["status"], conds["TransformerReady"]["status"]) == ("True", "False")
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "ImagePullBackOff")
    assert conds["Ready"]["message"].startswith("TransformerReady: pod classifier-transformer-1, container ")


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
    ("predictor", "spec.predictor.model.storageUri", "hdfs://namenode/model", "spec.predictor.model.storageUri"),
    ("predictor", "spec.predictor.model.storageUri", "pvc:///path", "spec.predictor.model.storageUri"),
    ("predictor", "spec.predictor.model.storageUri", "ftp://host/m", "spec.predictor.model.storageUri"),
    ("predictor", "spec.predictor.model.storageUri", "", "spec.predictor.model.storageUri"),
    ("predictor", "spec.predictor.minReplicas", 4, "spec.predictor.maxReplicas"),
    ("predictor", "spec.predictor.sklearn", {"storageUri": "gs://x"}, "spec.predictor.sklearn"),
    ("predictor", "spec.predictor.containers", [{"image": "x"}], "spec.predictor"),
    ("predictor", "spec.predictor.volumes", [{"name": "ovserve-models", "emptyDir": {}}],
     "spec.predictor.volumes[0].name"),
    ("explainer", "spec.explainer.alibi", {"type": "AnchorTabular"}, "spec.explainer.alibi"),
    ("transformer", "spec.transformer.containers", [], "spec.transformer.containers"),
    ("predictor", "spec.predictor.model.protocolVersion", "v3", "spec.predictor.model.protocolVersion"),
    ("predictor", "spec.predictor.model.protocolVersion", "", "spec.predictor.model.protocolVersion"),
    ("predictor", "spec.predictor.model.protocolVersion", 2, "spec.predictor.model.protocolVersion"),
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


@pytest.mark.parametrize("protocol", ["v1", "v2", "grpc-v1", "grpc-v2"])
def test_every_protocol_kserve_knows_is_accepted(protocol: str) -> None:
    validation.check(mutate("predictor", "spec.predictor.model.protocolVersion", protocol))


def test_an_unknown_protocol_says_which_are_known() -> None:
    with pytest.raises(validation.Invalid) as err:
        validation.check(mutate("predictor", "spec.predictor.model.protocolVersion", "grpc-v3"))
    assert str(err.value) == (
        "spec.predictor.model.protocolVersion: 'grpc-v3' is not a protocol KServe knows (v1, v2, grpc-v1, grpc-v2); "
        "every ovserve predictor serves v1, v2 and grpc-v2, and grpc-v1 adds TorchServe's gRPC inference API")


# (protocolVersion, model.ports, field, words of the message): each declared port moves one listener the
# predictor has, and no two listeners share a container port (the server could not bind the second)
BAD_PORTS = [
    ("v2", [{"name": "grpc-ts", "containerPort": 7070}], "spec.predictor.model.ports[0].name",
     "'grpc-ts' names the TorchServe gRPC port, which only protocolVersion grpc-v1 has"),
    ("grpc-v1", [{"name": "grpc-ts", "containerPort": 7070}, {"name": "grpc-ts", "containerPort": 7071}],
     "spec.predictor.model.ports[1]", "a second TorchServe gRPC port (ports[0] is one)"),
    ("v2", [{"name": "http", "containerPort": 9080}, {"name": "metrics", "containerPort": 9090}],
     "spec.predictor.model.ports[1]", "a second REST port (ports[0] is one)"),
    ("grpc-v1", [{"name": "h2c", "containerPort": 7070}], "spec.predictor.model.ports",
     "the gRPC and TorchServe gRPC ports are both 7070"),  # KServe's TorchServe sample names 7070 h2c
    ("v2", [{"name": "http", "containerPort": 8081}], "spec.predictor.model.ports",
     "the REST and gRPC ports are both 8081"),
    ("grpc-v1", [{"name": "grpc-ts", "containerPort": 8080}], "spec.predictor.model.ports",
     "the REST and TorchServe gRPC ports are both 8080"),
]


@pytest.mark.parametrize("protocol,ports,field,words", BAD_PORTS, ids=[w for *_, w in BAD_PORTS])
def test_ports_that_cannot_be_served_are_refused(protocol: str, ports: list[dict], field: str, words: str) -> None:
    isvc = mutate("predictor", "spec.predictor.model.protocolVersion", protocol)
    isvc["spec"]["predictor"]["model"]["ports"] = ports
    with pytest.raises(validation.Invalid) as err:
        validation.check(isvc)
    assert err.value.field == field and words in err.value.reason
    # and how ports are told apart, unless the port is one the protocol does not have
    assert "one named grpc-ts the TorchServe gRPC port" in err.value.reason or "only protocolVersion" in words


def test_every_listener_can_be_moved() -> None:
    isvc = mutate("predictor", "spec.predictor.model.protocolVersion", "grpc-v1")
    isvc["spec"]["predictor"]["model"]["ports"] = [{"name": "web", "containerPort": 9080},
                                                   {"name": "grpc", "containerPort": 9081},
                                                   {"name": "grpc-ts", "containerPort": 9070}]
    validation.check(isvc)


@pytest.mark.parametrize("stem", sorted(p.stem for p in DATA.glob("*.yaml")))
def test_examples_are_valid(stem: str) -> None:
    validation.check(load(stem))


@pytest.mark.parametrize("uri,expected", [
    ("pvc://store/a/b/", StoragePlan("pvc", "store", "a/b")),
    ("pvc://store", StoragePlan("pvc", "store", "")),
    ("https://h/m.tgz", StoragePlan("http", "https://h/m.tgz")),
    ("s3://bucket/models/m", StoragePlan("s3", "s3://bucket/models/m")),
    ("gs://bucket/models/m", StoragePlan("gcs", "gs://bucket/models/m")),
    ("hf://OpenVINO/resnet-ov", StoragePlan("hf", "hf://OpenVINO/resnet-ov")),
    ("hf://OpenVINO/resnet-ov:v1.0", StoragePlan("hf", "hf://OpenVINO/resnet-ov:v1.0")),
    ("file:///srv/m/", StoragePlan("host", "/srv/m")),
    ("/srv/m", StoragePlan("host", "/srv/m")),
])
def test_storage_plans(uri: str, expected: StoragePlan) -> None:
    assert plan(uri) == expected


@pytest.mark.parametrize("uri,why", [("azure://b/m", "not supported"), ("s3:///m", "needs a bucket"),
                                     ("gs:///m", "needs a bucket"), ("hf://OpenVINO", "names a model repository"),
                                     ("hf://OpenVINO/resnet/1", "names a model repository"),
                                     ("pvc://Bad_Name/x", "claim name"),
                                     ("http:///m", "no host"), ("file://host/m", "file:///absolute"),
                                     ("/", "root folder"), ("relative/path", "unknown scheme")])
def test_bad_storage_uris_say_why(uri: str, why: str) -> None:
    with pytest.raises(BadStorageUri, match=why):
        plan(uri)
