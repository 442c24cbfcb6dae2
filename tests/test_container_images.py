"""The two images, built and run: the `images` tier.

``scripts/build_images.sh`` builds both Dockerfiles once per run with buildah (chroot isolation, vfs storage)
from a clean export of the checkout (the files git tracks) on the local stand-in base that
``scripts/image_testbed.sh`` makes and caches in ``~/.cache/ovserve/images`` (``scripts/test.sh`` calls it;
where it cannot, or buildah/podman are missing, the tier skips with the reason). Then, with podman:

- the build logs have no ``ERROR`` line; the images carry the docker-format HEALTHCHECK, the numeric user,
  the labels;
- the server image, one container serving the demo models and a slow model mounted read-only at
  /mnt/models on ports set by flags (not 8080/8081): uid 10001 as PID 1, the environment read-only to it,
  no pip anywhere, every command on its PATH working, V2 REST and gRPC inference right, ``podman
  healthcheck run`` healthy on that port, and SIGTERM (``podman stop``) while a slow inference runs: the
  inference answers right and the server exits 0;
- ``storage-initializer`` in the image fetches a model archive from an http server on 127.0.0.1 into a
  volume; the transformer in the image, in front of the predictor container, answers the predictor's result
  (and its HEALTHCHECK follows its KServe-style ``--http_port``);
- the operator image: ``ovserve-operator --help``, and every command on its PATH works (no ``ovserve`` that
  needs numpy).

Containers share the host's network (127.0.0.1 only) and start with the flags this machine needs (cgroupfs,
runc, explicit ulimits: no systemd, no CAP_SYS_RESOURCE). The images are removed at the end (vfs keeps
full copies).
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import tomllib
import tritonclient.grpc as tgrpc
from packaging.utils import canonicalize_name

from ovserve.server.child import free_ports

from . import image_build, models
from .image_build import Images

ROOT = Path(__file__).resolve().parent.parent
CACHE, STORAGE_CONF, STAND_IN, BASE, ENV = (image_build.CACHE, image_build.STORAGE_CONF, image_build.STAND_IN,
                                          image_build.BASE, image_build.ENV)
PODMAN = ["podman", "--cgroup-manager", "cgroupfs", "--runtime", "runc", "--events-backend", "file"]
RUN = ["run", "--network", "host", "--ulimit", "nofile=16384:16384", "--ulimit", "nproc=8192:8192"]
HOST = "127.0.0.1"
UID = 10001
PACKAGE_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
#: rows of the slow model's request in flight at SIGTERM (about a second of work on two cores)
SLOW_ROWS = 2048
#: the slow model's line on /metrics while one inference is in process
IN_PROCESS = 'ovms_current_requests{name="slow",version="1"} 1'
#: the demo `linear` model: y = x @ W + b
LINEAR_X = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
LINEAR_Y = np.array([[4.5, 4.5], [10.5, 10.5]], np.float32)


def missing_reason() -> str | None:
    for tool in ("buildah", "podman", "runc"):
        if not shutil.which(tool):
            return f"{tool} is missing: scripts/image_testbed.sh installs it (scripts/test.sh runs it)"
    if BASE != STAND_IN:
        return None  # a registry's image: the build pulls it (and fails, saying why, where it cannot)
    if not STORAGE_CONF.is_file():
        return f"no image test bed in {CACHE}: run scripts/image_testbed.sh (scripts/test.sh does)"
    found = subprocess.run(["buildah", "inspect", "--type", "image", BASE], env=ENV, capture_output=True, timeout=60,
                           check=False)
    if found.returncode != 0:
        return f"no base image {BASE} in {CACHE}: run scripts/image_testbed.sh"
    return None


pytestmark = [pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason())),
              # the first test waits for both builds (80-120 s here, more where the package index is slow)
              pytest.mark.timeout(1500)]


def run(*argv: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(argv), env=ENV, capture_output=True, text=True, timeout=timeout, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out


def podman(*argv: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(*PODMAN, *argv, timeout=timeout, check=check)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> None:
    """Containers and images of runs that were killed before their teardown (vfs keeps a full copy of each)."""
    names = podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split()
    for name in names:
        m = re.fullmatch(r"ovserve-test-(\d+)-\w+", name)
        if m and not alive(int(m.group(1))):
            podman("rm", "-f", "-t", "0", name, check=False)
    refs = run("buildah", "images", "--format", "{{.Name}}:{{.Tag}}", check=False).stdout.split()
    for ref in refs:
        m = re.fullmatch(r"localhost/ovserve(-operator)?:test-(\d+)", ref)
        if m and not alive(int(m.group(2))):
            run("buildah", "rmi", "-f", ref, check=False)


@pytest.fixture(scope="module")
def images(request: pytest.FixtureRequest) -> Images:
    """Both images, built once per session (tests/image_build.py; the cluster tier runs the same ones)."""
    remove_leftovers()
    return image_build.shared(request)


def inspect(ref: str) -> dict:
    return json.loads(run("buildah", "inspect", "--type", "image", ref).stdout)


@pytest.mark.parametrize("image", ["server", "operator"])
def test_build_log_has_no_error_lines(images: Images, image: str) -> None:
    log = (images.logs / f"build-{image}.log").read_text()
    errors = [line for line in log.splitlines() if "ERROR" in line]
    assert not errors, "\n".join(errors)
    if image == "server":  # pip check, in the build: the lock holds every requirement of both wheels
        assert "No broken requirements found." in log


@pytest.mark.parametrize("image", ["server", "operator"])
def test_image_config(images: Images, image: str) -> None:
    ref = getattr(images, image)
    config = inspect(ref)["Docker"]["config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Labels"]["org.opencontainers.image.base.name"] == BASE
    assert config["Labels"]["org.opencontainers.image.version"] == PACKAGE_VERSION  # not the run's own tag
    if image == "server":
        assert config["Healthcheck"]["Test"] == ["CMD", "ovserve", "health"], config.get("Healthcheck")
        assert config["Entrypoint"] == ["ovserve"]
    else:
        assert config["Entrypoint"] == ["ovserve-operator"]
    size = int(podman("image", "inspect", "--format", "{{.Size}}", ref).stdout)
    print(f"\n{ref}: {size / 1e6:.0f} MB")


def lock(name: str) -> dict[str, str]:
    """requirements/<name>.txt as package -> version."""
    text = (ROOT / "requirements" / f"{name}.txt").read_text()
    return {canonicalize_name(n): v for n, v in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$", text, re.M)}


def sbom_of(ref: str) -> dict[str, str]:
    """The image's /opt/ovserve/sbom.cdx.json (CycloneDX) as package -> version, checked for its form."""
    root = podman("image", "mount", ref).stdout.strip()  # the image's files, read without a container
    try:
        doc = json.loads((Path(root) / "opt/ovserve/sbom.cdx.json").read_text())
    finally:
        podman("image", "unmount", ref, check=False)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"].startswith("1."), doc.get("specVersion")
    found = {canonicalize_name(c["name"]): c["version"] for c in doc["components"]}
    # a package URL for each from PyPI; the two built from the checkout come from no index, so have none
    for c in doc["components"]:
        local = canonicalize_name(c["name"]) in ("ovserve", "ovserve-client")
        assert ("purl" not in c) if local else c["purl"].startswith("pkg:pypi/"), c
    return found


@pytest.mark.parametrize("image", ["server", "operator"])
def test_sbom_lists_exactly_what_the_image_installed(images: Images, image: str) -> None:
    """Every package of the lock at its locked version, and the two built from the checkout; nothing else."""
    expected = {**lock(image), "ovserve": PACKAGE_VERSION, "ovserve-client": PACKAGE_VERSION}
    assert sbom_of(getattr(images, image)) == expected


# -- the server image, one running container ---------------------------------------------------------


def readable(path: Path) -> Path:
    """A host folder uid 10001 can read in the container (pytest's own are root's alone)."""
    for p in [path, *path.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return path


@pytest.fixture(scope="module")
def model_repo() -> Iterator[Path]:
    """The demo models (`ovserve demo`) and the slow model, in a folder of their own outside pytest's."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="ovserve-images-"))
    folder.chmod(0o755)
    repo = folder / "models"
    subprocess.run([sys.executable, "-m", "ovserve.server", "demo", str(repo)], check=True,
                   capture_output=True, timeout=120)
    models.save(models.slow(1), repo, "slow")
    yield readable(repo)
    shutil.rmtree(folder, ignore_errors=True)


class Container:
    def __init__(self, name: str, rest: int, grpc: int) -> None:
        self.name, self.rest, self.grpc = name, rest, grpc

    def logs(self) -> str:
        out = podman("logs", self.name, check=False)
        return out.stdout + out.stderr

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://{HOST}:{self.rest}/v2/health/ready", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            state = podman("inspect", "--format", "{{.State.Status}}", self.name, check=False).stdout.strip()
            if state not in ("running", "created", "configured"):
                raise AssertionError(f"{self.name} is {state}:\n{self.logs()}")
            time.sleep(0.5)
        raise AssertionError(f"{self.name} not ready in {timeout} s:\n{self.logs()}")

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *argv, check=check)

    def exit_code(self) -> int:
        return int(podman("inspect", "--format", "{{.State.ExitCode}}", self.name).stdout.strip())


def start(ref: str, name: str, *args: str, volumes: tuple[str, ...] = ()) -> None:
    podman("rm", "-f", name, check=False)
    podman(*RUN, "-d", "--name", name, *(f"-v={v}" for v in volumes), ref, *args)


@pytest.fixture(scope="module")
def server(images: Images, model_repo: Path) -> Iterator[Container]:
    """`ovserve serve` in the image, the repository read-only at /mnt/models, ports by flag (not the defaults)."""
    rest, grpc = free_ports(2)
    c = Container(f"ovserve-test-{os.getpid()}-server", rest, grpc)
    start(images.server, c.name, "serve", "--model-repository", "/mnt/models", "--host", HOST,
          "--rest-port", str(rest), "--grpc-port", str(grpc), "--metrics-enable",
          volumes=(f"{model_repo}:/mnt/models:ro",))
    try:
        c.wait_ready()
        yield c
    finally:
        podman("rm", "-f", "-t", "0", c.name, check=False)


def test_runs_as_10001_with_a_read_only_environment_and_no_pip(server: Container) -> None:
    assert server.exec("id", "-u").stdout.strip() == str(UID)
    # PID 1 is the server itself, as that user
    status = server.exec("cat", "/proc/1/status").stdout
    assert f"Uid:\t{UID}\t" in status and "ovserve" in server.exec("cat", "/proc/1/cmdline").stdout
    for path in ("/opt/ovserve/bin", "/opt/ovserve/lib/python3.11/site-packages", "/mnt/models"):
        touched = server.exec("touch", f"{path}/.w", check=False)
        said = touched.stdout + touched.stderr
        assert touched.returncode != 0 and ("ermission denied" in said or "Read-only" in said), (path, said)
    found = server.exec("python", "-c", "import importlib.util as u; print([m for m in ('pip', 'setuptools', "
                        "'wheel') if u.find_spec(m)])").stdout.strip()
    assert found == "[]", found
    assert server.exec("sh", "-c", "command -v pip pip3 || true").stdout.strip() == ""
    assert server.exec("sh", "-c", "ls /opt/build /src 2>&1 || true").stdout.count("No such file") == 2


def path_commands_work(c_exec: list[str]) -> dict[str, str]:
    """Every executable file in /opt/ovserve/bin (the PATH the image adds) run with --help: name -> failure (not
    the __pycache__ folder pip leaves there for jmespath's jp.py, the s3 extra's)."""
    script = ("for f in /opt/ovserve/bin/*; do [ -f \"$f\" ] && [ -x \"$f\" ] || continue; "
              "case \"$(basename \"$f\")\" in python*|activate*) continue;; esac; "
              "if out=$(\"$f\" --help 2>&1 </dev/null); then echo \"ok $(basename \"$f\")\"; "
              "else echo \"failed $(basename \"$f\"): $(echo \"$out\" | tail -n 1)\"; fi; done")
    out = podman(*c_exec, "sh", "-c", script, timeout=300).stdout
    ran = dict(line.split(" ", 1)[::-1] for line in out.splitlines() if line.startswith("ok "))
    failed = {line.split(":")[0].split()[1]: line for line in out.splitlines() if line.startswith("failed ")}
    assert ran, out
    return {**dict.fromkeys(ran, ""), **failed}


def test_every_command_on_the_server_images_path_works(server: Container) -> None:
    commands = path_commands_work(["exec", server.name])
    failed = {k: v for k, v in commands.items() if v}
    assert not failed, failed
    assert {"ovserve", "ovserve-infer"} <= set(commands) and "ovserve-operator" not in commands


def test_v2_rest_and_grpc_inference(server: Container) -> None:
    body = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": LINEAR_X.ravel().tolist()}]}
    answer = requests.post(f"http://{HOST}:{server.rest}/v2/models/linear/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(np.array(answer.json()["outputs"][0]["data"]).reshape(2, 2), LINEAR_Y, rtol=1e-5)
    client = tgrpc.InferenceServerClient(f"{HOST}:{server.grpc}")
    try:
        x = tgrpc.InferInput("x", [2, 3], "FP32")
        x.set_data_from_numpy(LINEAR_X)
        np.testing.assert_allclose(client.infer("linear", [x]).as_numpy("y"), LINEAR_Y, rtol=1e-5)
        assert client.is_server_live() and client.is_model_ready("add_one")
    finally:
        client.close()


def test_healthcheck_healthy_on_the_port_of_a_flag(server: Container) -> None:
    assert server.rest != 8080
    checked = podman("healthcheck", "run", server.name, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    said = server.exec("ovserve", "health").stdout
    assert f"http://127.0.0.1:{server.rest}/v2/health/live: 200" in said


# -- the other components in the server image ---------------------------------------------------------


@pytest.fixture
def archives(model_repo: Path, tmp_path: Path) -> Iterator[str]:
    """linear's version folders as linear.zip and linear.tar.gz behind an http server on 127.0.0.1; yields
    the server's URL."""
    served = tmp_path / "served"
    served.mkdir()
    with tarfile.open(served / "linear.tar.gz", "w:gz") as tar:
        for version in (model_repo / "linear").iterdir():
            tar.add(version, arcname=version.name)
    with zipfile.ZipFile(served / "linear.zip", "w") as zf:
        for path in (model_repo / "linear").rglob("*"):
            zf.write(path, path.relative_to(model_repo / "linear").as_posix())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer((HOST, 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://{HOST}:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def storage_initializer(image: str, url: str, volume: Path) -> subprocess.CompletedProcess[str]:
    return podman(*RUN, "--rm", f"-v={volume}:/mnt/models", image, "storage-initializer", url, "/mnt/models",
                  timeout=300, check=False)


def test_storage_initializer_fills_a_volume_over_http(images: Images, server: Container, archives: str,
                                                      model_repo: Path, tmp_path: Path) -> None:
    """A zip everywhere; a tar.gz where the image's Python has tar extraction filters (the official base's
    3.11.14 has; the stand-in's Debian 3.11.2 has not, and the refusal must say so, not crash)."""
    filters = server.exec("python", "-c", "import tarfile; print(hasattr(tarfile, 'data_filter'))").stdout
    for name in ("linear.zip", "linear.tar.gz"):
        volume = tmp_path / name.replace(".", "-")
        volume.mkdir()
        os.chown(volume, UID, UID)  # an emptyDir the pod's user owns
        fetched = storage_initializer(images.server, f"{archives}/{name}", volume)
        if name.endswith(".tar.gz") and filters.strip() != "True":
            assert fetched.returncode == 1, fetched.stderr
            assert "no tar extraction filters: unpacking a tar needs Python" in fetched.stderr, fetched.stderr
            assert "Traceback" not in fetched.stderr, fetched.stderr
            continue
        assert fetched.returncode == 0, fetched.stderr
        for xml in (model_repo / "linear").glob("*/model.xml"):
            got = volume / xml.relative_to(model_repo / "linear")
            assert got.read_bytes() == xml.read_bytes(), got
            assert got.stat().st_uid == UID


def test_transformer_in_front_of_the_predictor(images: Images, server: Container) -> None:
    (rest,) = free_ports(1)
    t = Container(f"ovserve-test-{os.getpid()}-transformer", rest, 0)
    start(images.server, t.name, "transformer", "--model_name", "linear", "--predictor_host",
          f"{HOST}:{server.rest}", "--predictor_protocol", "v2", "--host", HOST, "--http_port", str(rest))
    try:
        t.wait_ready(60)
        body = {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": LINEAR_X.ravel().tolist()}]}
        answer = requests.post(f"http://{HOST}:{rest}/v2/models/linear/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(np.array(answer.json()["outputs"][0]["data"]).reshape(2, 2), LINEAR_Y, rtol=1e-5)
        checked = podman("healthcheck", "run", t.name, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    finally:
        podman("rm", "-f", "-t", "0", t.name, check=False)


def test_sigterm_drains_the_slow_inference_and_exits_0(server: Container) -> None:
    """Last of the server's tests: it stops the shared container."""
    x = (np.arange(SLOW_ROWS * models.SLOW_K, dtype=np.float32) % 97).reshape(SLOW_ROWS, models.SLOW_K)
    client = tgrpc.InferenceServerClient(f"{HOST}:{server.grpc}")
    try:
        inp = tgrpc.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(client.infer, "slow", [inp], client_timeout=120)
            # SIGTERM once the server counts the inference as in process (its /metrics says so), however loaded
            # the machine is: a stop before the request arrived would prove nothing (and refuse it)
            deadline = time.monotonic() + 60
            while IN_PROCESS not in requests.get(f"http://{HOST}:{server.rest}/metrics", timeout=5).text:
                assert not pending.done() and time.monotonic() < deadline, "the slow inference was never in process"
                time.sleep(0.02)
            podman("stop", "-t", "60", server.name, timeout=120)  # returns once the container has exited
            y = pending.result().as_numpy("y")
    finally:
        client.close()
    np.testing.assert_array_equal(y, models.slow_expected(x, 1))
    assert server.exit_code() == 0, server.logs()


# -- the operator image ----------------------------------------------------------------------------------


def test_operator_help_and_every_command_on_its_path(images: Images) -> None:
    """One container (each costs a full copy of the image under vfs): ovserve-operator, the ENTRYPOINT
    (test_image_config), is among the commands run with --help."""
    commands = path_commands_work([*RUN, "--rm", "--entrypoint", "", images.operator])
    failed = {k: v for k, v in commands.items() if v}
    assert not failed, failed
    assert "ovserve-operator" in commands and not {"ovserve", "ovserve-infer"} & set(commands)
