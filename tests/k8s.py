"""A real Kubernetes control plane on 127.0.0.1 for the operator tests.

etcd, kube-apiserver and kube-controller-manager are the binaries that
``scripts/k8s_testbed.sh`` builds from Debian's ``kubernetes`` source package
(cached in ``~/.cache/ovserve/k8s/bin``, or ``$OVSERVE_K8S_BIN``). No kubelet or
scheduler runs: pods stay Pending, and tests drive readiness by patching a
Deployment's ``status``. The controller manager runs without its deployment and
HPA controllers (they would overwrite that status) but with the garbage
collector and the service-account token controller.

None of these binaries can bind port 0 and report it, so free ports are picked
just before the start; a clash (rare) is retried with new ports. Each runs in its
own process group and dies with pytest (``ovserve.server.child.spawn``).
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import requests
import urllib3

from ovserve.server.child import free_ports, spawn

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

BIN = Path(os.environ.get("OVSERVE_K8S_BIN") or Path.home() / ".cache/ovserve/k8s/bin")
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
ISSUER = "https://kubernetes.default.svc.cluster.local"


def missing_reason() -> str | None:
    """Why the control plane cannot start here, or None."""
    absent = [b for b in BINARIES if not os.access(BIN / b, os.X_OK)]
    if not shutil.which("openssl"):
        return "openssl is missing (it makes the service-account signing key)"
    if absent:
        return (f"{', '.join(absent)} not in {BIN}: run scripts/k8s_testbed.sh (scripts/test.sh does) "
                "to build them from Debian's kubernetes source package")
    return None


def kubeconfig(server: str, token: str, namespace: str = "default") -> str:
    return f"""apiVersion: v1
kind: Config
clusters: [{{name: test, cluster: {{server: "{server}", insecure-skip-tls-verify: true}}}}]
users: [{{name: test, user: {{token: "{token}"}}}}]
contexts: [{{name: test, context: {{cluster: test, user: test, namespace: {namespace}}}}}]
current-context: test
"""


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager in ``workdir``; ``start()`` / ``stop()``."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.admin_token = secrets.token_hex(16)
        self.url = ""
        self._api_args: list[str] = []

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.dir / f"{name}.log", "ab") as log:  # the child has its own copy
            proc = spawn([str(BIN / name), *args], stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def log(self, name: str, tail: int = 40) -> str:
        path = self.dir / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(lines[-tail:])

    def _prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "tokens.csv").write_text(f'{self.admin_token},admin,admin,"system:masters"\n')
        key = self.dir / "sa.key"
        if not key.exists():
            subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
            subprocess.run(["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(self.dir / "sa.pub")],
                           check=True, capture_output=True)

    def start(self, attempts: int = 3) -> ControlPlane:
        self._prepare()
        for attempt in range(attempts):
            try:
                return self._start_once()
            except RuntimeError:
                self.stop()
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self) -> ControlPlane:
        etcd_port, peer_port, api_port = free_ports(3)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn("etcd", [
            "--data-dir", str(self.dir / "etcd"), "--unsafe-no-fsync", "--log-level", "warn", "--logger", "zap",
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"default={peer_url}"])
        self._api_args = [
            f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}", "--insecure-port=0", f"--cert-dir={self.dir / 'certs'}",
            f"--token-auth-file={self.dir / 'tokens.csv'}", "--authorization-mode=RBAC",
            f"--service-account-key-file={self.dir / 'sa.pub'}",
            f"--service-account-signing-key-file={self.dir / 'sa.key'}",
            f"--service-account-issuer={ISSUER}", f"--api-audiences={ISSUER}",
            "--disable-admission-plugins=ServiceAccount", "--service-cluster-ip-range=10.96.0.0/16",
            "--enable-priority-and-fairness=false", "--profiling=false", "--v=1"]
        self._spawn("kube-apiserver", self._api_args)
        self.url = f"https://127.0.0.1:{api_port}"
        self._wait_ready(timeout=90)
        admin = self.dir / "admin.kubeconfig"
        admin.write_text(kubeconfig(self.url, self.admin_token))
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={admin}", "--controllers=*,-deployment,-horizontalpodautoscaling",
            f"--service-account-private-key-file={self.dir / 'sa.key'}",
            f"--root-ca-file={self.dir / 'certs' / 'apiserver.crt'}",
            "--leader-elect=false", "--port=0", "--secure-port=0", "--v=1"])
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")
            try:
                r = requests.get(self.url + "/readyz", verify=False, timeout=2,
                                 headers={"Authorization": f"Bearer {self.admin_token}"})
                if r.status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"kube-apiserver not ready after {timeout}s:\n{self.log('kube-apiserver')}")

    def stop_api_server(self, kill: bool = False) -> None:
        """Stop kube-apiserver alone (etcd and the controller manager keep running): SIGTERM, or SIGKILL."""
        proc = self.procs.pop("kube-apiserver")
        _end(proc, kill)

    def start_api_server(self, timeout: float = 90) -> None:
        """Start kube-apiserver again on the same port, certificates and etcd, so every client's
        kubeconfig still points at it; return once it answers /readyz. The port is free as soon as
        the old process is gone (the API server listens with SO_REUSEADDR)."""
        self._spawn("kube-apiserver", self._api_args)
        self._wait_ready(timeout)

    def stop(self) -> None:
        """The whole control plane at once: its state is thrown away with the module, so nothing is owed a
        graceful exit (a kube-apiserver whose etcd went first waited out _end's 15 s)."""
        for name in reversed(list(self.procs)):
            _end(self.procs.pop(name), kill=True)


def _end(proc: subprocess.Popen, kill: bool = False) -> None:
    if proc.poll() is None:
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

