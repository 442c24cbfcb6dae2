"""``operator/`` is installed as ``ovserve.operator`` and never shadows the standard library."""
from __future__ import annotations

import ast
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from .imports import absolute_imports

ROOT = Path(__file__).resolve().parent.parent


def run(code: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.integration
def test_import_operator_from_the_repo_root_is_the_standard_library() -> None:
    assert not (ROOT / "operator/__init__.py").exists()
    where = run("import operator; print(operator.__file__)", ROOT)
    assert Path(where) == Path(sysconfig.get_paths()["stdlib"]) / "operator.py"
    assert run("import operator; print(operator.itemgetter(1)('ab'))", ROOT) == "b"


@pytest.mark.integration
def test_the_package_imports_from_anywhere(tmp_path: Path) -> None:
    modules = ["names", "storage_uri", "config", "manifests", "pods", "status", "validation", "apply", "handlers",
               "main", "local.plan", "local.processes", "local.command"]
    out = run("import importlib; print(*[importlib.import_module('ovserve.operator.' + m).__file__ for m in "
              f"{modules!r}])", tmp_path)
    assert [Path(f) for f in out.split()] == [ROOT / "operator" / (m.replace(".", "/") + ".py") for m in modules]


@pytest.mark.integration
def test_console_script_runs_from_anywhere(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "ovserve-operator"
    done = subprocess.run([str(exe), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "--namespace" in done.stdout and "--peering" in done.stdout


def imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and not node.level}
    return {name.split(".")[0] for name in names}


def test_only_apply_talks_to_the_api() -> None:
    clients = {"kubernetes", "requests", "urllib3", "aiohttp", "pykube"}
    # metrics.py serves the operator's /metrics with aiohttp (a server, not a client of the API)
    talkers = {p.name for p in (ROOT / "operator").rglob("*.py")
               if imported(p) & clients - ({"aiohttp"} if p.name == "metrics.py" else set())}
    assert talkers == {"apply.py"}


def test_builders_are_free_of_frameworks() -> None:
    for name in ("names.py", "storage_uri.py", "config.py", "manifests.py", "pods.py", "status.py", "validation.py"):
        assert not imported(ROOT / "operator" / name) - {"__future__", "copy", "posixpath", "re", "dataclasses",
                                                          "urllib", "typing"}, name


def test_the_server_package_never_imports_the_operator() -> None:
    """Dependencies point one way (the operator's local runner reads the server's port lines, never the
    reverse), but for one declared import: server/cli.py imports the local runner's command when ``ovserve
    run`` runs (import contract server-not-operator, issue 39 item 3)."""
    allowed = {("server/cli.py", "ovserve.operator.local.command"), ("server/cli.py", "ovserve.operator.local")}
    offenders = []
    for path in sorted((ROOT / "server").rglob("*.py")):
        folder = path.parent.relative_to(ROOT / "server").parts
        for name in absolute_imports(path, ".".join(("ovserve", "server", *folder))):
            if (name == "ovserve.operator" or name.startswith("ovserve.operator.")) and \
                    (str(path.relative_to(ROOT)), name) not in allowed:
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, offenders
