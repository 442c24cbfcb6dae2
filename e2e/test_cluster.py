"""The cluster tier: e2e/bodies.py's end-to-end tests on the test bed's one-node Kubernetes 1.20.

The cluster is the one scripts/cluster_testbed.sh builds from Debian's packages (kubelet, containerd, kube-proxy,
in a network namespace of its own; scripts/cluster/): up.sh and down.sh start and stop it, and clean up by the
PIDs and cgroups they recorded. The images are the session's (tests/image_build.py: the images tier's build, with
buildah on the stand-in base), pushed to docker archives and imported with ``ctr``. kubectl (the build's 1.20.2),
helm and the clients run through ``$RUN/in-node``, in the node's network namespace with its admin kubeconfig;
nothing in that namespace can reach the machine's network. kube-apiserver is stopped and started again by
scripts/cluster/component.sh.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from e2e.bodies import *  # noqa: F403 - the shared tests and fixtures (its __all__)
from e2e.bodies import SCRIPTS, Provider, run
from tests import image_build

CACHE = Path(os.environ.get("OVSERVE_CLUSTER_CACHE") or Path.home() / ".cache/ovserve/cluster")
RUN = CACHE / "run"
SOCK = RUN / "containerd/containerd.sock"


def _tools() -> Path | None:
    out = subprocess.run(["bash", str(SCRIPTS / "tools.sh"), "--check"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return None
    return Path(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else None


def missing_reason() -> str | None:
    if os.geteuid() != 0:
        return "the cluster needs root (namespaces, mounts, cgroups)"
    built = subprocess.run(["bash", str(SCRIPTS / "cluster_testbed.sh"), "--check"], capture_output=True, check=False)
    if built.returncode:
        return "no cluster build: run scripts/cluster_testbed.sh (scripts/test.sh does; ~16 min the first time)"
    for tool in ("buildah", "runc"):
        if not shutil.which(tool):
            return f"{tool} is missing: scripts/image_testbed.sh installs it"
    if not image_build.STORAGE_CONF.is_file():
        return f"no image test bed in {image_build.CACHE}: run scripts/image_testbed.sh"
    tools = _tools()
    if tools is None or not (tools / "helm").exists():
        return "helm is missing: run scripts/tools.sh"
    return None


pytestmark = [pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason())),
              pytest.mark.timeout(2400)]


class Testbed(Provider):
    """The test bed's cluster: scripts/cluster/up.sh and down.sh, images imported with ``ctr``, everything
    through ``in-node``."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self) -> None:
        self.in_node = str(RUN / "in-node")
        self.pv: Path | None = None

    def up(self, request: pytest.FixtureRequest, work: Path) -> str:
        if (RUN / "pids").exists():  # a run killed before its teardown: its cluster is ours to take down
            subprocess.run(["bash", str(SCRIPTS / "cluster/down.sh")], capture_output=True, timeout=120, check=False)
        images = image_build.shared(request)
        started = time.monotonic()
        archives = []
        for ref in (images.server, images.operator):  # docker-archive names it docker.io/library/<name>:<tag>
            name = ref.removeprefix("localhost/")  # in containerd, the name the chart's values give
            archive = work / f"{name.split(':')[0]}.tar"
            run("buildah", "push", ref, f"docker-archive:{archive}:{name}", timeout=600, env=image_build.ENV)
            archives.append(archive)
        exported = time.monotonic()
        run("bash", SCRIPTS / "cluster/up.sh", timeout=300)
        up = time.monotonic()
        for archive in archives:
            run("ctr", "-a", SOCK, "-n", "k8s.io", "images", "import", archive, timeout=600)
            archive.unlink()
        print(f"\ncluster: images exported in {exported - started:.0f} s, cluster up in {up - exported:.0f} s, "
              f"images imported in {time.monotonic() - up:.0f} s")
        return images.tag

    def down(self) -> None:
        if self.pv is not None:
            shutil.rmtree(self.pv, ignore_errors=True)
        if os.environ.get("OVSERVE_CLUSTER_KEEP") != "1":  # 1: left up to look around (scripts/cluster/down.sh)
            subprocess.run(["bash", str(SCRIPTS / "cluster/down.sh")], capture_output=True, timeout=300, check=False)

    def control(self, argv: list[str]) -> tuple[list[str], dict[str, str]]:
        return [self.in_node, *argv], {}  # the admin kubeconfig answers only in the node's namespace

    def in_net(self, argv: list[str]) -> list[str]:
        return [self.in_node, *argv]

    def helm(self) -> str:
        tools = _tools()
        assert tools is not None
        return str(tools / "helm")

    def hostpath(self) -> tuple[Path, str]:
        # the node's filesystem is this machine's; not under pytest's root-only tmp: the pods run as 10001
        self.pv = Path(f"/tmp/ovserve-cluster-pv-{os.getpid()}")
        shutil.rmtree(self.pv, ignore_errors=True)
        self.pv.mkdir(mode=0o755)
        return self.pv, str(self.pv)

    def read_node_log(self, folder: str) -> str:
        logs = sorted(Path(folder).glob("*.log"), key=lambda f: f.stat().st_mtime)
        return logs[-1].read_text(errors="replace") if logs else ""

    def stop_api_server(self) -> None:
        run("bash", SCRIPTS / "cluster/component.sh", "stop", "kube-apiserver", timeout=60)

    def start_api_server(self) -> None:
        run("bash", SCRIPTS / "cluster/component.sh", "start", "kube-apiserver", timeout=60)


@pytest.fixture(scope="module")
def provider() -> Testbed:
    return Testbed()
