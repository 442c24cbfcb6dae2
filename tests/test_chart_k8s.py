"""``helm install`` into the real kube-apiserver of the operator tests, then the real
``ovserve-operator`` under the chart's own ServiceAccount, in both RBAC modes.

No kubelet runs here, so the chart's operator pod never starts: the test runs the
operator process on the host with the token of the ServiceAccount the chart created and
the arguments of the Deployment the chart installed (as the pod would), and checks that it
reconciles an InferenceService with no 403, and that ``helm uninstall`` removes the release.
"""
from __future__ import annotations

import base64
import os
import re
import subprocess
from pathlib import Path

import pytest

from . import k8s, tools
from .k8s import ControlPlane, kubeconfig
from .k8s_client import (
    Kube,
    Operator,
    deploy_path,
    eventually,
    example,
    isvc_path,
    roll_out,
    svc_path,
    wait_condition,
)

HELM, HELM_MISSING = tools.helm()
KUBECTL, KUBECTL_MISSING = tools.kubectl()
MISSING = k8s.missing_reason() or HELM_MISSING or KUBECTL_MISSING
pytestmark = [pytest.mark.skipif(MISSING is not None, reason=MISSING or ""),
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts/ovserve"
RELEASE_NS = "ovserve-system"
CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/inferenceservices.serving.kserve.io"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def run(cluster: ControlPlane, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(cluster.dir / "admin.kubeconfig"),
           "HELM_CACHE_HOME": str(cluster.dir / "helm"),
           "HELM_CONFIG_HOME": str(cluster.dir / "helm"), "HELM_DATA_HOME": str(cluster.dir / "helm")}
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    if check:
        assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stdout}\n{result.stderr}"
    return result


def helm(cluster: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(cluster, str(HELM), *args, check=check)


def install(cluster: ControlPlane, kube: Kube, release: str, *values: str) -> None:
    helm(cluster, "install", release, str(CHART), "--namespace", RELEASE_NS, "--create-namespace", *values)
    eventually(lambda: any(c["type"] == "Established" and c["status"] == "True"
                           for c in ((kube.get(CRD) or {}).get("status") or {}).get("conditions") or []),
               what="CRD established")
    eventually(lambda: kube.get(isvc_path("default")) is not None, what="CRD served")


def chart_operator(cluster: ControlPlane, kube: Kube, name: str, workdir: Path) -> Operator:
    """The operator as the chart's pod would run it: its ServiceAccount's token, its Deployment's args."""
    sa = eventually(lambda: (kube.get(f"/api/v1/namespaces/{RELEASE_NS}/serviceaccounts/{name}") or {}).get("secrets"),
                    what="service account token")
    secret = kube.get(f"/api/v1/namespaces/{RELEASE_NS}/secrets/{sa[0]['name']}")
    token = base64.b64decode(secret["data"]["token"]).decode()
    config = workdir / "sa.kubeconfig"
    config.write_text(kubeconfig(cluster.url, token))
    dep = kube.get(deploy_path(RELEASE_NS, name))
    assert dep, f"the chart's Deployment {name}"
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    args = [a for a in container["args"] if not a.startswith("--health-port")]  # the test picks a free port
    return Operator(config, workdir, *args).start()


def allowed(kube: Kube, sa: str, verb: str, group: str, resource: str, namespace: str = "",
            sub: str = "") -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": f"system:serviceaccount:{RELEASE_NS}:{sa}",
                       "groups": ["system:serviceaccounts", f"system:serviceaccounts:{RELEASE_NS}",
                                  "system:authenticated"],
                       "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                              "subresource": sub, "namespace": namespace}}}
    return kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)["status"].get("allowed", False)


# A refusal as the API server words it ("... is forbidden: User ...", reason Forbidden), as the
# operator's ApiError and kopf's APIForbiddenError print it, and kopf's fallback warnings.
REFUSED = re.compile(r"forbidden|API: 403\b|\bApiError\(403\b|code.{0,4}403\b|\b403\b.{0,3}(Forbidden|Client Error)"
                     r"|Not enough permissions", re.I)


def no_forbidden(op: Operator) -> None:
    log = op.logfile.read_text(errors="replace")
    match = REFUSED.search(log)
    assert not match, f"{match.group(0)!r} in the operator log:\n{log[-4000:]}"


def reconciles(kube: Kube, ns: str) -> None:
    """An InferenceService in ns gets its children and a status written by the operator."""
    kube.create(isvc_path(ns), example("predictor", ns))
    eventually(lambda: kube.get(deploy_path(ns, "resnet-predictor")), what=f"{ns}: predictor Deployment")
    eventually(lambda: kube.get(svc_path(ns, "resnet")), what=f"{ns}: entry Service")
    wait_condition(kube, ns, "resnet", "Ready", "Unknown")
    roll_out(kube, ns, "resnet-predictor")
    wait_condition(kube, ns, "resnet", "Ready", "True")
    assert kube.get(isvc_path(ns, "resnet"))["status"]["url"] == f"http://resnet.{ns}.svc.cluster.local"


def release_objects(kube: Kube, name: str, namespaces: list[str]) -> dict[str, dict | None]:
    paths = [f"/api/v1/namespaces/{RELEASE_NS}/serviceaccounts/{name}", deploy_path(RELEASE_NS, name),
             f"{RBAC}/clusterroles/{name}", f"{RBAC}/clusterrolebindings/{name}"]
    for ns in namespaces:
        paths += [f"{RBAC}/namespaces/{ns}/roles/{name}", f"{RBAC}/namespaces/{ns}/rolebindings/{name}"]
    return {p: kube.get(p) for p in paths}


def test_cluster_wide_install_reconciles_and_uninstalls(cluster: ControlPlane, kube: Kube, tmp_path: Path) -> None:
    install(cluster, kube, "ovserve")
    name = "ovserve-operator"
    assert all(release_objects(kube, name, []).values())
    listed = helm(cluster, "list", "--namespace", RELEASE_NS, "-o", "json").stdout
    assert '"name":"ovserve"' in listed and '"status":"deployed"' in listed
    # kubectl (the pinned one) sees what helm installed
    out = run(cluster, str(KUBECTL), "get", "deployment", name, "-n", RELEASE_NS, "-o", "name").stdout
    assert out.strip() == f"deployment.apps/{name}"

    assert allowed(kube, name, "watch", "serving.kserve.io", "inferenceservices", "anywhere")
    assert allowed(kube, name, "create", "apps", "deployments", "anywhere")
    assert allowed(kube, name, "get", "", "secrets", "anywhere")  # an s3:// predictor's credentials, by name
    assert not allowed(kube, name, "list", "", "secrets", "anywhere")
    assert not allowed(kube, name, "delete", "serving.kserve.io", "inferenceservices", "anywhere")

    kube.create("/api/v1/namespaces", {"metadata": {"name": "wide-a"}})
    op = chart_operator(cluster, kube, name, tmp_path)
    try:
        reconciles(kube, "wide-a")
        no_forbidden(op)
    finally:
        op.stop()

    helm(cluster, "uninstall", "ovserve", "--namespace", RELEASE_NS, "--wait", "--timeout", "60s")
    eventually(lambda: not any(release_objects(kube, name, []).values()), what="release objects removed")
    assert kube.get(CRD) is not None, "helm keeps CRDs on uninstall (documented)"


def test_namespaced_install_grants_only_the_watched_namespaces(cluster: ControlPlane, kube: Kube,
                                                              tmp_path: Path) -> None:
    for ns in ("team-a", "team-b", "outside"):
        kube.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    install(cluster, kube, "teams", "--set", "watchNamespaces={team-a,team-b}")
    name = "teams-ovserve-operator"
    assert all(release_objects(kube, name, ["team-a", "team-b"]).values())
    assert kube.get(f"{RBAC}/namespaces/outside/roles/{name}") is None

    for ns in ("team-a", "team-b"):
        assert allowed(kube, name, "create", "apps", "deployments", ns)
        assert allowed(kube, name, "patch", "serving.kserve.io", "inferenceservices", ns, "status")
    for ns in ("outside", ""):  # another namespace, and cluster-wide
        assert not allowed(kube, name, "list", "apps", "deployments", ns)
        assert not allowed(kube, name, "list", "serving.kserve.io", "inferenceservices", ns)
        assert not allowed(kube, name, "list", "", "pods", ns)
    assert allowed(kube, name, "watch", "", "namespaces")  # what kopf observes cluster-wide

    op = chart_operator(cluster, kube, name, tmp_path)
    try:
        assert "--namespace=team-a" in op.args and "--namespace=team-b" in op.args
        kube.create(isvc_path("outside"), example("predictor", "outside"))
        reconciles(kube, "team-a")
        reconciles(kube, "team-b")
        assert kube.get(deploy_path("outside", "resnet-predictor")) is None  # not watched, not touched
        assert "status" not in kube.get(isvc_path("outside", "resnet"))
        no_forbidden(op)
    finally:
        op.stop()

    helm(cluster, "uninstall", "teams", "--namespace", RELEASE_NS, "--wait", "--timeout", "60s")
    eventually(lambda: not any(release_objects(kube, name, ["team-a", "team-b"]).values()),
               what="release objects removed")


def test_upgrade_switches_between_rbac_modes(cluster: ControlPlane, kube: Kube) -> None:
    kube.create("/api/v1/namespaces", {"metadata": {"name": "team-c"}})
    install(cluster, kube, "switch")
    name = "switch-ovserve-operator"
    assert allowed(kube, name, "list", "apps", "deployments", "anywhere")

    helm(cluster, "upgrade", "switch", str(CHART), "--namespace", RELEASE_NS, "--set", "watchNamespaces={team-c}")
    eventually(lambda: not allowed(kube, name, "list", "apps", "deployments", "anywhere"),
               what="cluster-wide grant on deployments withdrawn")
    assert allowed(kube, name, "list", "apps", "deployments", "team-c")
    args = kube.get(deploy_path(RELEASE_NS, name))["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-c" in args

    helm(cluster, "upgrade", "switch", str(CHART), "--namespace", RELEASE_NS, "--reset-values")
    eventually(lambda: kube.get(f"{RBAC}/namespaces/team-c/roles/{name}") is None, what="Role removed")
    assert allowed(kube, name, "list", "apps", "deployments", "anywhere")
    helm(cluster, "uninstall", "switch", "--namespace", RELEASE_NS, "--wait", "--timeout", "60s")
