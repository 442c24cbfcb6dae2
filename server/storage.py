"""``ovserve storage-initializer SRC DEST``: put a model where the server reads it.

SRC is an ``http(s)://`` URL of a file or of an archive (.tar, .tar.gz/.tgz,
.tar.bz2, .tar.xz, .zip: unpacked), a ``file://`` URI or a local path (a folder
is copied with its contents, a file into DEST, an archive unpacked). This is
what the operator's init container runs; ``pvc://`` claims are mounted by the
operator instead, never copied.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from . import __version__

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
TIMEOUT = 60.0


class StorageError(Exception):
    """The model cannot be fetched; the message says why."""


def _is_archive(name: str) -> bool:
    return name.lower().endswith((*TAR_SUFFIXES, ".zip"))


def _unpack(archive: Path, name: str, dest: Path) -> None:
    root = dest.resolve()
    try:
        if name.lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                for member in z.namelist():
                    if not (root / member).resolve().is_relative_to(root):
                        raise StorageError(f"{name}: entry {member!r} points outside the destination")
                z.extractall(root)
        else:
            with tarfile.open(archive, "r:*") as t:
                if hasattr(tarfile, "data_filter"):
                    t.extractall(root, filter="data")
                else:  # pragma: no cover - Pythons before the extraction filters
                    for m in t.getmembers():
                        if not (root / m.name).resolve().is_relative_to(root) or m.issym() or m.islnk():
                            raise StorageError(f"{name}: entry {m.name!r} is unsafe to extract")
                    t.extractall(root)
    except (tarfile.TarError, zipfile.BadZipFile) as exc:
        raise StorageError(f"{name}: not a valid archive ({exc})") from None


def _place(path: Path, name: str, dest: Path) -> None:
    if _is_archive(name):
        _unpack(path, name, dest)
    else:
        shutil.copyfile(path, dest / name)


def _download(url: str, dest: Path) -> None:
    name = PurePosixPath(unquote(urlsplit(url).path)).name
    if not name:
        raise StorageError(f"{url}: names no file (give a file or an archive, not a folder)")
    request = urllib.request.Request(url, headers={"User-Agent": f"ovserve-storage-initializer/{__version__}"})
    with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as tmp:
        part = Path(tmp) / name
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response, open(part, "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
        except urllib.error.HTTPError as exc:
            raise StorageError(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise StorageError(f"{url}: {getattr(exc, 'reason', exc)}") from None
        _place(part, name, dest)


def _copy(src: Path, dest: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dest, dirs_exist_ok=True)
    else:
        _place(src, src.name, dest)


def initialize(src: str, dest: Path) -> Path:
    """Fetch ``src`` into the folder ``dest`` (created if needed); returns ``dest``."""
    parts = urlsplit(src)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        if not parts.netloc:
            raise StorageError(f"{src}: no host in the URL")
        dest.mkdir(parents=True, exist_ok=True)
        _download(src, dest)
    elif scheme == "file" or scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        if scheme == "file" and parts.netloc not in ("", "localhost"):
            raise StorageError(f"{src}: file URIs name a local path: file:///path")
        local = Path(unquote(parts.path)) if scheme == "file" else Path(src)
        if not local.exists():
            raise StorageError(f"{local}: no such file or folder")
        dest.mkdir(parents=True, exist_ok=True)
        _copy(local, dest)
    elif scheme == "pvc":
        raise StorageError(f"{src}: a pvc:// claim is mounted by the operator, not copied")
    else:
        raise StorageError(f"{src}: unsupported scheme {scheme!r} (use http(s)://, file:// or a local path)")
    return dest


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("storage-initializer", help="fetch a model into a folder (what the operator's init container runs)",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("src", help="http(s):// file or archive, file:// URI, or local path")
    p.add_argument("dest", type=Path, help="folder to fill, e.g. /mnt/models")


def main(src: str, dest: Path) -> int:
    try:
        initialize(src, dest)
    except (StorageError, OSError) as exc:
        print(f"ovserve storage-initializer: error: {exc}", file=sys.stderr)
        return 1
    count = sum(1 for p in dest.rglob("*") if p.is_file())
    print(f"ovserve storage-initializer: {src} -> {dest} ({count} files)")
    return 0
