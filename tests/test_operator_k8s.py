"""The real ``ovserve-operator`` process against a real kube-apiserver (no mocks).

The control plane (etcd, kube-apiserver, kube-controller-manager for garbage
collection and service-account tokens) runs on 127.0.0.1 for this module; the
operator runs as users start it, ``ovserve-operator`` with a kubeconfig, under
a ServiceAccount bound to the ClusterRole in ``operator/rbac.yaml``. No kubelet
runs, so the tests play the deployment controller: they patch each child
Deployment's ``status`` (and, for pod problems, create a pod and patch its
``status`` as a kubelet would) and watch the InferenceService's conditions follow.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from . import k8s
from .k8s import ControlPlane
from .k8s_client import (
    DATA,
    IMAGE,
    ISVC,
    Kube,
    KubeError,
    Operator,
    conditions,
    deploy_path,
    eventually,
    example,
    hpa_path,
    isvc_path,
    operator_kubeconfig,
    roll_out,
    service_account_kubeconfig,
    svc_path,
    wait_condition,
)

pytestmark = [pytest.mark.skipif(k8s.missing_reason() is not None, reason=k8s.missing_reason() or ""),
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]

ROOT = Path(__file__).resolve().parent.parent


# -- the control plane, the CRD, the operator -------------------------------------


@pytest.fixture(scope="module")
def operator(cluster: ControlPlane, kube: Kube, crd: dict,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    op = Operator(operator_kubeconfig(cluster, kube), tmp_path_factory.mktemp("operator-cwd")).start()
    yield op
    op.stop()


# -- the tests ----------------------------------------------------------------------


def test_crd_is_served_with_short_name(kube: Kube, crd: dict) -> None:
    resources = kube.get(ISVC)["resources"]
    isvc = next(r for r in resources if r["name"] == "inferenceservices")
    assert isvc["shortNames"] == ["isvc"] and isvc["namespaced"]
    assert any(r["name"] == "inferenceservices/status" for r in resources)


@pytest.mark.parametrize("path", sorted((DATA / "bad").glob("*.yaml")), ids=lambda p: p.stem)
def test_api_server_refuses_bad_objects(kube: Kube, crd: dict, path: Path) -> None:
    body = yaml.safe_load(path.read_text())
    with pytest.raises(KubeError) as err:
        kube.create(isvc_path("default"), body)
    assert err.value.status == 422
    assert "spec." in err.value.text  # the message names the field


def test_predictor_and_transformer_become_ready(kube: Kube, operator: Operator, ns: str) -> None:
    created = kube.create(isvc_path(ns), example("transformer", ns))
    uid = created["metadata"]["uid"]
    predictor = eventually(lambda: kube.get(deploy_path(ns, "classifier-predictor")), what="predictor Deployment")
    transformer = eventually(lambda: kube.get(deploy_path(ns, "classifier-transformer")), what="transformer Deployment")
    for dep, component in ((predictor, "predictor"), (transformer, "transformer")):
        assert dep["metadata"]["ownerReferences"][0]["uid"] == uid
        assert dep["metadata"]["labels"]["serving.kserve.io/inferenceservice"] == "classifier"
        assert dep["spec"]["template"]["metadata"]["labels"]["component"] == component
    server = predictor["spec"]["template"]["spec"]["containers"][0]
    assert server["image"] == IMAGE
    assert server["args"][:5] == ["serve", "--model-name", "classifier", "--model-path", "/mnt/models"]
    assert [p["name"] for p in server["ports"]] == ["http", "h2c"]
    assert server["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    init = predictor["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"][:2] == ["ovserve", "storage-initializer"]
    wiring = transformer["spec"]["template"]["spec"]["containers"][0]["args"]
    assert wiring[wiring.index("--predictor_host") + 1] == f"classifier-predictor.{ns}"
    entry = eventually(lambda: kube.get(svc_path(ns, "classifier")), what="entry Service")
    assert entry["spec"]["selector"]["component"] == "transformer"
    h2c = kube.get(svc_path(ns, "classifier-predictor"))["spec"]["ports"][1]
    assert (h2c["name"], h2c["port"], h2c.get("appProtocol")) == ("h2c", 8081, "kubernetes.io/h2c")

    wait_condition(kube, ns, "classifier", "Ready", "Unknown")
    started = time.monotonic()
    roll_out(kube, ns, "classifier-predictor")
    wait_condition(kube, ns, "classifier", "PredictorReady", "True", "MinimumReplicasAvailable")
    assert conditions(kube, ns, "classifier")["Ready"]["status"] == "Unknown"
    roll_out(kube, ns, "classifier-transformer")
    wait_condition(kube, ns, "classifier", "Ready", "True")
    assert time.monotonic() - started < 15, "child status should reach the InferenceService within seconds"
    status = kube.get(isvc_path(ns, "classifier"))["status"]
    assert status["url"] == f"http://classifier.{ns}.svc.cluster.local" == status["address"]["url"]
    assert status["components"]["transformer"]["url"] == f"http://classifier-transformer.{ns}.svc.cluster.local"
    assert status["observedGeneration"] == created["metadata"]["generation"]
    assert set(conditions(kube, ns, "classifier")) == {"PredictorReady", "TransformerReady", "Ready"}


def test_explainer_on_a_claim(kube: Kube, operator: Operator, ns: str) -> None:
    kube.create(isvc_path(ns), example("explainer", ns))
    predictor = eventually(lambda: kube.get(deploy_path(ns, "income-predictor")), what="predictor")
    pod = predictor["spec"]["template"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "model-store", "readOnly": True}
    assert "initContainers" not in pod
    explainer = eventually(lambda: kube.get(deploy_path(ns, "income-explainer")), what="explainer")
    args = explainer["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["--model_name", "income", "--predictor_host", f"income-predictor.{ns}", "--http_port", "9000"]
    wait_condition(kube, ns, "income", "ExplainerReady", "Unknown")
    roll_out(kube, ns, "income-explainer")
    wait_condition(kube, ns, "income", "ExplainerReady", "True")
    assert conditions(kube, ns, "income")["Ready"]["status"] == "Unknown"
    roll_out(kube, ns, "income-predictor")
    wait_condition(kube, ns, "income", "Ready", "True")
    assert set(conditions(kube, ns, "income")) == {"PredictorReady", "ExplainerReady", "Ready"}


def test_failed_rollout_shows_the_childs_reason(kube: Kube, operator: Operator, ns: str) -> None:
    kube.create(isvc_path(ns), example("predictor", ns))
    eventually(lambda: kube.get(deploy_path(ns, "resnet-predictor")), what="Deployment")
    roll_out(kube, ns, "resnet-predictor")
    wait_condition(kube, ns, "resnet", "Ready", "True")
    dep = kube.get(deploy_path(ns, "resnet-predictor"))
    kube.patch(deploy_path(ns, "resnet-predictor", "status"), {"status": {
        "observedGeneration": dep["metadata"]["generation"], "readyReplicas": 0, "availableReplicas": 0,
        "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                        "message": 'ReplicaSet "resnet-predictor-1" has timed out progressing.'},
                       {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
                        "message": "Deployment does not have minimum availability."}]}}, kind="strategic-merge")
    cond = wait_condition(kube, ns, "resnet", "PredictorReady", "False", "ProgressDeadlineExceeded")
    assert "timed out progressing" in cond["message"]
    ready = wait_condition(kube, ns, "resnet", "Ready", "False", "ProgressDeadlineExceeded")
    assert ready["message"].startswith("PredictorReady: ")


def pod_path(ns: str, name: str = "", sub: str = "") -> str:
    return "/".join(p for p in (f"/api/v1/namespaces/{ns}/pods", name, sub) if p)


def container(name: str, **state: dict) -> dict:
    ready = "running" in state
    return {"name": name, "image": IMAGE, "imageID": "", "ready": ready, "restartCount": 0, "state": state}


def test_image_pull_errors_show_at_once(kube: Kube, operator: Operator, ns: str) -> None:
    """No kubelet here: the test creates the pod a ReplicaSet would and reports what a kubelet would."""
    kube.create(isvc_path(ns), example("predictor", ns))
    dep = eventually(lambda: kube.get(deploy_path(ns, "resnet-predictor")), what="Deployment")
    template = dep["spec"]["template"]
    name = "resnet-predictor-5f7d8c9b6-x2x7k"
    kube.create(pod_path(ns), {"metadata": {"name": name, "labels": {**template["metadata"]["labels"],
                                                                      "pod-template-hash": "5f7d8c9b6"}},
                               "spec": template["spec"]})
    wait_condition(kube, ns, "resnet", "Ready", "Unknown")
    pulling = f'Back-off pulling image "{IMAGE}"'
    started = time.monotonic()
    kube.patch(pod_path(ns, name, "status"), {"status": {
        "phase": "Pending",
        "initContainerStatuses": [container("storage-initializer", terminated={"exitCode": 0, "reason": "Completed"})],
        "containerStatuses": [container("kserve-container",
                                        waiting={"reason": "ImagePullBackOff", "message": pulling})]}})
    cond = wait_condition(kube, ns, "resnet", "PredictorReady", "False", "ImagePullBackOff", timeout=10)
    assert time.monotonic() - started < 10, "a pod's problem should reach the InferenceService within seconds"
    assert cond["message"] == f"pod {name}, container kserve-container: ImagePullBackOff: {pulling}"
    ready = wait_condition(kube, ns, "resnet", "Ready", "False", "ImagePullBackOff")
    assert ready["message"] == f"PredictorReady: {cond['message']}"

    # the storage-initializer failing is reported the same way
    kube.patch(pod_path(ns, name, "status"), {"status": {
        "initContainerStatuses": [container("storage-initializer", terminated={
            "exitCode": 1, "reason": "Error", "message": "404 Not Found"})],
        "containerStatuses": [container("kserve-container", waiting={"reason": "PodInitializing"})]}})
    cond = wait_condition(kube, ns, "resnet", "PredictorReady", "False", "Error", timeout=10)
    assert cond["message"] == (f"pod {name}, init container storage-initializer: Error: exited with code 1: "
                               "404 Not Found")

    # the image pulls: back to what the Deployment says, then Ready when it reports availability
    kube.patch(pod_path(ns, name, "status"), {"status": {
        "phase": "Running",
        "initContainerStatuses": [container("storage-initializer", terminated={"exitCode": 0, "reason": "Completed"})],
        "containerStatuses": [container("kserve-container", running={"startedAt": "2026-01-01T00:00:00Z"})]}})
    wait_condition(kube, ns, "resnet", "PredictorReady", "Unknown", timeout=10)
    roll_out(kube, ns, "resnet-predictor")
    wait_condition(kube, ns, "resnet", "Ready", "True")

    # a healthy, fully rolled-out Deployment wins over a stale failing pod ...
    kube.patch(pod_path(ns, name, "status"), {"status": {
        "phase": "Pending",
        "containerStatuses": [container("kserve-container", waiting={"reason": "ErrImagePull", "message": "denied"})]}})
    time.sleep(2)
    assert conditions(kube, ns, "resnet")["PredictorReady"]["status"] == "True"
    # ... but not a rollout whose new pod cannot pull
    kube.patch(deploy_path(ns, "resnet-predictor", "status"), {"status": {"replicas": 2, "updatedReplicas": 1}})
    wait_condition(kube, ns, "resnet", "PredictorReady", "False", "ErrImagePull", timeout=10)
    # the failing pod goes: recovery from its deletion event alone
    kube.delete(pod_path(ns, name))
    wait_condition(kube, ns, "resnet", "PredictorReady", "True", "MinimumReplicasAvailable", timeout=10)
    wait_condition(kube, ns, "resnet", "Ready", "True")


def test_s3_credentials_come_from_the_service_account_secrets(kube: Kube, operator: Operator, ns: str) -> None:
    """KServe's documented Secret and ServiceAccount, applied as users do: the storage initializer gets the
    variables (the keys by reference), the server container none of them."""
    kube.create(f"/api/v1/namespaces/{ns}/secrets", {
        "metadata": {"name": "s3creds", "annotations": {"serving.kserve.io/s3-endpoint": "minio.store.svc:9000",
                                                        "serving.kserve.io/s3-usehttps": "0",
                                                        "serving.kserve.io/s3-region": "us-east-2"}},
        "type": "Opaque", "stringData": {"AWS_ACCESS_KEY_ID": "XXXX", "AWS_SECRET_ACCESS_KEY": "YYYYYYYY"}})
    kube.create(f"/api/v1/namespaces/{ns}/serviceaccounts",
                {"metadata": {"name": "sa"}, "secrets": [{"name": "missing"}, {"name": "s3creds"}]})
    body = example("predictor", ns)
    body["spec"]["predictor"]["serviceAccountName"] = "sa"
    body["spec"]["predictor"]["model"]["storageUri"] = "s3://models/resnet"
    kube.create(isvc_path(ns), body)
    pod = eventually(lambda: kube.get(deploy_path(ns, "resnet-predictor")),
                     what="predictor")["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    assert init["command"] == ["ovserve", "storage-initializer", "s3://models/resnet", "/mnt/models"]
    key = {"secretKeyRef": {"name": "s3creds", "key": "AWS_ACCESS_KEY_ID"}}
    assert init["env"][0] == {"name": "AWS_ACCESS_KEY_ID", "valueFrom": key}
    assert {v["name"]: v.get("value") for v in init["env"][2:]} == {
        "S3_USE_HTTPS": "0", "S3_ENDPOINT": "minio.store.svc:9000", "AWS_ENDPOINT_URL": "http://minio.store.svc:9000",
        "AWS_DEFAULT_REGION": "us-east-2"}
    assert pod["serviceAccountName"] == "sa" and "AWS_" not in str(pod["containers"])
    wait_condition(kube, ns, "resnet", "Ready", "Unknown")


def test_a_gcs_key_and_a_hub_token_come_from_the_service_account_secrets(kube: Kube, operator: Operator,
                                                                         ns: str) -> None:
    """KServe's GCS Secret (the key file) and a token Secret: the API server takes the pod with the Secret
    volume mounted on the storage initializer alone."""
    kube.create(f"/api/v1/namespaces/{ns}/secrets", {
        "metadata": {"name": "gcscreds"}, "type": "Opaque",
        "stringData": {"gcloud-application-credentials.json": '{"type": "service_account"}'}})
    kube.create(f"/api/v1/namespaces/{ns}/secrets", {
        "metadata": {"name": "hf-secret"}, "type": "Opaque", "stringData": {"HF_TOKEN": "hf_xxxx"}})
    kube.create(f"/api/v1/namespaces/{ns}/serviceaccounts",
                {"metadata": {"name": "gsa"}, "secrets": [{"name": "gcscreds"}, {"name": "hf-secret"}]})
    body = example("predictor", ns)
    body["metadata"]["name"] = "gresnet"
    body["spec"]["predictor"]["serviceAccountName"] = "gsa"
    body["spec"]["predictor"]["model"]["storageUri"] = "gs://models/resnet"
    kube.create(isvc_path(ns), body)
    pod = eventually(lambda: kube.get(deploy_path(ns, "gresnet-predictor")),
                     what="predictor")["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    assert init["command"] == ["ovserve", "storage-initializer", "gs://models/resnet", "/mnt/models"]
    assert init["env"] == [
        {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/var/secrets/gcloud-application-credentials.json"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-secret", "key": "HF_TOKEN"}}}]
    assert {"name": "user-gcp-sa", "mountPath": "/var/secrets/", "readOnly": True} in init["volumeMounts"]
    assert {"name": "user-gcp-sa", "secret": {"secretName": "gcscreds", "defaultMode": 420}} in pod["volumes"]
    assert "user-gcp-sa" not in str(pod["containers"])


def test_invalid_specs_are_refused_with_a_condition(kube: Kube, operator: Operator, ns: str) -> None:
    bad_format = example("predictor", ns)
    bad_format["metadata"]["name"] = "wrong-format"
    bad_format["spec"]["predictor"]["model"]["modelFormat"]["name"] = "sklearn"
    bad_uri = example("predictor", ns)
    bad_uri["metadata"]["name"] = "wrong-uri"
    bad_uri["spec"]["predictor"]["model"]["storageUri"] = "hdfs://namenode/model"
    kube.create(isvc_path(ns), bad_format)
    kube.create(isvc_path(ns), bad_uri)
    ready = wait_condition(kube, ns, "wrong-format", "Ready", "False", "InvalidSpec")
    assert ready["message"].startswith("spec.predictor.model.modelFormat.name: 'sklearn' is not supported")
    ready = wait_condition(kube, ns, "wrong-uri", "Ready", "False", "InvalidSpec")
    assert ready["message"].startswith("spec.predictor.model.storageUri: 'hdfs://namenode/model': hdfs:// is not "
                                       "supported")
    assert kube.get(deploy_path(ns, "wrong-format-predictor")) is None
    assert kube.get(deploy_path(ns, "wrong-uri-predictor")) is None
    # fixing the spec brings the children
    kube.patch(isvc_path(ns, "wrong-uri"), {"spec": {"predictor": {"model": {"storageUri": "pvc://store/m"}}}})
    eventually(lambda: kube.get(deploy_path(ns, "wrong-uri-predictor")), what="Deployment after the fix")
    wait_condition(kube, ns, "wrong-uri", "Ready", "Unknown")


def test_api_refusal_of_a_child_is_reported(kube: Kube, operator: Operator, ns: str) -> None:
    body = example("transformer", ns)
    body["spec"]["transformer"]["containers"][0]["env"] = [{"name": "", "value": "x"}]
    body["spec"]["transformer"]["containers"][0]["env"][0]["name"] = "NOT VALID="
    kube.create(isvc_path(ns), body)
    ready = wait_condition(kube, ns, "classifier", "Ready", "False", "ApplyFailed")
    assert "env[0].name" in ready["message"]



def test_updates_roll_in_place_and_removed_parts_go(kube: Kube, operator: Operator, ns: str) -> None:
    kube.create(isvc_path(ns), example("predictor", ns))
    first = eventually(lambda: kube.get(deploy_path(ns, "resnet-predictor")), what="Deployment")
    roll_out(kube, ns, "resnet-predictor")
    wait_condition(kube, ns, "resnet", "Ready", "True")

    kube.patch(isvc_path(ns, "resnet"), {"spec": {"predictor": {"minReplicas": 1, "maxReplicas": 3,
                                                                "model": {"args": ["--nireq", "4"]}}}})
    hpa = eventually(lambda: kube.get(hpa_path(ns, "resnet-predictor")), what="HPA")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 3)
    assert hpa["spec"]["metrics"][0]["resource"]["target"] == {"type": "Utilization", "averageUtilization": 80}
    dep = kube.get(deploy_path(ns, "resnet-predictor"))
    assert dep["metadata"]["uid"] == first["metadata"]["uid"] and dep["metadata"]["generation"] == 2
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == ["--nireq", "4"]
    wait_condition(kube, ns, "resnet", "PredictorReady", "Unknown", "RolloutPending")
    roll_out(kube, ns, "resnet-predictor")
    wait_condition(kube, ns, "resnet", "Ready", "True")
    assert kube.get(isvc_path(ns, "resnet"))["status"]["observedGeneration"] == 2

    kube.patch(isvc_path(ns, "resnet"), {"spec": {"transformer": {"containers": [{"image": "example.com/t:1"}]}}})
    eventually(lambda: kube.get(deploy_path(ns, "resnet-transformer")), what="transformer")
    eventually(lambda: kube.get(svc_path(ns, "resnet"))["spec"]["selector"]["component"] == "transformer",
               what="entry Service on the transformer")
    wait_condition(kube, ns, "resnet", "TransformerReady", "Unknown")

    kube.patch(isvc_path(ns, "resnet"), {"spec": {"transformer": None, "predictor": {"maxReplicas": None}}})
    eventually(lambda: kube.get(deploy_path(ns, "resnet-transformer")) is None, what="transformer Deployment gone")
    eventually(lambda: kube.get(svc_path(ns, "resnet-transformer")) is None, what="transformer Service gone")
    eventually(lambda: kube.get(hpa_path(ns, "resnet-predictor")) is None, what="HPA gone")
    eventually(lambda: kube.get(svc_path(ns, "resnet"))["spec"]["selector"]["component"] == "predictor",
               what="entry Service back on the predictor")
    eventually(lambda: "TransformerReady" not in conditions(kube, ns, "resnet"), what="TransformerReady gone")
    assert "transformer" not in kube.get(isvc_path(ns, "resnet"))["status"]["components"]
    assert kube.get(deploy_path(ns, "resnet-predictor"))["spec"]["replicas"] == 1


def test_deleted_child_is_recreated(kube: Kube, operator: Operator, ns: str) -> None:
    kube.create(isvc_path(ns), example("predictor", ns))
    old = eventually(lambda: kube.get(deploy_path(ns, "resnet-predictor")), what="Deployment")
    kube.delete(deploy_path(ns, "resnet-predictor"))
    new = eventually(lambda: (d := kube.get(deploy_path(ns, "resnet-predictor"))) and
                     d["metadata"]["uid"] != old["metadata"]["uid"] and d, what="Deployment recreated")
    assert new["spec"]["template"] == old["spec"]["template"]


@pytest.mark.parametrize("name", ["resnet-predictor", "resnet"], ids=["component", "entry"])
def test_deleted_service_made_again(kube: Kube, operator: Operator, ns: str, name: str) -> None:
    """The operator watches its Services as it watches its Deployments: a deleted one (the component's, or the
    InferenceService's own entry Service) is made again within seconds, not at the next resync (a minute)."""
    kube.create(isvc_path(ns), example("predictor", ns))
    old = eventually(lambda: kube.get(svc_path(ns, name)), what="Service")
    time.sleep(0.5)  # past the create's own events
    kube.delete(svc_path(ns, name))
    new = eventually(lambda: (s := kube.get(svc_path(ns, name))) and s["metadata"]["uid"] != old["metadata"]["uid"]
                     and s, timeout=15, what="Service made again")
    assert new["spec"]["ports"] == old["spec"]["ports"] and new["spec"]["selector"] == old["spec"]["selector"]


def test_delete_collects_every_child(kube: Kube, operator: Operator, ns: str) -> None:
    kube.create(isvc_path(ns), example("autoscale", ns))
    children = [deploy_path(ns, "busy-predictor"), svc_path(ns, "busy-predictor"), svc_path(ns, "busy"),
                hpa_path(ns, "busy-predictor")]
    for path in children:
        eventually(lambda path=path: kube.get(path), what=path)
    kube.delete(isvc_path(ns, "busy"))
    for path in children:  # the garbage collector follows the owner references
        eventually(lambda path=path: kube.get(path) is None, timeout=60, what=f"{path} collected")


def snapshot(kube: Kube, ns: str) -> dict[str, str]:
    paths = [deploy_path(ns, "classifier-predictor"), deploy_path(ns, "classifier-transformer"),
             svc_path(ns, "classifier"), svc_path(ns, "classifier-predictor"), svc_path(ns, "classifier-transformer")]
    versions = {p: kube.get(p)["metadata"]["resourceVersion"] for p in paths}
    isvc = kube.get(isvc_path(ns, "classifier"))
    versions["isvc.status"] = repr(isvc["status"])
    versions["isvc.spec"] = repr(isvc["spec"])
    return versions


def test_restart_changes_nothing(kube: Kube, operator: Operator, ns: str) -> None:
    kube.create(isvc_path(ns), example("transformer", ns))
    for name in ("classifier-predictor", "classifier-transformer"):
        eventually(lambda name=name: kube.get(deploy_path(ns, name)), what=name)
        roll_out(kube, ns, name)
    wait_condition(kube, ns, "classifier", "Ready", "True")
    time.sleep(1)  # let the child events of the roll-out settle
    before = snapshot(kube, ns)
    operator.stop()
    mark = operator.logfile.stat().st_size
    operator.start()
    eventually(lambda: f"[{ns}/classifier] Resuming is processed" in operator.logfile.read_text()[mark:],
               what="resume handled")
    time.sleep(2)
    assert snapshot(kube, ns) == before


def test_role_grants_what_the_operator_needs_and_no_more(kube: Kube, operator: Operator) -> None:
    user = "system:serviceaccount:ovserve-system:ovserve-operator"

    def allowed(verb: str, group: str, resource: str, sub: str = "") -> bool:
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": user, "groups": ["system:serviceaccounts"],
                           "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                                  "subresource": sub, "namespace": "anywhere"}}}
        return kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)["status"].get("allowed", False)

    for verb in ("create", "patch", "delete", "list", "watch"):
        assert allowed(verb, "apps", "deployments"), verb
    for verb in ("create", "patch", "delete", "list"):
        assert allowed(verb, "", "services") and allowed(verb, "autoscaling", "horizontalpodautoscalers"), verb
    assert allowed("patch", "serving.kserve.io", "inferenceservices", "status")
    assert allowed("watch", "serving.kserve.io", "inferenceservices")
    # an s3:// predictor's ServiceAccount and the Secrets it lists, one by one (never a list or a watch)
    assert allowed("get", "", "serviceaccounts") and allowed("get", "", "secrets")
    assert not allowed("list", "", "secrets") and not allowed("watch", "", "secrets")
    assert not allowed("delete", "serving.kserve.io", "inferenceservices")
    for verb in ("get", "list", "watch"):
        assert allowed(verb, "", "pods"), verb
    assert not allowed("create", "", "pods") and not allowed("patch", "", "pods")


def test_a_missing_permission_fails_and_namespace_restricts(kube: Kube, cluster: ControlPlane, operator: Operator,
                                                            ns: str, tmp_path: Path) -> None:
    rules = yaml.safe_load((ROOT / "operator/rbac.yaml").read_text())["rules"]
    without_hpa = [r for r in rules if "horizontalpodautoscalers" not in r["resources"]]
    config = service_account_kubeconfig(cluster, kube, "ovserve-operator-no-hpa", without_hpa)
    kube.create("/api/v1/namespaces", {"metadata": {"name": ns + "-other"}})
    operator.stop()
    limited = Operator(config, tmp_path, "--namespace", ns).start()
    try:
        kube.create(isvc_path(ns), example("autoscale", ns))
        kube.create(isvc_path(ns + "-other"), example("predictor", ns + "-other"))
        eventually(lambda: kube.get(deploy_path(ns, "busy-predictor")), what="Deployment")
        eventually(lambda: "horizontalpodautoscalers" in limited.log() and "403" in limited.log(), what="a 403 logged")
        assert kube.get(hpa_path(ns, "busy-predictor")) is None
        assert kube.get(deploy_path(ns + "-other", "resnet-predictor")) is None  # not watched
    finally:
        limited.stop()
        operator.start()
    # the full role (the chart's) then completes both
    eventually(lambda: kube.get(hpa_path(ns, "busy-predictor")), what="HPA with the full role")
    eventually(lambda: kube.get(deploy_path(ns + "-other", "resnet-predictor")), what="other namespace handled")
