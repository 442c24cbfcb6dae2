"""Both images, built once per test session and shared by the tiers that need them.

The images tier (tests/test_container_images.py) runs them with podman; the cluster tier
(e2e/test_cluster.py) imports them into a real node's containerd. One ``scripts/build_images.sh``
run serves both (about 100 s on two cores), under a tag of this session's own (``test-<pid>``),
so that two runs on one machine never meet; the images are removed when the session ends. The locks'
wheels are kept between runs in a wheelhouse (``--wheels``): the build installs the same hashed files
without going to the package index each time.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("OVSERVE_IMAGES_CACHE") or Path.home() / ".cache/ovserve/images")
STORAGE_CONF = CACHE / "storage.conf"
WHEELS = CACHE / "wheels"
#: the stand-in base scripts/image_testbed.sh makes; OVSERVE_IMAGE_BASE names another, e.g. the Dockerfiles' own
#: official base by digest, which the build pulls (.github/workflows/e2e.yml runs the tier so)
STAND_IN = "localhost/ovserve-base:3.11-bookworm"
BASE = os.environ.get("OVSERVE_IMAGE_BASE") or STAND_IN
#: the test bed's vfs storage where it exists, else the tools' default storage
ENV = {**os.environ, **({"CONTAINERS_STORAGE_CONF": str(STORAGE_CONF)} if STORAGE_CONF.is_file() else {})}


@dataclass(frozen=True)
class Images:
    """The two images of this session, their tag, and the build logs."""

    server: str
    operator: str
    tag: str
    logs: Path
    seconds: float  # how long the build took


_built: Images | None = None


def shared(request: pytest.FixtureRequest) -> Images:
    """The session's images: built on the first call (a failed build fails the caller, saying why), removed
    when the session ends."""
    global _built
    if _built is not None:
        return _built
    logs = Path(tempfile.mkdtemp(prefix="ovserve-build-logs-"))
    tag = f"test-{os.getpid()}"
    started = time.monotonic()
    built = subprocess.run(["bash", str(ROOT / "scripts/build_images.sh"), "--engine", "buildah", "--tag", tag,
                            "--base", BASE, "--logs", str(logs), "--wheels", str(WHEELS)],
                           env={**ENV, "PYTHON": sys.executable}, capture_output=True, text=True,
                           timeout=1800, check=False)
    refs = built.stdout.split()

    def remove() -> None:
        if refs:
            subprocess.run(["buildah", "rmi", "-f", *refs], env=ENV, capture_output=True, check=False)

    request.session.addfinalizer(remove)  # type: ignore[attr-defined]
    assert built.returncode == 0 and len(refs) == 2, built.stderr[-4000:]
    _built = Images(refs[0], refs[1], tag, logs, time.monotonic() - started)
    print(f"\nimages built in {_built.seconds:.0f} s: {' '.join(refs)}")
    return _built
