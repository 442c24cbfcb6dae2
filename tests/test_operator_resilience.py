"""The operator converges after the faults a cluster really has (issue 15): the API server
restarting under it, and the operator itself killed in the middle of a reconcile.

Everything is real: etcd, kube-apiserver and kube-controller-manager on 127.0.0.1
(``tests/k8s.py``), the ``ovserve-operator`` process under the ServiceAccount of
``operator/rbac.yaml``. kube-apiserver is stopped and started again alone, on the
same port, with etcd keeping the state; the operator is killed with SIGKILL, so
none of its handlers finishes and none of kopf's bookkeeping is cleaned up. Every
wait has a deadline.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from . import k8s
from .k8s import ControlPlane
from .k8s_client import (
    Kube,
    Operator,
    deploy_path,
    eventually,
    example,
    isvc_path,
    operator_kubeconfig,
    roll_out,
    svc_path,
    wait_condition,
)

pytestmark = [pytest.mark.skipif(k8s.missing_reason() is not None, reason=k8s.missing_reason() or ""),
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]

#: Seconds the API server stays down: longer than kopf's first retries of a failed request
#: (1, 1, 2, 3 s), so every watch of the operator has failed and is backing off when it returns.
OUTAGE = 8
#: Seconds the operator may take to converge once the API server answers again.
CONVERGE = 25
#: The operator's periodic check of every InferenceService against its children (``--resync-seconds``),
#: short here so that a repair it makes shows within the test's deadlines.
RESYNC = "3"
KOPF_PREFIX = "ovserve.kopf.dev/"
#: kopf's annotations that stay for good: what it last handled, and the marker of its prefix.
KOPF_KEEPS = ("last-handled-configuration", "kopf-managed")


@pytest.fixture(scope="module")
def sa_config(cluster: ControlPlane, kube: Kube, crd: dict) -> Path:
    return operator_kubeconfig(cluster, kube)


@pytest.fixture
def operator(sa_config: Path, tmp_path: Path) -> Iterator[Operator]:
    """An operator process of its own for each test (the tests kill and restart it)."""
    op = Operator(sa_config, tmp_path, "--resync-seconds", RESYNC).start()
    yield op
    op.stop()


def full(ns: str, name: str) -> dict:
    """A predictor, a transformer and an explainer: seven children, applied one after another."""
    body = example("transformer", ns)
    body["metadata"]["name"] = name
    body["spec"]["explainer"] = example("explainer", ns)["spec"]["explainer"]
    return body


def expected(name: str) -> set[tuple[str, str]]:
    parts = [f"{name}-{c}" for c in ("predictor", "transformer", "explainer")]
    return {("Deployment", p) for p in parts} | {("Service", p) for p in parts} | {("Service", name)}


def owned(kube: Kube, ns: str) -> list[dict]:
    """Every Deployment and Service in the namespace, whoever made it."""
    out = []
    for kind, path in (("Deployment", f"/apis/apps/v1/namespaces/{ns}/deployments"),
                       ("Service", f"/api/v1/namespaces/{ns}/services")):
        out += [{**item, "kind": kind} for item in kube.get(path)["items"]]
    return out


def children_of(kube: Kube, ns: str, name: str) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in owned(kube, ns)
            if o["metadata"]["name"].startswith(name)}


def assert_converged(kube: Kube, ns: str, name: str) -> None:
    """Exactly the children the spec asks for, once each, each controlled by this InferenceService."""
    isvc = kube.get(isvc_path(ns, name))
    uid = isvc["metadata"]["uid"]
    kids = children_of(kube, ns, name)
    assert set(kids) == expected(name)
    for key, obj in kids.items():
        refs = obj["metadata"].get("ownerReferences") or []
        assert [(r["uid"], r.get("controller")) for r in refs] == [(uid, True)], key
    # kopf's bookkeeping: no finalizer (nothing blocks a deletion without the operator), and no
    # handler left in progress once it is done
    assert not isvc["metadata"].get("finalizers")
    def leftovers() -> dict:
        annotations = kube.get(isvc_path(ns, name))["metadata"].get("annotations") or {}
        return {k: v for k, v in annotations.items()
                if k.startswith(KOPF_PREFIX) and k.removeprefix(KOPF_PREFIX) not in KOPF_KEEPS}
    try:
        eventually(lambda: not leftovers(), 10, what="kopf's progress annotations cleared")
    except AssertionError:
        raise AssertionError(f"kopf's progress annotations left: {leftovers()}") from None


def within(operator: Operator, probe, what: str, timeout: float = CONVERGE):
    """``eventually``, with the operator's log in the failure."""
    try:
        return eventually(probe, timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n-- operator log --\n{operator.log()}") from None


def roll_out_all(kube: Kube, ns: str, name: str) -> None:
    for component in ("predictor", "transformer", "explainer"):
        roll_out(kube, ns, f"{name}-{component}")
    wait_condition(kube, ns, name, "Ready", "True", timeout=CONVERGE)


class DeploymentWatch:
    """A watch on the namespace's Deployments from the test itself: ``first`` is set as soon as
    the API server reports the first one created (milliseconds, where polling would take tens)."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.first = threading.Event()
        self.response = kube.session.get(f"{kube.url}/apis/apps/v1/namespaces/{ns}/deployments",
                                         params={"watch": "true"}, stream=True, verify=False, timeout=60)
        self.response.raise_for_status()  # headers come back at once: the watch is established
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for line in self.response.iter_lines():
                if line and json.loads(line)["type"] == "ADDED":
                    self.first.set()
                    return
        except (requests.RequestException, ValueError):
            pass

    def close(self) -> None:
        self.response.close()


def test_api_server_restart(kube: Kube, cluster: ControlPlane, operator: Operator, ns: str) -> None:
    kube.create(isvc_path(ns), example("predictor", ns))
    first = eventually(lambda: kube.get(deploy_path(ns, "resnet-predictor")), what="Deployment")
    roll_out(kube, ns, "resnet-predictor")
    wait_condition(kube, ns, "resnet", "Ready", "True")

    cluster.stop_api_server()
    mark = operator.logfile.stat().st_size
    time.sleep(OUTAGE)
    assert operator.proc.poll() is None, f"the operator exited with the API server gone:\n{operator.log()}"
    assert "Request attempt" in operator.logfile.read_text(errors="replace")[mark:], "the outage went unnoticed"
    cluster.start_api_server()

    # a change of spec, a child deleted, and a new InferenceService: all seen through the new watches
    kube.patch(isvc_path(ns, "resnet"), {"spec": {"predictor": {"model": {"args": ["--nireq", "4"]}}}})
    kube.delete(svc_path(ns, "resnet-predictor"))
    kube.create(isvc_path(ns), {**example("predictor", ns), "metadata": {"name": "after", "namespace": ns}})

    def updated() -> dict | None:
        dep = kube.get(deploy_path(ns, "resnet-predictor"))
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"] if dep else []
        return dep if args[-2:] == ["--nireq", "4"] else None
    dep = within(operator, updated, "the spec change applied")
    assert dep["metadata"]["uid"] == first["metadata"]["uid"]  # rolled in place, not recreated
    within(operator, lambda: kube.get(svc_path(ns, "resnet-predictor")), "the deleted Service recreated")
    wait_condition(kube, ns, "resnet", "PredictorReady", "Unknown", "RolloutPending", timeout=CONVERGE)
    roll_out(kube, ns, "resnet-predictor")
    wait_condition(kube, ns, "resnet", "Ready", "True", timeout=CONVERGE)
    assert kube.get(isvc_path(ns, "resnet"))["status"]["observedGeneration"] == 2
    within(operator, lambda: kube.get(deploy_path(ns, "after-predictor")), "the new InferenceService's child")
    wait_condition(kube, ns, "after", "Ready", "Unknown", timeout=CONVERGE)
    assert operator.proc.poll() is None

    # a child deleted later still comes back: the watches are live, not just the first list after the restart
    old = kube.get(deploy_path(ns, "after-predictor"))
    kube.delete(deploy_path(ns, "after-predictor"))
    within(operator, lambda: (d := kube.get(deploy_path(ns, "after-predictor"))) and
           d["metadata"]["uid"] != old["metadata"]["uid"], "the deleted Deployment recreated")


def test_a_child_deleted_while_the_watches_are_down(kube: Kube, cluster: ControlPlane, operator: Operator,
                                                   ns: str) -> None:
    """kube-apiserver SIGKILLed (its node died) and started again while the operator is frozen
    (SIGSTOP), and a child Deployment deleted before the operator runs again: the deletion lands
    while its watches are down, every time. The new API server's watch cache starts at the current
    revision, so their reconnect is answered 410 Gone and kopf lists again: without the Deployment,
    and without a DELETED event for it. Only the operator's periodic resync brings it back (with
    ``--resync-seconds 0`` this test fails)."""
    kube.create(isvc_path(ns), example("predictor", ns))
    old = eventually(lambda: kube.get(deploy_path(ns, "resnet-predictor")), what="Deployment")
    roll_out(kube, ns, "resnet-predictor")
    wait_condition(kube, ns, "resnet", "Ready", "True")
    operator.freeze()
    try:
        cluster.stop_api_server(kill=True)
        cluster.start_api_server()
        kube.delete(deploy_path(ns, "resnet-predictor"))
    finally:
        operator.thaw()
    within(operator, lambda: (d := kube.get(deploy_path(ns, "resnet-predictor"))) and
           d["metadata"]["uid"] != old["metadata"]["uid"], "the deleted Deployment recreated")
    wait_condition(kube, ns, "resnet", "PredictorReady", "Unknown", timeout=CONVERGE)
    roll_out(kube, ns, "resnet-predictor")
    wait_condition(kube, ns, "resnet", "Ready", "True", timeout=CONVERGE)
    assert operator.proc.poll() is None


def kill_mid_reconcile(kube: Kube, operator: Operator, ns: str, name: str) -> int:
    """Create ``name`` and SIGKILL the operator the moment its first child exists; the children there then."""
    watch = DeploymentWatch(kube, ns)
    try:
        kube.create(isvc_path(ns), full(ns, name))
        assert watch.first.wait(30), f"no child Deployment\n-- operator log --\n{operator.log()}"
        operator.kill()
    finally:
        watch.close()
    return len(children_of(kube, ns, name))


def test_killed_mid_reconcile(kube: Kube, operator: Operator, ns: str) -> None:
    # Where exactly the kill lands depends on the machine's speed: try a few InferenceServices until one
    # is caught with some of its seven children applied and some not.
    counts: dict[str, int] = {}
    for attempt in range(4):
        name = f"full-{attempt}"
        counts[name] = kill_mid_reconcile(kube, operator, ns, name)
        if 0 < counts[name] < len(expected(name)):
            break
        operator.start()
    assert any(0 < c < 7 for c in counts.values()), f"never killed mid-reconcile: children at the kill {counts}"

    # one more killed the same way, then deleted while no operator runs: nothing of kopf's (a finalizer)
    # blocks the deletion, and the garbage collector takes its children
    operator.start()
    kill_mid_reconcile(kube, operator, ns, "doomed")
    kube.delete(isvc_path(ns, "doomed"))
    eventually(lambda: kube.get(isvc_path(ns, "doomed")) is None, 10, what="deleted without an operator")
    eventually(lambda: not children_of(kube, ns, "doomed"), 60, what="its children garbage-collected")

    operator.start()  # a new process: it adopts what exists and finishes the rest
    for name in counts:
        within(operator, lambda name=name: set(children_of(kube, ns, name)) == expected(name), f"{name}: every child")
        wait_condition(kube, ns, name, "Ready", "Unknown", timeout=CONVERGE)
        assert_converged(kube, ns, name)
        roll_out_all(kube, ns, name)
        # a child's event may write Ready before the adopted reconcile has written the generation it saw
        status = eventually(lambda name=name: (s := kube.get(isvc_path(ns, name))["status"])
                            .get("observedGeneration") == 1 and s, CONVERGE, what=f"{name}: observedGeneration 1")
        assert {c["type"] for c in status["conditions"]} == {"PredictorReady", "TransformerReady", "ExplainerReady",
                                                             "Ready"}
    # nothing else was made: no duplicate, no orphan
    assert set(map(tuple, [(o["kind"], o["metadata"]["name"]) for o in owned(kube, ns)])) == \
        set().union(*(expected(name) for name in counts))

    # deleting them after all this collects everything
    for name in counts:
        kube.delete(isvc_path(ns, name))
    eventually(lambda: not owned(kube, ns), 60, what="every child garbage-collected")
