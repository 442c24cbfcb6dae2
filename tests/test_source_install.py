"""The from-source install the README shows after the quick start works in one command (issue 37, item 5).

``pip install .`` alone cannot: ``ovserve`` requires ``ovserve-client`` at exactly its version, on no index, so
the README names both folders of the checkout in one command (and both ``git+`` URLs, with ``#subdirectory=``
for the client). Each command is taken from the README as written and run in a new virtual environment with
``PIP_NO_DEPS=1``: the third-party dependencies are resolved elsewhere (tests/test_locks.py resolves
pyproject.toml's bounds; tests/test_client_install.py installs the client's), so what is checked here is what
broke, that the one command installs both distributions of this checkout, non-editable, with their commands,
and that nothing either requires of the other is missing (``pip check`` reports no ovserve distribution).
"""
from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

import pytest

from .docs_blocks import ROOT, Block, all_blocks

VERSION = "0.1.0"


def readme_block(text: str) -> Block:
    (block,) = [b for b in all_blocks() if b.source == "README.md" and text in b.text
                and "tests/test_source_install.py" in (b.excuse or "")]
    return block


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment (Python's own pip in it), shared by the tests: each removes what the one
    before installed."""
    path = tmp_path_factory.mktemp("source-install") / "venv"
    venv.create(path, with_pip=True, clear=True)
    return path


def install(path: Path, script: str) -> Path:
    """``script`` run in the checkout with the environment's ``pip`` first on PATH, after removing ovserve."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=f"{path / 'bin'}{os.pathsep}{env.get('PATH', '')}", PIP_NO_DEPS="1", PIP_QUIET="1")
    script = f"pip uninstall --yes ovserve ovserve-client\n{script}"
    done = subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return path


def check_installed(path: Path) -> None:
    python = str(path / "bin" / "python")
    listed = subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                            check=True).stdout
    dists = {d["name"]: d for d in json.loads(listed)}
    for name in ("ovserve", "ovserve-client"):
        assert dists[name]["version"] == VERSION, dists.get(name)
        assert "editable_project_location" not in dists[name], dists[name]  # a copy, not the checkout
    # with --no-deps every third-party requirement is missing, but no ovserve distribution may be
    report = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, check=False).stdout
    assert not [line for line in report.splitlines() if "requires ovserve" in line], report
    (site,) = (path / "lib").glob("python3*/site-packages")
    for package in ("server", "operator", "client", "common"):
        assert (site / "ovserve" / package).is_dir(), package
    assert (path / "bin" / "ovserve").is_file() and (path / "bin" / "ovserve-infer").is_file()


def test_the_readmes_command_installs_from_the_checkout(fresh_venv: Path) -> None:
    block = readme_block("pip install ./packaging/client .")
    (command,) = [line.split("#")[0].strip() for line in block.text.splitlines() if line.startswith("pip install")]
    check_installed(install(fresh_venv, command))


def test_the_readmes_git_url_command_installs_from_a_clone(fresh_venv: Path) -> None:
    """The git URL form, with this checkout as the repository (its last commit, as a clone would have it)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the git URL form needs one")
    block = readme_block("git+")
    # file://localhost/...: Python 3.11's own pip (23.2) refuses file:/// (no host) in a `name @ URL`
    script = "\n".join(f"REPO=git+file://localhost{ROOT}" if line.startswith("REPO=") else line
                       for line in block.text.splitlines())
    check_installed(install(fresh_venv, script))
