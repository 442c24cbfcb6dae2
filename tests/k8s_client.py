"""Test-side helpers for the operator's API-server tests: a small REST client, waiting,
the operator process as users start it, service-account credentials, and playing the
deployment controller. Independent of the operator's own code."""
from __future__ import annotations

import base64
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from ovserve.server.child import free_ports, spawn

from .k8s import ControlPlane, kubeconfig

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data/isvc"
IMAGE = "registry.example.com/ovserve:test"
ISVC = "/apis/serving.kserve.io/v1beta1"
HPA = "/apis/autoscaling/v2beta2"  # what Kubernetes 1.20 serves (the operator finds it by discovery)


class Kube:
    """A tiny REST client for the tests (plain dicts over HTTPS), independent of the operator's code."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, body: object = None, content_type: str = "application/json",
             ok: tuple[int, ...] = (200, 201, 202)) -> dict:
        r = self.session.request(method, self.url + path, json=body, verify=False, timeout=30,
                                 headers={"Content-Type": content_type})
        if r.status_code not in ok:
            raise KubeError(r.status_code, r.text)
        return r.json() if r.content else {}

    def get(self, path: str) -> dict | None:
        try:
            return self.call("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, path: str, body: dict) -> dict:
        return self.call("POST", path, body)

    def patch(self, path: str, body: dict, kind: str = "merge") -> dict:
        return self.call("PATCH", path, body, content_type=f"application/{kind}-patch+json")

    def delete(self, path: str) -> None:
        self.call("DELETE", path, ok=(200, 202, 404))


class KubeError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"{status}: {text}")
        self.status = status
        self.text = text


def eventually(probe, timeout: float = 30, interval: float = 0.2, what: str = "condition"):
    """Call ``probe`` until it returns something truthy; fail with its last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what} not reached in {timeout}s; last: {last!r}")


def isvc_path(ns: str, name: str = "", sub: str = "") -> str:
    return "/".join(p for p in (f"{ISVC}/namespaces/{ns}/inferenceservices", name, sub) if p)


def deploy_path(ns: str, name: str, sub: str = "") -> str:
    return "/".join(p for p in (f"/apis/apps/v1/namespaces/{ns}/deployments", name, sub) if p)


def svc_path(ns: str, name: str) -> str:
    return f"/api/v1/namespaces/{ns}/services/{name}"


def hpa_path(ns: str, name: str) -> str:
    return f"{HPA}/namespaces/{ns}/horizontalpodautoscalers/{name}"


def example(stem: str, ns: str) -> dict:
    body = yaml.safe_load((DATA / f"{stem}.yaml").read_text())
    body["metadata"]["namespace"] = ns
    return body


def conditions(kube: Kube, ns: str, name: str) -> dict[str, dict]:
    obj = kube.get(isvc_path(ns, name)) or {}
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}


def wait_condition(kube: Kube, ns: str, name: str, type_: str, status: str, reason: str | None = None,
                   timeout: float = 20) -> dict:
    def probe() -> dict | None:
        c = conditions(kube, ns, name).get(type_)
        return c if c and c["status"] == status and (reason is None or c["reason"] == reason) else None
    return eventually(probe, timeout, what=f"{name}: {type_}={status} {reason or ''}")


def roll_out(kube: Kube, ns: str, name: str, ready: bool = True) -> None:
    """Do what the deployment controller and kubelet would: report the Deployment's pods."""
    dep = kube.get(deploy_path(ns, name))
    assert dep, name
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    want = dep["spec"].get("replicas", 1)
    count = want if ready else 0
    conds = [{"type": "Available", "status": "True" if ready else "False", "lastUpdateTime": now,
              "lastTransitionTime": now,
              "reason": "MinimumReplicasAvailable" if ready else "MinimumReplicasUnavailable",
              "message": "Deployment has minimum availability." if ready
              else "Deployment does not have minimum availability."},
             {"type": "Progressing", "status": "True", "lastUpdateTime": now, "lastTransitionTime": now,
              "reason": "NewReplicaSetAvailable", "message": f'ReplicaSet "{name}-1" has successfully progressed.'}]
    kube.patch(deploy_path(ns, name, "status"), {"status": {
        "observedGeneration": dep["metadata"]["generation"], "replicas": want, "updatedReplicas": want,
        "readyReplicas": count, "availableReplicas": count, "conditions": conds}})


def ensure(kube: Kube, path: str, body: dict) -> None:
    try:
        kube.create(path, body)
    except KubeError as exc:
        if exc.status != 409:
            raise


def service_account_kubeconfig(cluster: ControlPlane, kube: Kube, name: str, rules: list[dict]) -> Path:
    """A ServiceAccount in ovserve-system bound to a ClusterRole with ``rules``; its token's kubeconfig."""
    ns = "ovserve-system"
    ensure(kube, "/api/v1/namespaces", {"metadata": {"name": ns}})
    ensure(kube, f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": name}})
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    ensure(kube, f"{rbac}/clusterroles", {"metadata": {"name": name}, "rules": rules})
    ensure(kube, f"{rbac}/clusterrolebindings", {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]})
    secret = eventually(lambda: (kube.get(f"/api/v1/namespaces/{ns}/serviceaccounts/{name}") or {}).get("secrets"),
                        what="service account token")[0]["name"]
    token = base64.b64decode(kube.get(f"/api/v1/namespaces/{ns}/secrets/{secret}")["data"]["token"]).decode()
    path = cluster.dir / f"{name}.kubeconfig"
    path.write_text(kubeconfig(cluster.url, token))
    return path


def operator_kubeconfig(cluster: ControlPlane, kube: Kube) -> Path:
    """Credentials of the operator's ServiceAccount, bound to the rules of ``operator/rbac.yaml``."""
    rules = yaml.safe_load((ROOT / "operator/rbac.yaml").read_text())["rules"]
    return service_account_kubeconfig(cluster, kube, "ovserve-operator", rules)


class Operator:
    """``ovserve-operator`` as a user starts it: the console script, a kubeconfig, any working directory."""

    def __init__(self, kubeconfig: Path, workdir: Path, *args: str) -> None:
        self.kubeconfig, self.workdir, self.args = kubeconfig, workdir, args
        self.proc: subprocess.Popen | None = None
        self.logfile = workdir / "operator.log"

    def start(self) -> Operator:
        (self.port,) = free_ports(1)  # kopf's health endpoint cannot report a port 0 back
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["KUBECONFIG"] = str(self.kubeconfig)
        exe = Path(sys.executable).parent / "ovserve-operator"
        with open(self.logfile, "ab") as log:
            self.proc = spawn([str(exe), "--health-host", "127.0.0.1", "--health-port", str(self.port),
                               "--server-image", IMAGE, "--verbose", *self.args],
                              env=env, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT)
        eventually(self.healthy, 60, what=f"operator /healthz\n{self.log()}")
        return self

    def healthy(self) -> bool:
        assert self.proc and self.proc.poll() is None, f"operator exited:\n{self.log()}"
        try:
            return requests.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def log(self) -> str:
        return self.logfile.read_text(errors="replace")[-6000:] if self.logfile.exists() else ""

    def freeze(self) -> None:
        """SIGSTOP: the process does nothing (no request, no reconnect) until ``thaw``."""
        assert self.proc and self.proc.poll() is None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: no handler finishes, nothing is cleaned up (a node lost, the OOM killer)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # in case a test left it frozen
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- fixtures (registered by tests/conftest.py's pytest_plugins; module-scoped: a control plane per module) --
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A fresh control plane for one test module."""
    plane = ControlPlane(tmp_path_factory.mktemp("k8s"))
    plane.start()
    yield plane
    plane.stop()


@pytest.fixture(scope="module")
def kube(cluster: ControlPlane) -> Kube:
    """The API as cluster admin."""
    return Kube(cluster.url, cluster.admin_token)


@pytest.fixture(scope="module")
def crd(kube: Kube) -> dict:
    """The InferenceService CRD, installed, established and served."""
    body = yaml.safe_load((ROOT / "crds/serving.kserve.io_inferenceservices.yaml").read_text())
    kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body)
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/inferenceservices.serving.kserve.io"
    eventually(lambda: any(c["type"] == "Established" and c["status"] == "True"
                           for c in ((kube.get(path) or {}).get("status") or {}).get("conditions") or []),
               what="CRD established")
    eventually(lambda: kube.get(isvc_path("default")) is not None, what="CRD served")
    return body


def namespace_for(test: str) -> str:
    """A test's name as a namespace's (an RFC 1123 label): lower case, dashes, at most 40 characters; a longer
    one (or a parametrized one) cut and made unique by a digest of the whole name."""
    words = re.sub(r"[^a-z0-9]+", "-", test.removeprefix("test_").lower()).strip("-")
    if len(words) <= 40:
        return words
    return words[:31].strip("-") + "-" + hashlib.sha1(test.encode()).hexdigest()[:8]


@pytest.fixture
def ns(kube: Kube, request: pytest.FixtureRequest) -> str:
    """A fresh namespace named after the test."""
    name = "t-" + namespace_for(request.node.name)
    kube.create("/api/v1/namespaces", {"metadata": {"name": name}})
    return name
