"""Real TorchServe 0.12 as a peer: its own virtualenv, a JDK, the archive, the config and the process.

- **Virtualenv** ``bench/.ts-venv`` (gitignored), made on first use with pip:
  the CPU build of torch first (:data:`TORCH`: TorchServe's worker imports
  torch for its own protocol code, so it must be there; the plain PyPI
  ``torch`` for Linux is the CUDA build, several GB more), then
  ``torchserve==0.12.*``, ``torch-model-archiver==0.12.*`` and what the
  handler runs: openvino, numpy, opencv-python-headless.
- **Java**: TorchServe's frontend is Java (17 or newer). ``java`` on PATH or
  under ``$JAVA_HOME``; else, as root on Debian, ``apt-get install -y``
  :data:`JDK_PACKAGE`.
- **Archive**: ``torch-model-archiver`` packs the same IR ovserve serves
  (``model.xml`` as the serialized file, ``model.bin`` and ``labels.txt`` as
  extra files), ``bench/ts_handler.py`` and a ``model-config.yaml`` with the
  workers and the OpenVINO properties (:class:`Tuning`).
- **Server**: ``torchserve --foreground`` with a ``config.properties`` that
  binds every listener to 127.0.0.1 on free ports (REST inference, management
  and metrics, gRPC inference and management), token authorization off,
  the model API on, system metrics off. Its logs, pid file and unpacked
  archives stay in the run's temporary folder (``cwd``, ``TMPDIR``), so two
  runs never share TorchServe's pid file.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ovserve.server.child import HOST, free_ports

from .servers import ServerProcess

HERE = Path(__file__).resolve().parent
VENV = HERE / ".ts-venv"
#: The CPU build of torch as pip finds it here (this machine's wheel folder holds 2.13.0+cpu, a
#: 183 MiB wheel, 754 MiB installed). Elsewhere set OVSERVE_BENCH_TORCH to pip arguments that
#: reach a CPU build (e.g. a --index-url of PyTorch's CPU wheels).
TORCH = os.environ.get("OVSERVE_BENCH_TORCH", "torch==2.13.0").split()
#: pyyaml: TorchServe's worker imports yaml (ts.utils.util) but its package does not require it.
REQUIREMENTS = ["torchserve==0.12.*", "torch-model-archiver==0.12.*", "pyyaml", "openvino", "numpy",
                "opencv-python-headless"]
JDK_PACKAGE = "openjdk-17-jre-headless"
JAVA_MIN = 17
INSTALL_TIMEOUT = 1800
MODEL = "mobilenet_v2"
HANDLER = HERE / "ts_handler.py"
#: What the worker and the handler import (ts.model_service_worker is the worker's entry point).
_PROBE = "import ts.model_service_worker, torch, openvino, cv2, numpy, model_archiver"


def python() -> Path:
    return VENV / "bin" / "python"


def _works() -> bool:
    if not python().exists():
        return False
    return subprocess.run([str(python()), "-c", _PROBE], capture_output=True, timeout=300, check=False,
                          env=_own_env()).returncode == 0


def installed() -> bool:
    """Whether the venv is there and imports everything (nothing is installed to find out)."""
    return _works()


def ensure_venv(log: Callable[[str], None] = print) -> tuple[Path, float]:
    """The venv's python and the seconds spent installing it (0 when it was there already)."""
    if _works():
        return python(), 0.0
    t0 = time.monotonic()
    log(f"creating TorchServe's virtualenv in {VENV} (pip install {' '.join(TORCH)}, then "
        f"{' '.join(REQUIREMENTS)}) ...")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, timeout=300)
    pip = [str(python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # torch alone first: with it installed, nothing after may pull another build of it
    subprocess.run([*pip, *TORCH], check=True, timeout=INSTALL_TIMEOUT, env=_own_env())
    subprocess.run([*pip, *REQUIREMENTS], check=True, timeout=INSTALL_TIMEOUT, env=_own_env())
    if not _works():
        raise RuntimeError(f"TorchServe's virtualenv in {VENV} cannot `{_PROBE}`")
    return python(), time.monotonic() - t0


def _own_env() -> dict[str, str]:
    """This process's environment without PYTHONPATH: the venv sees its own packages only (the bench runs
    with the checkout on PYTHONPATH, whose ovserve and folders would otherwise be seen first)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def venv_size_mib() -> float:
    total = 0
    for root, _, files in os.walk(VENV):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total / 2**20


# -- Java ---------------------------------------------------------------------------------
def java() -> str | None:
    """The java TorchServe's launcher will run ($JAVA_HOME/bin/java, else java on PATH), when it is 17+."""
    home = os.environ.get("JAVA_HOME")
    exe = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not exe or not os.access(exe, os.X_OK):
        return None
    out = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=60, check=False)
    m = re.search(r'version "(\d+)', out.stderr + out.stdout)
    return exe if m and int(m.group(1)) >= JAVA_MIN else None


def ensure_java(log: Callable[[str], None] = print) -> tuple[str, float]:
    """java (17+) and the seconds spent installing it: Debian's JDK package with apt-get when missing."""
    found = java()
    if found:
        return found, 0.0
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise RuntimeError(f"TorchServe needs Java {JAVA_MIN}+: install {JDK_PACKAGE} (or set JAVA_HOME)")
    t0 = time.monotonic()
    log(f"installing {JDK_PACKAGE} with apt-get ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, timeout=INSTALL_TIMEOUT, env=env)
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", JDK_PACKAGE], check=True,
                   timeout=INSTALL_TIMEOUT, env=env)
    found = java()
    if not found:
        raise RuntimeError(f"{JDK_PACKAGE} is installed but no java {JAVA_MIN}+ is on PATH")
    return found, time.monotonic() - t0


def versions() -> dict[str, str]:
    code = ("import json; from importlib.metadata import version as v; "
            "print(json.dumps({p: v(p) for p in ('torchserve', 'torch', 'openvino', 'opencv-python-headless')}))")
    out = subprocess.run([str(python()), "-c", code], capture_output=True, text=True, timeout=120, check=False,
                         env=_own_env())
    try:
        found = {f"ts-peer {k}": v for k, v in json.loads(out.stdout).items()}
    except ValueError:
        found = {}
    exe = java()
    if exe:
        text = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=60, check=False).stderr
        first = text.splitlines()[0] if text else ""
        m = re.search(r'version "([^"]+)"', first)
        found["ts-peer java"] = m.group(1) if m else first
    return found


# -- the archive and the configuration ---------------------------------------------------------
@dataclass(frozen=True)
class Tuning:
    """How TorchServe is set up for this machine (bench/README.md "TorchServe" says why).

    TorchServe's worker is a process that runs one batch at a time; TorchServe's own guidance
    for CPUs is workers x threads per worker = the cores. So each worker's OpenVINO model gets
    one stream (LATENCY) of ``cores // workers`` threads: together the workers fill the cores
    without oversubscribing them. ``batch_size`` > 1 lets TorchServe's frontend batch requests
    (waiting up to ``max_batch_delay_ms`` for a batch to fill)."""

    workers: int = 2
    batch_size: int = 1
    max_batch_delay_ms: int = 5
    cores: int = os.cpu_count() or 1

    @property
    def threads(self) -> int:
        return max(1, self.cores // self.workers)

    @property
    def ov_properties(self) -> dict[str, str]:
        return {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": str(self.threads)}

    def describe(self) -> str:
        batch = (f", batches of up to {self.batch_size} (max delay {self.max_batch_delay_ms} ms)"
                 if self.batch_size > 1 else ", no batching")
        props = " ".join(f"{k}={v}" for k, v in self.ov_properties.items())
        return f"{self.workers} workers x {self.threads} OpenVINO thread(s) ({props}){batch}"


def model_config(tuning: Tuning) -> str:
    """The archive's model-config.yaml (TorchServe reads the top level; the handler reads ``handler``)."""
    lines = [f"minWorkers: {tuning.workers}", f"maxWorkers: {tuning.workers}", f"batchSize: {tuning.batch_size}",
             f"maxBatchDelay: {tuning.max_batch_delay_ms}", "responseTimeout: 120", "handler:", "  ov_properties:"]
    lines += [f'    {k}: "{v}"' for k, v in tuning.ov_properties.items()]
    return "\n".join(lines) + "\n"


def build_archive(model_dir: Path, store: Path, tuning: Tuning, tmp: Path) -> Path:
    """``store``/mobilenet_v2.mar from the IR in ``model_dir`` (model.xml, model.bin, labels.txt)."""
    store.mkdir(parents=True, exist_ok=True)
    staging = tmp / "archiver"  # the archiver stages in $TMPDIR/<name> and empties what is there
    staging.mkdir(parents=True, exist_ok=True)
    config = tmp / "model-config.yaml"
    config.write_text(model_config(tuning))
    extra = ",".join(str(model_dir / f) for f in ("model.bin", "labels.txt"))
    cmd = [str(VENV / "bin" / "torch-model-archiver"), "--model-name", MODEL, "--version", "1.0",
           "--serialized-file", str(model_dir / "model.xml"), "--extra-files", extra, "--handler", str(HANDLER),
           "--config-file", str(config), "--export-path", str(store), "--force"]
    subprocess.run(cmd, check=True, timeout=600, env={**_own_env(), "TMPDIR": str(staging)},
                   capture_output=True, text=True)
    return store / f"{MODEL}.mar"


def config_properties(ports: dict[str, int], store: Path, tuning: Tuning) -> str:
    props = {
        "inference_address": f"http://{HOST}:{ports['rest']}",
        "management_address": f"http://{HOST}:{ports['management']}",
        "metrics_address": f"http://{HOST}:{ports['metrics']}",
        "grpc_inference_address": HOST,
        "grpc_inference_port": ports["grpc"],
        "grpc_management_address": HOST,
        "grpc_management_port": ports["grpc-management"],
        "disable_token_authorization": "true",
        "enable_model_api": "true",
        "model_store": store,
        "load_models": f"{MODEL}.mar",
        "default_workers_per_model": tuning.workers,
        # a Python process every minute sampling the machine: ovserve has no such thing, and it is noise
        "disable_system_metrics": "true",
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


class TorchServeProcess(ServerProcess):
    """``torchserve --foreground``: the launcher, its Java frontend and the Python workers, one process group.

    The launcher does not pass SIGTERM on to Java, so stop() signals the whole group (all started
    here), then waits for it to be gone."""

    def __init__(self, cmd: list[str], ports: dict[str, int], cwd: Path, env: dict[str, str]) -> None:
        super().__init__("torchserve", cmd, env=env, rest_port=ports["rest"], grpc_port=ports["grpc"], cwd=cwd)
        self.management_port = ports["management"]
        self.logs = cwd / "logs"

    @property
    def log(self) -> str:
        """Its stderr, then the end of TorchServe's own logs (the frontend's and the workers')."""
        parts = [self.output.text]
        for name in ("ts_log.log", "model_log.log"):
            with contextlib.suppress(OSError):
                parts.append(f"--- {name} (end) ---\n" + "".join((self.logs / name).read_text().splitlines(True)[-60:]))
        return "\n".join(parts)

    def model_status(self) -> list[str]:
        """The status of each worker of the model (TorchServe's management API), [] while it has none."""
        url = f"http://{HOST}:{self.management_port}/models/{MODEL}"
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5) as resp:
                doc = json.loads(resp.read())
        except (OSError, ValueError):
            return []
        return [w.get("status", "") for w in (doc[0].get("workers") or [])] if doc else []

    def wait_workers(self, count: int, timeout: float = 300) -> TorchServeProcess:
        self.wait_until(lambda: self.model_status().count("READY") >= count,
                        f"{count} READY workers of {MODEL}", timeout)
        return self

    def stop(self, grace: float = 30) -> int:
        if self.proc.poll() is None or _group_alive(self.proc.pid):
            self.signal(signal.SIGTERM, group=True)
            deadline = time.monotonic() + grace
            while _group_alive(self.proc.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _group_alive(self.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.output.join(5)
        return self.proc.returncode if self.proc.returncode is not None else -9


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start(model_dir: Path, tmp: Path, tuning: Tuning) -> TorchServeProcess:
    """Build the archive and start TorchServe serving it; wait for the workers with ``wait_workers``."""
    tmp.mkdir(parents=True, exist_ok=True)
    store = tmp / "model-store"
    build_archive(model_dir, store, tuning, tmp)
    names = ("rest", "management", "metrics", "grpc", "grpc-management")
    ports = dict(zip(names, free_ports(len(names)), strict=True))  # TorchServe cannot bind port 0 and say so
    config = tmp / "config.properties"
    config.write_text(config_properties(ports, store, tuning))
    private = tmp / "tmp"  # TorchServe's pid file, sockets and unpacked archive: this run's alone
    private.mkdir(exist_ok=True)
    env = {"TMPDIR": str(private), "TEMP": str(private), "LOG_LOCATION": str(tmp / "logs"),
           "METRICS_LOCATION": str(tmp / "logs"), "PATH": f"{VENV / 'bin'}:{os.environ.get('PATH', '')}",
           "PYTHONPATH": ""}  # (set over this process's environment) the workers import the venv's packages only
    cmd = [str(VENV / "bin" / "torchserve"), "--start", "--foreground", "--ts-config", str(config),
           "--model-store", str(store), "--no-config-snapshots", "--disable-token-auth"]
    return TorchServeProcess(cmd, ports, tmp, env)
