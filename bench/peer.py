"""The KServe peer: its own virtualenv, made on first use, and its server process.

The peer is installed with pip from the package index into
``bench/.peer-venv`` (gitignored), apart from ovserve's environment, so that
neither server runs with the other's dependency versions. An existing venv
that imports kserve, openvino and numpy is reused.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ovserve.server.child import free_ports

from .servers import ServerProcess

HERE = Path(__file__).resolve().parent
VENV = HERE / ".peer-venv"
REQUIREMENTS = ["kserve", "openvino", "numpy"]
INSTALL_TIMEOUT = 1800


def python() -> Path:
    return VENV / "bin" / "python"


def _works() -> bool:
    if not python().exists():
        return False
    probe = [str(python()), "-c", "import kserve, openvino, numpy"]
    return subprocess.run(probe, capture_output=True, timeout=120, check=False).returncode == 0


def ensure_venv(log=print) -> Path:
    """The peer's python, creating and installing its venv when needed."""
    if _works():
        return python()
    log(f"creating the peer's virtualenv in {VENV} (pip install {' '.join(REQUIREMENTS)}) ...")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, timeout=300)
    subprocess.run([str(python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *REQUIREMENTS],
                   check=True, timeout=INSTALL_TIMEOUT)
    if not _works():
        raise RuntimeError(f"the peer's virtualenv in {VENV} cannot import {REQUIREMENTS}")
    return python()


def versions() -> dict[str, str]:
    code = ("import json; from importlib.metadata import version as v; "
            "print(json.dumps({p: v(p) for p in ('kserve', 'openvino', 'grpcio', 'uvicorn')}))")
    out = subprocess.run([str(python()), "-c", code], capture_output=True, text=True, timeout=120, check=False)
    try:
        return json.loads(out.stdout)
    except ValueError:
        return {}


def start(models: dict[str, dict], interpreter: Path | str | None = None) -> ServerProcess:
    """``models``: name -> {"path": model.xml, "plugin_config": {...}}; ``interpreter``: a Python with kserve,
    openvino and numpy (by default the peer's venv)."""
    rest, grpc = free_ports(2)  # the peer cannot bind port 0 and report it
    cmd = [str(interpreter or python()), str(HERE / "peer_server.py"), "--http_port", str(rest),
           "--grpc_port", str(grpc), "--models", json.dumps(models)]
    return ServerProcess("kserve", cmd, rest_port=rest, grpc_port=grpc)
