"""Where the tests find Debian's prometheus and promtool, or why they cannot.

``scripts/prometheus.sh`` (run by ``scripts/test.sh``) unpacks them from Debian's ``prometheus``
package into ``~/.cache/ovserve/prometheus/bin`` (``$OVSERVE_PROMETHEUS_CACHE``).
"""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts/prometheus.sh"


def bin_dir() -> Path:
    cache = Path(os.environ.get("OVSERVE_PROMETHEUS_CACHE") or Path.home() / ".cache/ovserve/prometheus")
    return cache / "bin"


def find(name: str) -> tuple[Path, str | None]:
    """``name`` (prometheus or promtool) and None, or its expected path and why it is missing."""
    path = bin_dir() / name
    if os.access(path, os.X_OK):
        return path, None
    return path, f"{name} not in {path.parent}: run scripts/prometheus.sh (scripts/test.sh does) to unpack Debian's"
