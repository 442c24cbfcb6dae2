"""e2e/bodies.py's end-to-end tests on kind, and what of the user's manifests can be checked without a cluster.

The shared tests run where Docker and kind are present (.github/workflows/e2e.yml runs this module there) and skip
with the reason elsewhere, as on the development machines; ``OVSERVE_E2E_KIND=1`` (the workflow sets it) makes a
missing Docker or kind a failure instead. The provider: ``kind create cluster`` (a node image pinned by digest,
with a folder of this machine mounted into the node for the hostPath PersistentVolume); both images built by
scripts/build_images.sh with docker on the Dockerfiles' pinned official base, ``docker save``d and ``kind load
image-archive``d; kubectl and helm pinned by scripts/tools.sh, with the cluster's kubeconfig; the clients in the
kind node container's network namespace (``nsenter --net``, as root or through ``sudo -n``), where kube-proxy
routes ClusterIPs to pods as on the test bed's node. kube-apiserver is not restarted here (a static pod inside the
node container): that test skips, saying so.

The other tests always run: the README's manifests (e2e/model-store.yaml, e2e/isvc.yaml) are validated (strict
Kubernetes schemas; the InferenceService against the CRD), and the model path is rehearsed for real on
127.0.0.1: the model store's own shell command builds and serves the archive, ``ovserve storage-initializer``
fetches it from the InferenceService's storageUri, ``ovserve serve`` runs with the predictor's arguments, and
``e2e/infer.py`` checks the V2 REST and gRPC answers.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from e2e.bodies import *  # noqa: F403 - the shared tests and fixtures (its __all__)
from e2e.bodies import SCRIPTS, Provider, run
from tests.servers import ServerProcess

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
K8S_VERSIONS = ["1.31", "1.34", "1.37"]
#: kind's node image: Kubernetes 1.35, built for kind v0.33.0 (the workflow's)
NODE_IMAGE = ("kindest/node:v1.35.8@sha256:07b2536e30b803ed61d1677a79df6115f798ce64c80f9e22f6ed45afd09323c0")
KIND_VERSION = "v0.33.0"
CLUSTER = os.environ.get("OVSERVE_E2E_CLUSTER", "ovserve-e2e")
#: where the node sees the folder for hostPath volumes (kind's extraMounts)
NODE_PV = "/ovserve-pv"

pytestmark = pytest.mark.timeout(3600)  # the first shared test waits for the cluster and both images' build


def kind_missing() -> str | None:
    if not shutil.which("kind"):
        return (f"kind is not installed (go install sigs.k8s.io/kind@{KIND_VERSION}); "
                ".github/workflows/e2e.yml runs this")
    if not shutil.which("docker"):
        return "docker is not installed"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "docker info timed out"
    if info.returncode != 0:
        return f"docker info failed (no Docker engine): {(info.stderr or info.stdout).strip().splitlines()[-1:]}"
    if os.geteuid() != 0 and subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False).returncode:
        return "entering the kind node's network namespace (nsenter) needs root or sudo without a password"
    return None


class Kind(Provider):
    """A throwaway kind cluster of one node."""

    api_server_restart_skip = ("kind runs kube-apiserver as a static pod inside its node container; the test bed's "
                               "cluster tier (e2e/test_cluster.py) stops and starts it")

    def __init__(self, tools: Path) -> None:
        self.tools = tools
        self.kubeconfig = Path()
        self.pv = Path()
        self.node_pid = ""

    def up(self, request: pytest.FixtureRequest, work: Path) -> str:
        self.kubeconfig = work / "kubeconfig"
        self.pv = work / "pv"
        self.pv.mkdir(mode=0o755)
        config = work / "kind.yaml"
        config.write_text(yaml.safe_dump({
            "kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4",
            "nodes": [{"role": "control-plane", "extraMounts": [{"hostPath": str(self.pv), "containerPath": NODE_PV}]}],
        }))
        run("kind", "delete", "cluster", "--name", CLUSTER, timeout=300)  # one a killed run left
        started = time.monotonic()
        run("kind", "create", "cluster", "--name", CLUSTER, "--image", NODE_IMAGE, "--config", config,
            "--kubeconfig", self.kubeconfig, "--wait", "180s", timeout=600)
        self.node_pid = run("docker", "inspect", "-f", "{{.State.Pid}}", f"{CLUSTER}-control-plane").strip()
        up = time.monotonic()
        # the chart's appVersion: the tag `helm install` deploys by default (the tests set it anyway)
        tag = yaml.safe_load((ROOT / "charts/ovserve/Chart.yaml").read_text())["appVersion"]
        refs = run("bash", SCRIPTS / "build_images.sh", "--engine", "docker", "--tag", tag, timeout=3000,
                   env={"PYTHON": sys.executable}).split()
        assert refs == [f"ovserve:{tag}", f"ovserve-operator:{tag}"], refs
        built = time.monotonic()
        archive = work / "images.tar"
        run("docker", "save", "-o", archive, *refs, timeout=600)
        run("kind", "load", "image-archive", archive, "--name", CLUSTER, timeout=900)
        archive.unlink()
        print(f"\nkind: cluster up in {up - started:.0f} s, images built in {built - up:.0f} s, "
              f"loaded in {time.monotonic() - built:.0f} s")
        return str(tag)

    def down(self) -> None:
        if os.environ.get("OVSERVE_E2E_KEEP") != "1":  # 1: kept to look around (kind delete cluster --name ...)
            subprocess.run(["kind", "delete", "cluster", "--name", CLUSTER], capture_output=True, timeout=300,
                           check=False)

    def control(self, argv: list[str]) -> tuple[list[str], dict[str, str]]:
        command = str(self.tools / "kubectl") if argv[0] == "kubectl" else argv[0]
        return [command, *argv[1:]], {"KUBECONFIG": str(self.kubeconfig)}

    def in_net(self, argv: list[str]) -> list[str]:
        sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
        return [*sudo, "nsenter", f"--net=/proc/{self.node_pid}/ns/net", "--", *argv]

    def helm(self) -> str:
        return str(self.tools / "helm")

    def hostpath(self) -> tuple[Path, str]:
        folder = self.pv / "models"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(mode=0o755)
        return folder, f"{NODE_PV}/models"


@pytest.fixture(scope="module")
def provider() -> Kind:
    reason = kind_missing()
    if reason is not None:
        if os.environ.get("OVSERVE_E2E_KIND") == "1":  # the workflow: kind must be there
            pytest.fail(reason)
        pytest.skip(reason)
    return Kind(Path(run("bash", SCRIPTS / "tools.sh", timeout=600).strip().splitlines()[-1]))


def manifests(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((HERE / name).read_text()) if d]


# -- runs everywhere: the README's manifests, and the model path without a cluster ----------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_model_store_manifests_are_valid_kubernetes(version: str) -> None:
    docs = manifests("model-store.yaml")
    assert [d["kind"] for d in docs] == ["Namespace", "Deployment", "Service"]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_model_store_runs_the_image_the_chart_deploys() -> None:
    app_version = yaml.safe_load((ROOT / "charts/ovserve/Chart.yaml").read_text())["appVersion"]
    (dep,) = [d for d in manifests("model-store.yaml") if d["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == f"ovserve:{app_version}"


def test_isvc_is_accepted_by_the_crd() -> None:
    crd = yaml.safe_load((ROOT / "crds/serving.kserve.io_inferenceservices.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    (isvc,) = manifests("isvc.yaml")
    jsonschema.validate(isvc, schema)
    uri = isvc["spec"]["predictor"]["model"]["storageUri"]
    assert urlsplit(uri).scheme == "http"
    (store,) = [d for d in manifests("model-store.yaml") if d["kind"] == "Service"]
    meta = store["metadata"]
    assert urlsplit(uri).netloc == f"{meta['name']}.{meta['namespace']}.svc.cluster.local:8000"


def test_workflow_runs_this_module_on_kind() -> None:
    """The workflow installs the kind this module's node image is built for, and runs the module with kind
    required (a missing Docker or kind fails there instead of skipping)."""
    flow = yaml.safe_load((ROOT / ".github/workflows/e2e.yml").read_text())
    steps = flow["jobs"]["kind"]["steps"]
    assert f"go install sigs.k8s.io/kind@{KIND_VERSION}" in "\n".join(s.get("run", "") for s in steps)
    (step,) = [s for s in steps if "e2e/test_kind.py" in s.get("run", "")]
    assert "-m pytest" in step["run"] and step["env"]["OVSERVE_E2E_KIND"] == "1", step
    assert flow["jobs"]["kind"]["timeout-minutes"] <= 90


def test_model_path_rehearsed_locally(tmp_path: Path) -> None:
    """The model store's command, the storage-initializer and the predictor's args, on 127.0.0.1."""
    (dep,) = [d for d in manifests("model-store.yaml") if d["kind"] == "Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["sh", "-c"]
    command = container["args"][0]
    assert "/srv" in command and "http.server 8000 --bind 0.0.0.0" in command
    command = command.replace("/srv", str(tmp_path / "srv")).replace("8000 --bind 0.0.0.0", "0 --bind 127.0.0.1")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONUNBUFFERED": "1"}
    store = subprocess.Popen(["sh", "-c", command], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    server = None
    try:
        port = None
        deadline = time.monotonic() + 120
        assert store.stdout is not None
        while port is None and time.monotonic() < deadline:
            line = store.stdout.readline()
            if not line and store.poll() is not None:
                raise AssertionError(f"model store exited with {store.returncode}")
            if m := re.search(r"Serving HTTP on \S+ port (\d+)", line):
                port = int(m.group(1))
        assert port, "the model store never served"

        (isvc,) = manifests("isvc.yaml")
        model = isvc["spec"]["predictor"]["model"]
        url = urlsplit(model["storageUri"])._replace(netloc=f"127.0.0.1:{port}").geturl()
        dest = tmp_path / "mnt-models"
        dest.mkdir()
        subprocess.run([str(Path(sys.executable).parent / "ovserve"), "storage-initializer", url, str(dest)],
                       check=True, capture_output=True, timeout=120)
        assert (dest / "1/model.xml").is_file() and (dest / "1/model.bin").is_file()

        name = isvc["metadata"]["name"]
        server = ServerProcess(["--model-name", name, "--model-path", str(dest), *model["args"]]).wait_ready()
        result = subprocess.run([sys.executable, str(HERE / "infer.py"), "--model", name,
                                 "--rest", f"127.0.0.1:{server.rest_port}", "--grpc", f"127.0.0.1:{server.grpc_port}"],
                                capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.count("[[4.5, 4.5], [10.5, 10.5]] (ok)") == 3, result.stdout  # REST, gRPC, V1
    finally:
        if server:
            server.stop()
        os.killpg(store.pid, 15)
        store.wait(30)


def test_every_shared_test_and_fixture_is_exported_in_definition_order() -> None:
    """e2e/bodies.py's ``__all__`` is what both providers' modules import and run, in its order (each test takes
    the cluster as the one before left it): a test or module fixture missing from it would run on neither."""
    import ast

    from e2e import bodies

    tree = ast.parse((HERE / "bodies.py").read_text())
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    fixtures = [f.name for f in functions if any("fixture" in ast.unparse(d) for d in f.decorator_list)]
    tests = [f.name for f in functions if f.name.startswith("test_")]
    assert bodies.__all__ == fixtures + tests
